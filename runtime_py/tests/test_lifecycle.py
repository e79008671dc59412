"""Child lifecycle through a real zygote: retire, kill, crash, orphans, shutdown."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

LEFTOVER = "program left background processes running; they were terminated"


def wait_for_file(path: Path, timeout: float = 15.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return path.read_text().strip()
        time.sleep(0.01)
    raise AssertionError(f"{path} never appeared")


def assert_gone(pid: int, kc, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while kc.pid_alive(pid):  # a zombie would still answer; the zygote reaps it
        assert time.monotonic() < deadline, f"process {pid} is still alive"
        time.sleep(0.01)


def test_fresh_mode_retires_after_one_request(cpu_zygote, make_request, kc) -> None:
    handle = cpu_zygote.child(max_requests=1)
    start = cpu_zygote.mark()
    r = handle.run(make_request(kc.call("import os\ndef main():\n    return os.getpid()\n")))
    assert r.outcome["status"] == "COMPLETED" and r.retire == "request_limit"
    assert r.results["r"]["value"] == handle.pid
    exited = handle.wait_exited(start=start)
    assert exited == {"c": handle.c, "t": "exited", "code": 0, "signal": None, "orphans": False}
    assert_gone(handle.pid, kc)


def test_reuse_serves_until_the_limit(cpu_zygote, make_request, kc) -> None:
    handle = cpu_zygote.child(max_requests=3)
    program = kc.call("import os\ndef main():\n    return os.getpid()\n")
    retires = [handle.run(make_request(program)) for _ in range(3)]
    assert [r.retire for r in retires] == [None, None, "request_limit"]
    assert {r.results["r"]["value"] for r in retires} == {handle.pid}
    handle.wait_exited()


def test_leftover_background_process_fails_and_retires(cpu_zygote, make_request, kc) -> None:
    handle = cpu_zygote.child(max_requests=0)
    source = "import subprocess\ndef main():\n    return subprocess.Popen(['sleep', '60']).pid\n"
    start = cpu_zygote.mark()
    r = handle.run(make_request(kc.call(source)))
    sleeper = r.results["r"]["value"]
    assert r.outcome["status"] == "FAILED" and r.retire == "leftover_processes"
    error = r.outcome["error"]
    assert (error["kind"], error["message"], error["traceback"]) == ("runtime", LEFTOVER, "")
    assert (error["instruction_index"], error["instruction_op"], error["instruction_id"]) == (3, "return", None)
    exited = handle.wait_exited(start=start)
    assert (exited["code"], exited["orphans"]) == (0, False)
    assert_gone(sleeper, kc)


CLONE_PARENT_ESCAPE = (
    "import ctypes, os, time\n"
    "def main():\n"
    "    libc = ctypes.CDLL(None, use_errno=True)\n"
    "    # clone(CLONE_PARENT | SIGCHLD) with no new stack: a fork whose parent is the zygote\n"
    "    pid = libc.syscall(ctypes.c_long(56), ctypes.c_ulong(0x8000 | 17), ctypes.c_ulong(0),\n"
    "                       ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))\n"
    "    if pid == 0:\n"
    "        time.sleep(60)\n"
    "        os._exit(0)\n"
    "    return [pid, ctypes.get_errno()]\n"
)


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the program calls x86-64's clone")
def test_clone_parent_cannot_escape_the_childs_tree(cpu_zygote, make_request, kc) -> None:
    handle = cpu_zygote.child(max_requests=0)
    before = _zygote_children(cpu_zygote.proc.pid)
    r = handle.run(make_request(kc.call(CLONE_PARENT_ESCAPE)))
    pid, err = (item["value"] for item in r.results["r"]["value"])
    escaped = _zygote_children(cpu_zygote.proc.pid) - before - {handle.pid}
    for stray in escaped:  # without the filter: the zygote's child, unseen by the leftover check
        os.kill(stray, signal.SIGKILL)
    assert (pid, err, escaped) == (-1, errno.EPERM, set())
    assert r.outcome["status"] == "COMPLETED" and r.retire is None
    handle.kill()


def _zygote_children(zygote_pid: int) -> set:
    return {int(p) for p in Path(f"/proc/{zygote_pid}/task/{zygote_pid}/children").read_text().split()}


POSIX_PROBE = (
    "import os, resource, signal\n"
    "def main():\n"
    "    mask = os.umask(0o022)\n"
    "    os.umask(mask)\n"
    "    return [mask, list(resource.getrlimit(resource.RLIMIT_NOFILE)),\n"
    "            list(signal.getitimer(signal.ITIMER_REAL)), signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL,\n"
    "            sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, []))]\n"
)
POSIX_CHANGE = (
    "import os, resource, signal\n"
    "def main():\n"
    "    os.umask(0o077)\n"
    "    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
    "    resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))\n"
    "    signal.signal(signal.SIGALRM, lambda *_: os.write(2, b'alarm from an earlier request'))\n"
    "    signal.setitimer(signal.ITIMER_REAL, 30.0)\n"
    "    signal.signal(signal.SIGUSR1, signal.SIG_IGN)\n"
    "    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR2])\n"
)


def _decoded(value):
    if isinstance(value, dict) and "type" in value:
        inner = value["value"]
        return [_decoded(v) for v in inner] if isinstance(inner, list) else inner
    return value


def _put_back(zygote: Any, make_request: Any, kc: Any, probe: str, change: str) -> Any:
    """What ``probe`` returns in a reused worker before and after a request running ``change``
    (kept, not retired): the same, and returned."""
    handle = zygote.child(max_requests=0)
    before = _decoded(handle.run(make_request(kc.call(probe))).results["r"])
    changed = handle.run(make_request(kc.call(change)))
    assert changed.outcome["status"] == "COMPLETED" and changed.retire is None
    after = handle.run(make_request(kc.call(probe)))
    assert _decoded(after.results["r"]) == before
    handle.kill()
    return before


def test_reused_worker_gets_back_posix_state_a_program_changed(cpu_zygote, make_request, kc) -> None:
    before = _put_back(cpu_zygote, make_request, kc, POSIX_PROBE, POSIX_CHANGE)
    assert before[2] == [0.0, 0.0] and before[3] is True


INTERPRETER_PROBE = (
    "import gc, sys, threading\n"
    "def main():\n"
    "    return [sys.gettrace() is None, sys.getprofile() is None, threading.gettrace() is None,\n"
    "            threading.getprofile() is None, len(gc.callbacks), gc.isenabled(),\n"
    "            list(gc.get_threshold()), sys.getswitchinterval(), sys.getrecursionlimit()]\n"
)
INTERPRETER_CHANGE = (
    "import gc, sys, threading\n"
    "def spy(*args):\n"
    "    return spy\n"
    "def main():\n"
    "    sys.settrace(spy)\n"
    "    sys.setprofile(spy)\n"
    "    threading.settrace(spy)\n"
    "    threading.setprofile(spy)\n"
    "    gc.callbacks.append(lambda phase, info: None)\n"
    "    gc.disable()\n"
    "    gc.set_threshold(1, 1, 1)\n"
    "    sys.setswitchinterval(0.5)\n"
    "    sys.setrecursionlimit(100000)\n"
)


def test_reused_worker_gets_back_interpreter_hooks_a_program_left(cpu_zygote, make_request, kc) -> None:
    """A trace or profile function left behind would run on every line of the next program."""
    before = _put_back(cpu_zygote, make_request, kc, INTERPRETER_PROBE, INTERPRETER_CHANGE)
    assert before[:4] == [True, True, True, True]


def test_a_signal_the_program_blocked_and_left_pending_is_dropped(cpu_zygote, make_request, kc) -> None:
    handle = cpu_zygote.child(max_requests=0)
    source = (
        "import os, signal\n"
        "def main():\n"
        "    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])\n"
        "    os.kill(os.getpid(), signal.SIGUSR1)\n"
        "    return sorted(int(s) for s in signal.sigpending())\n"
    )
    r = handle.run(make_request(kc.call(source)))
    assert r.outcome["status"] == "COMPLETED" and r.retire is None
    assert _decoded(r.results["r"]) == [signal.SIGUSR1]  # it was pending when the program ended
    after = handle.run(make_request(kc.call(POSIX_PROBE)))  # the worker lived through the restore
    assert after.outcome["status"] == "COMPLETED" and _decoded(after.results["r"])[4] == []
    handle.kill()


def test_a_lowered_hard_limit_retires_the_worker(cpu_zygote, make_request, kc) -> None:
    handle = cpu_zygote.child(max_requests=0)
    source = (
        "import resource\n"
        "def main():\n"
        "    soft, hard = resource.getrlimit(resource.RLIMIT_CORE)\n"
        "    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))\n"
        "    return hard\n"
    )
    r = handle.run(make_request(kc.call(source)))
    if r.results["r"]["value"] == 0:
        pytest.fail("RLIMIT_CORE's hard limit is already 0 here: pick another limit")
    assert r.outcome["status"] == "COMPLETED" and r.retire == "process_state"
    handle.wait_exited()


def test_finished_unwaited_subprocess_is_not_a_leftover(cpu_zygote, make_request, kc) -> None:
    handle = cpu_zygote.child(max_requests=0)
    source = "import subprocess, time\ndef main():\n    subprocess.Popen(['true'])\n    time.sleep(0.3)\n"
    r = handle.run(make_request(kc.call(source)))
    assert r.outcome["status"] == "COMPLETED" and r.retire is None
    handle.kill()


GRANDCHILD = (
    "import os, signal, sys, time\n"
    "os.setsid()\n"
    "if sys.argv[2] == 'stubborn':\n"
    "    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "open(sys.argv[1] + '.tmp', 'w').write(str(os.getpid()))\n"
    "os.rename(sys.argv[1] + '.tmp', sys.argv[1])\n"
    "time.sleep(60)\n"
)


def spawn_and_block(pidfile: Path, mode: str) -> str:
    return (
        "import subprocess, sys, time\n"
        "def main():\n"
        f"    subprocess.Popen([sys.executable, '-c', {GRANDCHILD!r}, {str(pidfile)!r}, {mode!r}])\n"
        "    time.sleep(60)\n"
    )


# A polite tree ends on SIGTERM: `exited` comes long before its grace (ten minutes) is over, within
# the harness's wait. A stubborn one ignores SIGTERM: it is killed once its grace is over.
@pytest.mark.parametrize("mode, grace", [("polite", 600.0), ("stubborn", 0.5)])
def test_kill_takes_the_whole_tree(cpu_zygote, make_request, kc, tmp_path, mode, grace) -> None:
    handle = cpu_zygote.child(max_requests=0)
    pidfile = tmp_path / "grandchild.pid"
    start = cpu_zygote.mark()
    handle.send({"t": "run", "req": make_request(kc.call(spawn_and_block(pidfile, mode)))})
    grandchild = int(wait_for_file(pidfile))
    began = time.monotonic()
    cpu_zygote.send({"t": "kill", "c": handle.c, "grace": grace})
    exited = handle.wait_exited(start=start)
    elapsed = time.monotonic() - began
    assert (exited["code"], exited["signal"]) == (None, signal.SIGTERM)
    assert not kc.pid_alive(grandchild)  # gone (and reaped) before `exited` was sent
    assert not kc.pid_alive(handle.pid)
    if mode == "stubborn":
        assert elapsed >= grace  # the grace is the protocol's: SIGKILL only after it
    frames = cpu_zygote.frames_of(handle.c, start)
    assert [f["t"] for f in frames] == ["exited"] and frames[0]["instr"] == 2


def test_exit_mid_run_reports_the_instruction_in_exited(cpu_zygote, make_request, kc) -> None:
    """The child marks each instruction in the page it shares with its zygote (no frame per
    instruction); ``exited`` carries the one it died in, and only one of its current request."""
    handle = cpu_zygote.child(max_requests=0)
    start = cpu_zygote.mark()
    r = handle.run(make_request(kc.call("def main():\n    return 1\n")))
    assert r.outcome["status"] == "COMPLETED"
    assert [f["t"] for f in r.frames] == ["outcome"]  # no frame per instruction
    start = cpu_zygote.mark()
    handle.send({"t": "run", "req": make_request(
        kc.call("import os\ndef main():\n    print('lost')\n    os._exit(7)\n"))})
    exited = handle.wait_exited(start=start)
    frames = cpu_zygote.frames_of(handle.c, start)
    assert [f["t"] for f in frames] == ["exited"]
    assert (exited["code"], exited["signal"], exited["orphans"]) == (7, None, False)
    assert exited["instr"] == 2  # upload 0, get_function 1, run 2


def test_exit_between_requests_names_no_instruction(cpu_zygote, make_request, kc) -> None:
    handle = cpu_zygote.child(max_requests=0)
    r = handle.run(make_request(kc.call("def main():\n    return 1\n")))
    assert r.outcome["status"] == "COMPLETED"
    start = cpu_zygote.mark()
    handle.send({"t": "run", "req": {"program": "not json"}})  # fails before any instruction
    exited = handle.wait_exited(start=start)
    assert "instr" not in exited, exited


def test_orphans_of_a_dead_child_are_killed_before_exited(cpu_zygote, make_request, kc, tmp_path) -> None:
    handle = cpu_zygote.child(max_requests=0)
    pidfile = tmp_path / "daemon.pid"
    source = (
        "import os, subprocess, sys, time\n"
        "def main():\n"
        f"    subprocess.Popen([sys.executable, '-c', {GRANDCHILD!r}, {str(pidfile)!r}, 'stubborn'])\n"
        f"    while not os.path.exists({str(pidfile)!r}):\n"
        "        time.sleep(0.01)\n"
        "    os._exit(0)\n"
    )
    start = cpu_zygote.mark()
    handle.send({"t": "run", "req": make_request(kc.call(source))})
    exited = handle.wait_exited(start=start)
    assert (exited["code"], exited["signal"], exited["orphans"]) == (0, None, True)
    assert not kc.pid_alive(int(pidfile.read_text()))


def test_zygote_refuses_duplicate_ids_and_ignores_unknown_kills(cpu_zygote, make_request, kc) -> None:
    handle = cpu_zygote.child(max_requests=0)
    start = cpu_zygote.mark()
    cpu_zygote.send({"t": "fork", "c": handle.c, "env": {}, "unset": []})
    cpu_zygote.send({"t": "kill", "c": 10**9, "grace": 0})
    cpu_zygote.send({"t": "run", "c": 10**9, "req": {}})
    r = handle.run(make_request(kc.call("def main():\n    return 1\n")))
    assert r.outcome["status"] == "COMPLETED"
    assert [f["t"] for f in cpu_zygote.frames[start:] if f.get("c") != handle.c] == []
    handle.kill()


def test_shutdown_kills_children_and_exits(zygote_factory, make_request, kc, tmp_path) -> None:
    zygote = zygote_factory("cpu")
    handle = zygote.child(max_requests=0)
    pidfile = tmp_path / "g.pid"
    handle.send({"t": "run", "req": make_request(kc.call(spawn_and_block(pidfile, "stubborn")))})
    grandchild = int(wait_for_file(pidfile))
    zygote.send({"t": "shutdown"})
    exited = handle.wait_exited()
    assert exited["signal"] == signal.SIGKILL
    assert zygote.proc.wait(timeout=10) == 0
    assert not kc.pid_alive(grandchild) and not kc.pid_alive(handle.pid)


def test_closing_the_pipe_kills_everything(zygote_factory, make_request, kc, tmp_path) -> None:
    zygote = zygote_factory("cpu")
    handle = zygote.child(max_requests=0)
    pidfile = tmp_path / "g.pid"
    handle.send({"t": "run", "req": make_request(kc.call(spawn_and_block(pidfile, "stubborn")))})
    grandchild = int(wait_for_file(pidfile))
    zygote.proc.stdin.close()
    assert zygote.proc.wait(timeout=10) == 0
    assert_gone(grandchild, kc)
    assert_gone(handle.pid, kc)


def test_zygote_channel_is_not_fd_0_or_1(zygote_factory) -> None:
    zygote = zygote_factory("cpu")
    pid = zygote.hello["pid"]
    assert os.readlink(f"/proc/{pid}/fd/0") == "/dev/null"
    assert os.readlink(f"/proc/{pid}/fd/1") == os.readlink(f"/proc/{pid}/fd/2")
    pipes = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
    assert {f"pipe:[{os.fstat(zygote.proc.stdin.fileno()).st_ino}]",
            f"pipe:[{os.fstat(zygote.proc.stdout.fileno()).st_ino}]"} <= pipes


DRIVER = """
import json, os, subprocess, sys, time
from kcoral_runtime.ipc import FrameDecoder, encode
req, pidfile, report = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
r_in, w_in = os.pipe()
r_out, w_out = os.pipe()
zygote = subprocess.Popen([sys.executable, "-m", "kcoral_runtime.zygote", "--mode", "cpu"],
                          stdin=r_in, stdout=w_out)
