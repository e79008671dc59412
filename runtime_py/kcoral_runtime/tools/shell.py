"""``kcoral run shell``: execute the forwarded command directly, without inserting a shell.

Uploaded as module source and executed with ``exec`` in a fresh namespace; keep it
self-contained (standard library only). The first argument is the program: a bare name is
searched on ``PATH``, a relative path with ``/`` is resolved against the working directory.
"""


def run(arguments, env, reports, execute):
    """Run ``ARGUMENTS[0] ARGUMENTS[1:]...`` and return its outcome."""
    if not arguments:
        raise ValueError("an executable is required after '--'")
    return {"returncode": execute(list(arguments)), "missing": []}
