"""``kcoral run run-iket``: collect IKET traces into the managed ``outputs/`` directory.

Uploaded as module source and executed with ``exec`` in a fresh namespace; keep it
self-contained (standard library only). The arguments are ``profile [OPTIONS...] -- APP...``;
the client rejects options that conflict with the managed output and working directories.
"""

import os
import stat


def run(arguments, env, reports, execute):
    """Run ``run-iket --output-dir REPORTS ARGUMENTS...`` (second ``--`` kept).

    ``REPORTS`` is not created beforehand: run-iket wants a new directory. When no regular
    file exists anywhere under it afterwards, ``run-iket output`` is reported missing.
    """
    if "--" not in arguments:
        raise ValueError("separate profiler options from the application with another '--'")
    boundary = arguments.index("--")
    if boundary == len(arguments) - 1 or "profile" not in arguments[:boundary]:
        raise ValueError("expected profiler options followed by '-- application [args]'")
    code = execute(["run-iket", "--output-dir", reports, *arguments], create_reports=False)
    return {"returncode": code, "missing": [] if _has_file(reports) else ["run-iket output"]}


def _has_file(directory):
    # Walks without following symlinks; only regular files count as output.
    for root, _dirs, files in os.walk(directory):
        for name in files:
            if stat.S_ISREG(os.lstat(os.path.join(root, name)).st_mode):
                return True
    return False
