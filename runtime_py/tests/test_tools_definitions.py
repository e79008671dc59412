"""Tests of the uploaded tool definitions (python, shell, compute-sanitizer, ncu, run-iket).

Each source is executed like the worker does with an uploaded module (compiled from text,
``exec``'d in a fresh dict namespace) and run through the uploaded runner. The native
tools are fakes placed on PATH with ``-e PATH=...``; they record their argv and
environment into a JSON file and write the reports a real tool would write.
"""

import io
import json
import os
import shutil
import sys
import tarfile
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parents[1] / "kcoral_runtime" / "tools"
REAL_PYTHON = os.path.realpath(sys.executable)

FAKE_TOOL = """#!{python}
import json, os, sys
args = sys.argv[1:]
name = os.path.basename(sys.argv[0])
record = {{"name": name, "argv0": sys.argv[0], "args": args, "cwd": os.getcwd(),
          "ncu_profile": os.environ.get("NCU_PROFILE")}}
mode = os.environ.get("FAKE_MODE", "report")
if name == "ncu":
    export = args[args.index("--export") + 1]
    record["export_parent_exists"] = os.path.isdir(os.path.dirname(export))
    if mode == "report":
        open(export, "wb").write(b"report")
elif name == "run-iket":
    out = args[args.index("--output-dir") + 1]
    record["output_dir_existed"] = os.path.exists(out)
    if mode == "report":
        os.makedirs(os.path.join(out, "raw"))
        open(os.path.join(out, "trace.json"), "w").write("{{}}")
        open(os.path.join(out, "raw", "events.bin"), "wb").write(b"\\x00\\x01")
    elif mode == "empty-dir":
        os.makedirs(os.path.join(out, "nothing"))
elif name == "compute-sanitizer":
    if "--log-file" in args and mode == "report":
        open(args[args.index("--log-file") + 1], "w").write("========= ERROR SUMMARY: 0 errors")
with open(os.environ["FAKE_RECORD"], "w") as handle:
    json.dump(record, handle)
sys.exit(int(os.environ.get("FAKE_EXIT", "3")))
"""


def load(name):
    """Execute one uploaded source like the worker does; return its namespace."""
    source = (TOOLS / f"{name}.py").read_text(encoding="utf-8")
    namespace = {}
    exec(compile(source, f"<uploaded:{name}>", "exec"), namespace)
    return namespace


def empty_tar():
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w"):
        pass
    return buffer.getvalue()


@pytest.fixture
def remote(tmp_path, monkeypatch):
    """Workspace as cwd, an isolated interpreter directory, and fake tools on a PATH dir."""
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    python_dir = tmp_path / "python-bin"
    python_dir.mkdir()
    (python_dir / "python3").symlink_to(REAL_PYTHON)
    monkeypatch.setattr(sys, "executable", str(python_dir / "python3"))
    fakes = tmp_path / "fakes"
    fakes.mkdir()
    for name in ["ncu", "run-iket", "compute-sanitizer"]:
        (fakes / name).write_text(FAKE_TOOL.format(python=REAL_PYTHON))
        (fakes / name).chmod(0o755)
    monkeypatch.delenv("NCU_PROFILE", raising=False)
    monkeypatch.chdir(workspace)
    record = tmp_path / "record.json"

    def call(module, arguments, fetch=(), **overrides):
        env = {"PATH": str(fakes), "FAKE_RECORD": str(record), **overrides}
        runner, definition = load("runner"), load(module)
        outcome = runner["run"](empty_tar(), definition["run"], arguments, env, list(fetch))
        seen = json.loads(record.read_text()) if record.exists() else None
        return outcome, seen

    call.workspace = workspace
    call.fakes = fakes
    return call


APPLICATION = ["python", "check.py", "a b"]


def test_python_uses_the_worker_interpreter(remote, capfd):
    outcome, _ = remote("python", ["-c", "import sys; print(sys.executable, sys.argv[1:])", "x"])
    assert outcome == {"returncode": 0, "missing": []}
    assert capfd.readouterr().out == f"{sys.executable} ['x']\n"


def test_shell_requires_a_command(remote):
    with pytest.raises(ValueError, match="an executable is required"):
        remote("shell", [])


def test_compute_sanitizer_forwards_arguments(remote):
    outcome, seen = remote("compute_sanitizer", ["--tool", "racecheck", *APPLICATION])
    assert outcome == {"returncode": 3, "missing": []}
    assert seen["name"] == "compute-sanitizer"
    assert seen["argv0"] == str(remote.fakes / "compute-sanitizer")
    assert seen["args"] == ["--tool", "racecheck", *APPLICATION]
    assert seen["cwd"] == str(remote.workspace / "inputs")
    assert (remote.workspace / "outputs").is_dir()