decoder, frames = FrameDecoder(), []
def until(kind):
    while True:
        for frame in frames:
            if frame["t"] == kind:
                return frame
        frames.extend(json.loads(x) for x in decoder.feed(os.read(r_out, 65536)))
until("hello")
os.write(w_in, encode({"t": "fork", "c": 1, "env": {}, "unset": [], "max_requests": 0}))
child = until("forked")["pid"]
program = req.pop("program").encode()
os.write(w_in, encode({"t": "run", "c": 1, "req": req}, program))
while not os.path.exists(pidfile):
    time.sleep(0.01)
# Something else keeps both pipes open, so only the parent-death signal can tell the zygote.
holder = subprocess.Popen(["sleep", "60"], pass_fds=(w_in, r_out), start_new_session=True)
json.dump({"zygote": zygote.pid, "child": child, "holder": holder.pid}, open(report, "w"))
os._exit(0)
"""


def test_zygote_parent_death_kills_every_tree(make_request, kc, tmp_path) -> None:
    pidfile = tmp_path / "g.pid"
    report = tmp_path / "report.json"
    req = make_request(kc.call(spawn_and_block(pidfile, "stubborn")))
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    subprocess.run([sys.executable, "-c", DRIVER, json.dumps(req), str(pidfile), str(report)],
                   env=env, check=True, timeout=60)
    pids = json.loads(report.read_text())
    try:
        for pid in (int(pidfile.read_text()), pids["child"], pids["zygote"]):
            assert_gone(pid, kc, timeout=10)
    finally:
        os.kill(pids["holder"], signal.SIGKILL)


# The server sends ``reply_before_reset``: the checks on the process before the outcome, the file
# checks and the rest of the reset after it (``clean``); without it, everything before the outcome.
@pytest.mark.parametrize("reply_first", [False, True])
def test_sandbox_mode_cleans_imports_and_reports_leaks(
    cpu_zygote, make_request, kc, tmp_path, reply_first
) -> None:
    handle = cpu_zygote.child(max_requests=0)
    first = {"reply_before_reset": True} if reply_first else {}
    blob = make_request.blob(b"VALUE = 7\n")
    work = tmp_path / "sandbox-work"
    work.mkdir()
    importer = (
        "import sys\n"
        "def main():\n"
        "    sys.path.insert(0, '.')\n"
        "    import kc_ws_mod\n"
        "    import numpy\n"
        "    a = numpy.ones((300, 300))\n"
        "    (a @ a).sum()\n"
        "    return kc_ws_mod.VALUE\n"
    )
    reserved = make_request([kc.upload_blob("f", "file", blob, path=".kcoral/x")], blobs=[blob],
                            workspace=work, sandbox=True, **first)
    r = handle.run(reserved)
    assert r.outcome["error"]["kind"] == "runtime"
    assert r.outcome["error"]["message"].startswith("cannot materialize file '.kcoral/x': ")
    assert r.retire is None

    req = make_request([kc.upload_blob("f", "file", blob, path="kc_ws_mod.py")] + kc.call(importer),
                       blobs=[blob], workspace=work, sandbox=True, **first)
    r = handle.run(req)
    assert r.results["r"] == {"type": "integer", "value": 7}
    assert r.retire is None, r.frame

    check = "import sys\ndef main():\n    return ['kc_ws_mod' in sys.modules, '.' in sys.path]\n"
    r = handle.run(make_request(kc.call(check), workspace=work, sandbox=True, **first))
    assert [v["value"] for v in r.results["r"]["value"]] == [False, False]

    closed_by_gc = "keep = []\ndef main():\n    keep.append(open('held', 'w'))\n"
    r = handle.run(make_request(kc.call(closed_by_gc), workspace=work, sandbox=True, **first))
    assert r.retire is None  # the module namespace was collected at reset, closing the file
    leak = "import os\ndef main():\n    os.open('held', os.O_RDONLY)\n"
    start = handle.zygote.mark()
    r = handle.run(make_request(kc.call(leak), workspace=work, sandbox=True, **first))
    assert r.outcome["status"] == "COMPLETED"
    handle.wait_exited()
    if reply_first:
        # The file checks run right after the answer: their verdict comes with ``clean``.
        assert r.retire is None and r.frame.get("cleanup") is True
        frames = handle.zygote.frames_of(handle.c, start)
        after = frames[frames.index(r.frame) + 1:]
        clean = next(f for f in after if f["t"] == "clean")
        assert clean["retire"] == "sandbox_cleanup"
        assert "open files in the workspace" in clean["retire_detail"]
    else:
        assert r.retire == "sandbox_cleanup"
        assert "cleanup" not in r.frame  # the verdict is in the outcome, nothing left pending
        assert "open files in the workspace" in r.frame["retire_detail"]


@pytest.mark.parametrize("reply_first", [False, True])
def test_sandbox_mode_reports_threads(cpu_zygote, make_request, kc, reply_first) -> None:
    handle = cpu_zygote.child(max_requests=0)
    first = {"reply_before_reset": True} if reply_first else {}
    ok = "def main():\n    return 1\n"
    r = handle.run(make_request(kc.call(ok), sandbox=True, **first))
    assert r.retire is None and r.frame.get("cleanup") is (True if reply_first else None)
    source = "import threading, time\ndef main():\n    threading.Thread(target=time.sleep, args=(30,), name='kc-bg', daemon=True).start()\n"
    r = handle.run(make_request(kc.call(source), sandbox=True, **first))
    assert r.retire == "sandbox_cleanup"
    assert "Python threads still running: kc-bg" in r.frame["retire_detail"]
    handle.wait_exited()
