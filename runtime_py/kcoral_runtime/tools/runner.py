"""KCoral tool runner, uploaded as module source by ``kcoral run`` in every request.

The worker executes this text with ``exec`` in a fresh namespace, on a KCoral for Deno
server or on an upstream KCoral server, with the current directory set to the request's
fresh workspace. Keep it self-contained: standard library only, no imports from
``kcoral_runtime``, no use of ``__name__``, ``__file__`` or a package, no classes.

Entry point: ``run(archive, tool_run, arguments, overrides, fetch)``.

Workspace layout (relative to the current directory):

* ``inputs/``  -- the remote working directory: the unpacked ``--send`` archive; the tool
  runs here, ``KCORAL_DIR`` points here, and ``--fetch`` paths are relative to it.
* ``outputs/`` -- the reports directory, returned as the ``artifacts`` folder.
"""

import io
import os
import re
import shutil
import stat
import subprocess
import sys
import tarfile

# Names only the worker may set; the client refuses them as well.
MANAGED_NAMES = ("CUDA_VISIBLE_DEVICES", "KCORAL_DIR")

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def relative_parts(name):
    """Validate a relative POSIX path and return its components.

    Rejects non-strings, the empty string, absolute paths, backslashes, NUL, any ``..``
    component, and names without a component (``.``) with
    ``ValueError("expected a relative file path: 'NAME'")``.
    """
    if isinstance(name, str) and name and not name.startswith("/"):
        parts = [part for part in name.split("/") if part not in ("", ".")]
        if parts and ".." not in parts and "\\" not in name and "\x00" not in name:
            return parts
    raise ValueError(f"expected a relative file path: {name!r}")


def unpack_inputs(archive, directory):
    """Unpack the ``--send`` tar archive into the existing ``directory``.

    Only regular-file members with relative names are accepted. Files are created
    exclusively (an existing path is an error) with mode 0700 when the member had any
    execute bit, else 0600. Parent directories are created as needed.
    """
    data = bytes(archive)
    if not data:
        return
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        for member in tar:
            parts = relative_parts(member.name)
            if not member.isfile():
                raise ValueError(f"input is not a regular file: {member.name!r}")
            destination = os.path.join(directory, *parts)
            os.makedirs(os.path.dirname(destination), exist_ok=True)
            mode = 0o700 if member.mode & 0o111 else 0o600
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW
            with os.fdopen(os.open(destination, flags, 0o600), "wb") as target:
                source = tar.extractfile(member)
                shutil.copyfileobj(source, target)
                os.fchmod(target.fileno(), mode)


def compose_environment(overrides, directory):
    """Return the subprocess environment.

    Worker environment, then the client's overrides, then ``KCORAL_DIR=directory``; finally
    the directory of the worker's Python interpreter is put first on ``PATH`` (after the
    overrides, so ``-e PATH=...`` cannot displace it), and an overridden ``PYTHONPATH`` keeps
    the worker's own entries after the client's (the worker's modules, such as ``kcoral``,
    stay importable). Overrides must map identifier names to strings without NUL and must
    not name a managed variable.
    """
    if not isinstance(overrides, dict):
        raise ValueError("environment overrides must be an object")
    for name, value in overrides.items():
        if not isinstance(name, str) or not _IDENTIFIER.match(name):
            raise ValueError("environment variable names must be identifiers")
        if name in MANAGED_NAMES:
            raise ValueError(f"{name} is managed by the remote worker")
        if not isinstance(value, str):
            raise ValueError(f"environment variable {name} must be a string")
        if "\x00" in value:
            raise ValueError(f"environment variable {name} contains NUL")
    env = {**os.environ, **overrides, "KCORAL_DIR": directory}
    python_dir = os.path.dirname(os.path.abspath(sys.executable)) if sys.executable else ""
    if python_dir:
        search = env.get("PATH", "")
        env["PATH"] = python_dir + os.pathsep + search if search else python_dir
    worker_modules = os.environ.get("PYTHONPATH", "")
    client_modules = overrides.get("PYTHONPATH")
    if client_modules is not None and worker_modules:
        named = client_modules.split(os.pathsep) if client_modules else []
        added = [e for e in worker_modules.split(os.pathsep) if e and e not in named]
        env["PYTHONPATH"] = os.pathsep.join(named + added)
    return env