def test_compute_sanitizer_log_file_is_fetched(remote):
    arguments = ["--log-file", "sanitizer.log", *APPLICATION]
    outcome, _ = remote("compute_sanitizer", arguments, ["sanitizer.log"], FAKE_EXIT="0")
    assert outcome == {"returncode": 0, "missing": []}
    log = remote.workspace / "outputs/sanitizer.log"
    assert log.read_text() == "========= ERROR SUMMARY: 0 errors"


def test_compute_sanitizer_missing_log_is_reported(remote):
    arguments = ["--log-file", "sanitizer.log", *APPLICATION]
    outcome, _ = remote("compute_sanitizer", arguments, ["sanitizer.log"], FAKE_MODE="none")
    assert outcome == {"returncode": 3, "missing": ["sanitizer.log"]}


def test_ncu_command_line_environment_and_report(remote):
    outcome, seen = remote("ncu", ["--set", "basic", "--", *APPLICATION])
    report = remote.workspace / "outputs" / "capture.ncu-rep"
    assert outcome == {"returncode": 3, "missing": []}
    assert seen["args"] == ["--config-file", "0", "--export", str(report), "--set", "basic"] + (
        APPLICATION
    )
    assert seen["ncu_profile"] == "1"
    assert seen["export_parent_exists"] is True
    assert report.read_bytes() == b"report"


def test_ncu_without_native_options(remote):
    outcome, seen = remote("ncu", ["--", *APPLICATION], FAKE_EXIT="0")
    assert outcome == {"returncode": 0, "missing": []}
    assert seen["args"][4:] == APPLICATION


def test_ncu_profile_override_and_worker_value_win(remote, monkeypatch):
    _, seen = remote("ncu", ["--", *APPLICATION], NCU_PROFILE="0")
    assert seen["ncu_profile"] == "0"
    monkeypatch.setenv("NCU_PROFILE", "worker")
    for path in (remote.workspace / "inputs", remote.workspace / "outputs"):
        shutil.rmtree(path)  # a fresh workspace for the second request
    _, seen = remote("ncu", ["--", *APPLICATION])
    assert seen["ncu_profile"] == "worker"


def test_ncu_missing_report(remote):
    outcome, _ = remote("ncu", ["--", *APPLICATION], FAKE_MODE="none", FAKE_EXIT="0")
    assert outcome == {"returncode": 0, "missing": ["capture.ncu-rep"]}


SEPARATE = "separate profiler options from the application with another '--'"
EXPECTED = "expected profiler options followed by '-- application [args]'"


@pytest.mark.parametrize(
    "arguments,message", [(["--set", "basic"], SEPARATE), (["--set", "basic", "--"], EXPECTED)]
)
def test_ncu_needs_an_application(remote, arguments, message):
    with pytest.raises(ValueError) as error:
        remote("ncu", arguments)
    assert str(error.value) == message


def test_run_iket_command_line_and_outputs(remote):
    arguments = ["profile", "--postprocess", "json", "--", *APPLICATION]
    outcome, seen = remote("run_iket", arguments)
    outputs = remote.workspace / "outputs"
    assert outcome == {"returncode": 3, "missing": []}
    assert seen["args"] == ["--output-dir", str(outputs), *arguments]
    assert seen["args"][2:7] == ["profile", "--postprocess", "json", "--", "python"]
    assert seen["output_dir_existed"] is False
    assert (outputs / "trace.json").read_text() == "{}"
    assert (outputs / "raw/events.bin").read_bytes() == b"\x00\x01"


@pytest.mark.parametrize("mode", ["none", "empty-dir"])
def test_run_iket_without_files_is_missing_output(remote, mode):
    outcome, _ = remote("run_iket", ["profile", "--", *APPLICATION], FAKE_MODE=mode)
    assert outcome == {"returncode": 3, "missing": ["run-iket output"]}
    assert (remote.workspace / "outputs").is_dir(), "the runner still creates outputs/"


@pytest.mark.parametrize(
    "arguments,message",
    [(["profile"], SEPARATE), (["profile", "--"], EXPECTED), (["--", "python"], EXPECTED)],
)
def test_run_iket_needs_profile_and_an_application(remote, arguments, message):
    with pytest.raises(ValueError) as error:
        remote("run_iket", arguments)
    assert str(error.value) == message


def test_profilers_not_installed(remote):
    for name in ["ncu", "run-iket", "compute-sanitizer"]:
        (remote.fakes / name).unlink()
    with pytest.raises(RuntimeError, match="^ncu is not installed in the remote server"):
        remote("ncu", ["--", *APPLICATION])
