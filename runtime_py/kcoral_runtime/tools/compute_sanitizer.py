"""``kcoral run compute-sanitizer``: run NVIDIA Compute Sanitizer with the forwarded arguments.

Uploaded as module source and executed with ``exec`` in a fresh namespace; keep it
self-contained (standard library only). Sanitizer options and the application are
forwarded unchanged; a ``--log-file`` is returned through ``--fetch``.
"""


def run(arguments, env, reports, execute):
    """Run ``compute-sanitizer ARGUMENTS...`` and return its outcome."""
    return {"returncode": execute(["compute-sanitizer", *arguments]), "missing": []}