def resolve_executable(name, search_path, directory):
    """Return the absolute path of the program ``name`` as the subprocess will run it.

    A name containing ``/`` is used as is when absolute, else resolved against
    ``directory`` (the subprocess's working directory). A bare name is searched on
    ``search_path``; relative and empty entries also count from ``directory``. The result
    must exist, must not be a directory, and must be executable; otherwise
    ``RuntimeError("NAME is not installed in the remote server environment")``.
    """
    candidates = []
    if isinstance(name, str) and name and "\x00" not in name:
        if "/" in name:
            candidates.append(os.path.join(directory, name))
        else:
            for entry in search_path.split(os.pathsep):
                candidates.append(os.path.join(directory, entry, name))
    for candidate in candidates:
        if (
            os.path.exists(candidate)
            and not os.path.isdir(candidate)
            and os.access(candidate, os.X_OK)
        ):
            return os.path.abspath(candidate)
    raise RuntimeError(f"{name} is not installed in the remote server environment")


def collect_files(directory, reports, names):
    """Copy each ``--fetch`` path from ``directory`` to the same path under ``reports``.

    A symlink at any component of a selection is an error; a missing selection is
    returned in the list of missing names; a directory is copied recursively, including
    empty subdirectories; anything but regular files and directories is an error.
    """
    missing = []
    for name in names:
        parts = relative_parts(name)
        current = directory
        present = True
        for part in parts:
            current = os.path.join(current, part)
            try:
                info = os.lstat(current)
            except (FileNotFoundError, NotADirectoryError):
                present = False
                break
            if stat.S_ISLNK(info.st_mode):
                raise ValueError(f"artifact is a symlink: {current}")
        if present:
            _copy_entry(current, os.path.join(reports, *parts))
        else:
            missing.append(name)
    return missing


def _copy_entry(source, destination):
    mode = os.lstat(source).st_mode
    if stat.S_ISDIR(mode):
        os.makedirs(destination, exist_ok=True)
        for child in sorted(os.listdir(source)):
            _copy_entry(os.path.join(source, child), os.path.join(destination, child))
    elif stat.S_ISREG(mode):
        os.makedirs(os.path.dirname(destination), exist_ok=True)
        _copy_file(source, destination)
    else:
        raise ValueError(f"artifact is not a regular file or directory: {source}")


def _copy_file(source, destination):
    # O_NOFOLLOW: a path swapped for a symlink after the checks is refused, not followed.
    with os.fdopen(os.open(source, os.O_RDONLY | _NOFOLLOW), "rb") as reader:
        if not stat.S_ISREG(os.fstat(reader.fileno()).st_mode):
            raise ValueError(f"artifact is not a regular file or directory: {source}")
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _NOFOLLOW
        with os.fdopen(os.open(destination, flags, 0o600), "wb") as writer:
            shutil.copyfileobj(reader, writer)


def _string_list(value, what):
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ValueError(f"{what} must be a list of strings")
    return list(value)


def run(archive, tool_run, arguments, overrides, fetch):
    """Run one tool in the current workspace and return its outcome.

    ``archive`` is the ``--send`` tar (bytes), ``tool_run`` the tool definition's
    ``run(arguments, env, reports, execute)``, ``arguments`` the forwarded native
    arguments, ``overrides`` the ``-e`` variables, ``fetch`` the ``--fetch`` paths.
    Returns ``{"returncode": int, "missing": [str, ...]}``; a negative return code means
    the subprocess was killed by that signal.
    """
    arguments = _string_list(arguments, "arguments")
    fetch = _string_list(fetch, "fetch paths")
    for name in fetch:
        relative_parts(name)
    directory = os.path.abspath("inputs")
    reports = os.path.abspath("outputs")
    env = compose_environment(overrides, directory)
    os.mkdir(directory)
    unpack_inputs(archive, directory)

    def execute(command, create_reports=True):
        """Run ``command`` in ``inputs/`` and return its raw return code."""
        if create_reports:
            os.makedirs(reports, exist_ok=True)
        command = _string_list(command, "command")
        if not command:
            raise ValueError("a command is required")
        executable = resolve_executable(command[0], env.get("PATH", ""), directory)
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
        # stdin is closed; stdout and stderr are the worker's fds 1 and 2 (captured by the
        # server); no new session, so killing the worker's process group reaches the tool.
        completed = subprocess.run(
            [executable, *command[1:]], cwd=directory, env=env, stdin=subprocess.DEVNULL
        )
        return completed.returncode

    outcome = tool_run(arguments, env, reports, execute)
    returncode = outcome.get("returncode") if isinstance(outcome, dict) else None
    if not isinstance(returncode, int) or isinstance(returncode, bool):
        raise ValueError("the tool definition returned no integer returncode")
    missing = _string_list(outcome.get("missing", []), "missing artifacts")
    os.makedirs(reports, exist_ok=True)
    missing.extend(collect_files(directory, reports, fetch))
    return {"returncode": returncode, "missing": missing}
