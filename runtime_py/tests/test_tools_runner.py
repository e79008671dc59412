"""Tests of the uploaded ``kcoral run`` runner (``kcoral_runtime/tools/runner.py``).

The sources are executed exactly like the worker does with an uploaded module: compiled
from text and ``exec``'d in a fresh dict namespace (no ``__name__``, ``__file__`` or
package). The runner works in the current directory, so each test runs in its own empty
workspace.
"""

import ast
import io
import json
import os
import signal
import stat
import sys
import tarfile
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parents[1] / "kcoral_runtime" / "tools"
SOURCES = ["runner", "python", "shell", "compute_sanitizer", "ncu", "run_iket"]
REAL_PYTHON = os.path.realpath(sys.executable)


def load(name):
    """Execute one uploaded source like the worker does; return its namespace."""
    source = (TOOLS / f"{name}.py").read_text(encoding="utf-8")
    code = compile(source, f"<uploaded:{name}>", "exec")
    namespace = {}
    exec(code, namespace)
    return namespace


def make_tar(*members):
    """Build a tar from (TarInfo, bytes-or-None) pairs."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            if data is None:
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def file_member(name, data, mode=0o600):
    info = tarfile.TarInfo(name)
    info.mode = mode
    return info, data


@pytest.fixture
def workspace(tmp_path, monkeypatch):
    """An empty request workspace as the current directory, and an isolated interpreter.

    ``sys.executable`` points at a symlink in a private directory, because the runner
    puts that directory first on PATH; installed tools cannot shadow the test's fakes.
    """
    directory = tmp_path / "workspace"
    directory.mkdir()
    python_dir = tmp_path / "python-bin"
    python_dir.mkdir()
    (python_dir / "python3").symlink_to(REAL_PYTHON)
    monkeypatch.setattr(sys, "executable", str(python_dir / "python3"))
    monkeypatch.chdir(directory)
    return directory


def run_python(archive, code, overrides=None, fetch=()):
    runner, python = load("runner"), load("python")
    return runner["run"](archive, python["run"], ["-c", code], overrides or {}, list(fetch))


# --- the sources themselves -----------------------------------------------------------


@pytest.mark.parametrize("name", SOURCES)
def test_source_is_self_contained(name):
    tree = ast.parse((TOOLS / f"{name}.py").read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            assert node.level == 0, "relative imports cannot work in an exec'd namespace"
            modules = [node.module]
        elif isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        else:
            modules = []
        for module in modules:
            assert module.split(".")[0] in sys.stdlib_module_names, module
        assert not isinstance(node, ast.ClassDef)
        if isinstance(node, ast.Name):
            assert node.id not in ("__file__", "__name__", "__package__", "__spec__")
    namespace = load(name)
    assert callable(namespace["run"])
    assert set(namespace) - {"__builtins__"}, "the source defines names"


# --- path rules -----------------------------------------------------------------------


def test_relative_parts_accepts_and_rejects():
    parts = load("runner")["relative_parts"]
    assert parts("a/b.txt") == ["a", "b.txt"]
    assert parts("./a//b/") == ["a", "b"]
    assert parts(".hidden") == [".hidden"]
    for bad in ["", ".", "./", "/abs", "//abs", "..", "a/../b", "a\\b", "a\x00b", None, 3]:
        with pytest.raises(ValueError, match="expected a relative file path: "):
            parts(bad)
    with pytest.raises(ValueError) as error:
        parts("../x")
    assert str(error.value) == "expected a relative file path: '../x'"


# --- unpacking ------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["../escape", "/escape", "a/../../escape", "a\\b", "."])
def test_unpack_rejects_unsafe_names(tmp_path, name):
    target = tmp_path / "inputs"
    target.mkdir()
    archive = make_tar(file_member(name, b"x"))
    with pytest.raises(ValueError, match="expected a relative file path"):
        load("runner")["unpack_inputs"](archive, str(target))
    assert not (tmp_path / "escape").exists()
    assert not Path("/escape").exists()
    assert list(target.iterdir()) == []


@pytest.mark.parametrize(
    "kind", [tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.DIRTYPE, tarfile.FIFOTYPE]
)
def test_unpack_rejects_non_regular_members(tmp_path, kind):
    target = tmp_path / "inputs"
    target.mkdir()
    info = tarfile.TarInfo("link")
    info.type = kind
    info.linkname = "/etc/passwd"
    with pytest.raises(ValueError, match="input is not a regular file: 'link'"):
        load("runner")["unpack_inputs"](make_tar((info, None)), str(target))
    assert list(target.iterdir()) == []


def test_unpack_layout_modes_and_exclusive_create(tmp_path):
    target = tmp_path / "inputs"
    target.mkdir()
    archive = make_tar(
        file_member("experiment/run.sh", b"#!/bin/sh\n", 0o755),
        file_member("experiment/data/input.json", b"{}", 0o644),
        file_member("tool", b"\x00\xff", 0o100),
        file_member("x" * 120 + "/long-name.txt", b"long"),
    )
    load("runner")["unpack_inputs"](archive, str(target))
    assert (target / "experiment/run.sh").read_bytes() == b"#!/bin/sh\n"
    assert stat.S_IMODE((target / "experiment/run.sh").stat().st_mode) == 0o700
    assert (target / "experiment/data/input.json").read_bytes() == b"{}"
    assert stat.S_IMODE((target / "experiment/data/input.json").stat().st_mode) == 0o600
    assert stat.S_IMODE((target / "tool").stat().st_mode) == 0o700
    assert (target / ("x" * 120) / "long-name.txt").read_bytes() == b"long"
    duplicate = make_tar(file_member("tool", b"again"))
    with pytest.raises(FileExistsError):
        load("runner")["unpack_inputs"](duplicate, str(target))
    assert (target / "tool").read_bytes() == b"\x00\xff"


def test_unpack_empty_archives(tmp_path):
    target = tmp_path / "inputs"
    target.mkdir()
    unpack = load("runner")["unpack_inputs"]
    unpack(b"", str(target))
    unpack(make_tar(), str(target))
    unpack(bytes(10240), str(target))
    assert list(target.iterdir()) == []


# --- environment ----------------------------------------------------------------------


def test_environment_composition_and_path_order(workspace, monkeypatch):
    compose = load("runner")["compose_environment"]
    python_dir = os.path.dirname(sys.executable)
    monkeypatch.setenv("PATH", "/worker/bin")
    monkeypatch.setenv("WORKER_ONLY", "worker")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    monkeypatch.setenv("KCORAL_DIR", "/stale")
    env = compose({"PATH": "/custom:/more", "MODE": "debug", "WORKER_ONLY": "", "E": ""}, "/w")
    assert env["PATH"] == f"{python_dir}:/custom:/more"
    assert env["MODE"] == "debug" and env["WORKER_ONLY"] == "" and env["E"] == ""
    assert env["CUDA_VISIBLE_DEVICES"] == "3"
    assert env["KCORAL_DIR"] == "/w"
    assert compose({}, "/w")["PATH"] == f"{python_dir}:/worker/bin"
    assert compose({}, "/w")["WORKER_ONLY"] == "worker"
    assert os.environ["PATH"] == "/worker/bin", "the worker's own environment is untouched"
    monkeypatch.delenv("PATH")
    assert compose({}, "/w")["PATH"] == python_dir


def test_an_overridden_pythonpath_keeps_the_worker_entries_after_the_client_ones(
    workspace, monkeypatch
):
    compose = load("runner")["compose_environment"]
    monkeypatch.setenv("PYTHONPATH", "/runtime:/ro:/runtime/kcoral_runtime/compat")
    assert compose({}, "/w")["PYTHONPATH"] == "/runtime:/ro:/runtime/kcoral_runtime/compat"
    env = compose({"PYTHONPATH": "/mine:/ro"}, "/w")
    assert env["PYTHONPATH"] == "/mine:/ro:/runtime:/runtime/kcoral_runtime/compat"
    # Empty entries of the client's value (the working directory) are kept where they stand.
    assert compose({"PYTHONPATH": ":/mine"}, "/w")["PYTHONPATH"] == (
        ":/mine:/runtime:/ro:/runtime/kcoral_runtime/compat"
    )
    assert compose({"PYTHONPATH": ""}, "/w")["PYTHONPATH"] == (
        "/runtime:/ro:/runtime/kcoral_runtime/compat"
    )
    assert os.environ["PYTHONPATH"] == "/runtime:/ro:/runtime/kcoral_runtime/compat"
    # A worker without PYTHONPATH (an upstream worker with kcoral installed): the client's value.
    monkeypatch.delenv("PYTHONPATH")
    assert compose({"PYTHONPATH": "/mine"}, "/w")["PYTHONPATH"] == "/mine"
    assert "PYTHONPATH" not in compose({}, "/w")


@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"CUDA_VISIBLE_DEVICES": "0"}, "CUDA_VISIBLE_DEVICES is managed by the remote worker"),
        ({"KCORAL_DIR": "/tmp"}, "KCORAL_DIR is managed by the remote worker"),
        ({"BAD-NAME": "x"}, "environment variable names must be identifiers"),
        ({"1X": "x"}, "environment variable names must be identifiers"),
        ({"": "x"}, "environment variable names must be identifiers"),
        ({"X": "a\x00b"}, "environment variable X contains NUL"),
        ({"X": 1}, "environment variable X must be a string"),
        (["X=1"], "environment overrides must be an object"),
    ],
)
def test_environment_overrides_are_checked_on_the_worker(workspace, overrides, message):
    with pytest.raises(ValueError) as error:
        run_python(b"", "pass", overrides)
    assert str(error.value) == message
    assert not (workspace / "inputs").exists(), "nothing runs after a refused override"


def test_subprocess_environment_cwd_stdin_and_process_group(workspace, monkeypatch):
    monkeypatch.setenv("PATH", "/worker/bin")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5")
    code = (
        "import json, os, sys\n"
        "json.dump({'env': dict(os.environ), 'cwd': os.getcwd(), 'stdin': sys.stdin.read(),\n"
        "           'stdin_stat': list(os.fstat(0)[:2]), 'pgrp': os.getpgrp()},\n"
        "          open('seen.json', 'w'))\n"
    )
    # The worker's own fd 0 holds data; the tool must not see it.
    read_end, write_end = os.pipe()
    os.write(write_end, b"worker stdin")
    os.close(write_end)
    saved = os.dup(0)
    os.dup2(read_end, 0)
    try:
        outcome = run_python(b"", code, {"PATH": "/custom", "MODE": "x"}, ["seen.json"])
    finally:
        os.dup2(saved, 0)
        os.close(saved)
        os.close(read_end)
    assert outcome == {"returncode": 0, "missing": []}
    seen = json.loads((workspace / "outputs/seen.json").read_text())
    inputs = str(workspace / "inputs")
    assert seen["cwd"] == inputs
    assert seen["env"]["KCORAL_DIR"] == inputs
    assert seen["env"]["PATH"] == f"{os.path.dirname(sys.executable)}:/custom"
    assert seen["env"]["MODE"] == "x" and seen["env"]["CUDA_VISIBLE_DEVICES"] == "5"
    assert seen["stdin"] == ""
    assert seen["stdin_stat"] == list(os.stat(os.devnull)[:2])
    assert seen["pgrp"] == os.getpgrp(), "the tool stays in the worker's process group"


# --- execution ------------------------------------------------------------------------


def test_python_exit_code_output_and_uploaded_files(workspace, capfd):
    check = (
        "import os, sys\nfrom pathlib import Path\n"
        "assert Path(os.environ['KCORAL_DIR']) == Path.cwd()\n"
        "print(Path('experiment/value.txt').read_text(), os.environ['MODE'], sys.argv[1:])\n"
        "print('remote stderr', file=sys.stderr)\nsys.exit(7)\n"
    )
    archive = make_tar(
        file_member("experiment/value.txt", b"uploaded"),
        file_member("experiment/check.py", check.encode()),
    )
    runner, python = load("runner"), load("python")
    outcome = runner["run"](
        archive, python["run"], ["experiment/check.py", "--url", "literal"], {"MODE": "debug"}, []
    )
    assert outcome == {"returncode": 7, "missing": []}
    captured = capfd.readouterr()
    assert captured.out == "uploaded debug ['--url', 'literal']\n"
    assert captured.err == "remote stderr\n"
    assert (workspace / "outputs").is_dir()


def test_sigterm_gives_negative_returncode(workspace):
    outcome = run_python(b"", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)")
    assert outcome == {"returncode": -signal.SIGTERM, "missing": []}
    assert outcome["returncode"] == -15


def test_shell_runs_uploaded_script_and_returns_files_on_failure(workspace):
    script = b"#!/bin/sh\nmkdir -p result/empty\nprintf '\\000\\377' > result/data.bin\nexit 9\n"
    archive = make_tar(file_member("experiment/setup.sh", script, 0o755))
    runner, shell = load("runner"), load("shell")
    outcome = runner["run"](archive, shell["run"], ["./experiment/setup.sh"], {}, ["result"])
    assert outcome == {"returncode": 9, "missing": []}
    assert (workspace / "outputs/result/data.bin").read_bytes() == b"\x00\xff"
    assert (workspace / "outputs/result/empty").is_dir()
    assert sorted(p.name for p in (workspace / "outputs").iterdir()) == ["result"]


def test_shell_bare_name_uses_path_and_passes_arguments(workspace, capfd):
    runner, shell = load("runner"), load("shell")
    command = ["sh", "-c", 'printf "%s|" "$@"', "sh", "a b", ""]
    outcome = runner["run"](b"", shell["run"], command, {}, [])
    assert outcome["returncode"] == 0
    assert capfd.readouterr().out == "a b||"


def test_worker_python_directory_is_searched_first(workspace, tmp_path, capfd):
    custom = tmp_path / "custom-bin"
    custom.mkdir()
    for directory, label in [(custom, "custom"), (Path(sys.executable).parent, "python-dir")]:
        program = directory / "kcoral-probe"
        program.write_text(f"#!/bin/sh\necho {label}\n")
        program.chmod(0o755)
    runner, shell = load("runner"), load("shell")
    outcome = runner["run"](b"", shell["run"], ["kcoral-probe"], {"PATH": str(custom)}, [])
    assert outcome["returncode"] == 0
    assert capfd.readouterr().out == "python-dir\n"


@pytest.mark.parametrize("command", ["no-such-kcoral-executable", "./script.sh", "./missing"])
def test_missing_or_non_executable_program(workspace, command):
    archive = make_tar(file_member("script.sh", b"#!/bin/sh\necho no\n", 0o644))
    runner, shell = load("runner"), load("shell")
    with pytest.raises(RuntimeError) as error:
        runner["run"](archive, shell["run"], [command], {}, [])
    assert str(error.value) == f"{command} is not installed in the remote server environment"


def test_directory_is_not_an_executable(workspace):
    archive = make_tar(file_member("tools/readme", b""))
    runner, shell = load("runner"), load("shell")
    with pytest.raises(RuntimeError, match="tools is not installed"):
        runner["run"](archive, shell["run"], ["./tools"], {}, [])


def test_workspace_must_be_fresh(workspace):
    (workspace / "inputs").mkdir()
    with pytest.raises(FileExistsError):
        run_python(b"", "pass")


# --- fetch ----------------------------------------------------------------------------


def test_fetch_files_directories_and_missing(workspace):
    code = (
        "import os\n"
        "os.makedirs('results/empty/deeper')\n"
        "os.makedirs('results/sub')\n"
        "open('results/sub/blob.bin', 'wb').write(bytes(range(256)))\n"
        "open('results/.hidden', 'w').write('h')\n"
        "os.makedirs('logs')\n"
        "open('logs/run.log', 'w').write('log')\n"
        "open('logs/other.log', 'w').write('not selected')\n"
        "open('top.txt', 'w').write('top')\n"
    )
    outcome = run_python(b"", code, fetch=["results", "logs/run.log", "top.txt", "nope", "a/b"])
    assert outcome == {"returncode": 0, "missing": ["nope", "a/b"]}
    out = workspace / "outputs"
    assert (out / "results/sub/blob.bin").read_bytes() == bytes(range(256))
    assert (out / "results/.hidden").read_text() == "h"
    assert (out / "results/empty/deeper").is_dir()
    assert (out / "logs/run.log").read_text() == "log"
    assert not (out / "logs/other.log").exists()
    assert (out / "top.txt").read_text() == "top"


def test_fetch_runs_after_failure_and_keeps_tool_missing(workspace):
    outcome = run_python(b"", "open('r.txt', 'w').write('r'); raise SystemExit(4)", fetch=["r.txt"])
    assert outcome == {"returncode": 4, "missing": []}
    assert (workspace / "outputs/r.txt").read_text() == "r"


@pytest.mark.parametrize("fetch", ["link", "linkdir/file.txt", "real/inner-link"])
def test_fetch_refuses_symlinks_at_any_component(workspace, fetch):
    code = (
        "import os\n"
        "os.symlink('/etc/passwd', 'link')\n"
        "os.makedirs('real')\n"
        "open('real/file.txt', 'w').write('x')\n"
        "os.symlink('real', 'linkdir')\n"
        "os.symlink('file.txt', 'real/inner-link')\n"
    )
    with pytest.raises(ValueError, match="artifact is a symlink: "):
        run_python(b"", code, fetch=[fetch])


def test_fetch_refuses_symlinks_and_special_files_inside_directories(workspace):
    code = "import os\nos.makedirs('d')\nos.symlink('/etc/passwd', 'd/link')\n"
    with pytest.raises(ValueError, match="artifact is not a regular file or directory: .*link"):
        run_python(b"", code, fetch=["d"])


def test_fetch_refuses_fifo(workspace):
    code = "import os\nos.makedirs('d')\nos.mkfifo('d/pipe')\n"
    with pytest.raises(ValueError, match="artifact is not a regular file or directory: .*pipe"):
        run_python(b"", code, fetch=["d"])


@pytest.mark.parametrize("fetch", ["../x", "/etc/passwd", "a\\b", ""])
def test_fetch_paths_are_checked_before_running(workspace, fetch):
    with pytest.raises(ValueError, match="expected a relative file path"):
        run_python(b"", "open('ran', 'w')", fetch=[fetch])
    assert not (workspace / "inputs").exists()


@pytest.mark.parametrize(
    "arguments,fetch",
    [("-c", []), (["-c", 1], []), (["-c", "pass"], "x"), (["-c", "pass"], [None])],
)
def test_argument_types_are_checked(workspace, arguments, fetch):
    runner, python = load("runner"), load("python")
    with pytest.raises(ValueError, match="must be a list of strings"):
        runner["run"](b"", python["run"], arguments, {}, fetch)
