"""``kcoral run ncu``: capture an Nsight Compute report at ``outputs/capture.ncu-rep``.

Uploaded as module source and executed with ``exec`` in a fresh namespace; keep it
self-contained (standard library only). The arguments are ``NCU_OPTIONS... -- APP...``;
the client rejects options that conflict with the managed export path and mode.
"""

import os
import stat

REPORT = "capture.ncu-rep"


def run(arguments, env, reports, execute):
    """Run ``ncu --config-file 0 --export REPORTS/capture.ncu-rep OPTIONS... APP...``.

    The second ``--`` is dropped. ``NCU_PROFILE`` defaults to ``1`` unless the worker
    environment or an override sets it. A missing report is reported as missing.
    """
    if "--" not in arguments:
        raise ValueError("separate profiler options from the application with another '--'")
    boundary = arguments.index("--")
    if boundary == len(arguments) - 1:
        raise ValueError("expected profiler options followed by '-- application [args]'")
    env.setdefault("NCU_PROFILE", "1")
    report = os.path.join(reports, REPORT)
    command = ["ncu", "--config-file", "0", "--export", report]
    command += arguments[:boundary] + arguments[boundary + 1 :]
    code = execute(command)
    try:
        present = stat.S_ISREG(os.lstat(report).st_mode)
    except OSError:
        present = False
    return {"returncode": code, "missing": [] if present else [REPORT]}
