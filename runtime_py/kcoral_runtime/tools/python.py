"""``kcoral run python``: run the forwarded arguments with the worker's own interpreter.

Uploaded as module source and executed with ``exec`` in a fresh namespace; keep it
self-contained (standard library only). The client validates the arguments.
"""

import sys


def run(arguments, env, reports, execute):
    """Run ``<worker python> ARGUMENTS...`` and return its outcome."""
    return {"returncode": execute([sys.executable, *arguments]), "missing": []}
