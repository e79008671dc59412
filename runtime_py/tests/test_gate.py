"""The GPU gate (gate.py, gate_shim.py): a request's processes take its lease at their first CUDA
call, share it, and give it back when the last of them is gone; the ``kcoral run`` tools leave
the lease to them.

A simulated-GPU zygote is given the built shim (``KCORAL_GATE_LIB``), and the processes a request
starts load a stand-in driver (fixtures/gate/fake_libcuda.c: it loads ``CUDA_INJECTION64_PATH``
in ``cuInit`` as the real driver does, and logs every "GPU" use with its time). The test is the
server here: it withholds each grant, looks at what the request's processes have done so far,
notes the time, then grants.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import socket
import subprocess
import tarfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple

import pytest

from conftest import RUNTIME_DIR, TIMEOUT, ZygoteProcess
from _doubles import RecordingLease, c_compiler

from kcoral_runtime import engine as engine_module, gate_shim
from kcoral_runtime.devices import SimBackend
from kcoral_runtime.engine import Engine
from kcoral_runtime.ipc import FrameSocket
from kcoral_runtime.lease import Lease

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "gate"
TOOLS = RUNTIME_DIR / "kcoral_runtime" / "tools"

# Helpers every script of these tests starts with (MARK_DIR: where it leaves its marks).
PRELUDE = """\
import ctypes, os, pathlib, subprocess, sys, threading, time
MARKS = pathlib.Path(os.environ["MARK_DIR"])
def mark(name):
    (MARKS / name).write_text(str(os.getpid()))
def wait_for(name):
    while not (MARKS / name).exists():
        time.sleep(0.005)
def gpu():
    lib = ctypes.CDLL("libcuda.so.1")
    assert lib.cuInit(0) == 0
    ctx = ctypes.c_void_p()
    assert lib.cuCtxCreate_v2(ctypes.byref(ctx), 0, 0) == 0
"""


# --------------------------------------------------------------------------- builds


def _compile(args: List[str]) -> None:
    proc = subprocess.run([c_compiler(), *args], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def builds(tmp_path_factory) -> Dict[str, str]:
    root = tmp_path_factory.mktemp("gate-builds")
    shim = gate_shim.build(str(root / "shim"))
    driver = root / "driver"
    driver.mkdir()
    _compile(["-shared", "-fPIC", "-Wall", "-Werror", str(FIXTURES / "fake_libcuda.c"),
              "-o", str(driver / "libcuda.so.1"), "-ldl", "-lpthread"])
    app = root / "driver_app"
    _compile(["-Wall", "-Werror", str(FIXTURES / "driver_app.c"), "-o", str(app), "-ldl"])
    profiler = root / "profiler"
    profiler.mkdir()
    # A program named like the profiler that prints its environment (and runs its arguments).
    shutil.copy(shutil.which("env") or "/usr/bin/env", profiler / "ncu")
    return {"shim": shim, "driver": str(driver), "app": str(app), "ncu": str(profiler / "ncu")}


@pytest.fixture(scope="module")
def zygote(builds):
    saved = os.environ.get("KCORAL_GATE_LIB")
    os.environ["KCORAL_GATE_LIB"] = builds["shim"]
    try:
        process = ZygoteProcess("sim", "--sim-devices", "1")
    finally:
        if saved is None:
            os.environ.pop("KCORAL_GATE_LIB", None)
        else:
            os.environ["KCORAL_GATE_LIB"] = saved
    assert process.hello["t"] == "hello", process.stderr_text()
    process.auto_grant = False  # these tests are the lease's server
    yield process
    process.close()


@pytest.fixture
def child(zygote):
    handle = zygote.child(max_requests=0)
    assert handle.ready["t"] == "ready", handle.ready
    yield handle
    handle.kill()


# --------------------------------------------------------------------------- programs


def _tar(files: Dict[str, str]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o600
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def tool_program(make_request, kc, tool: str, arguments: List[str], env: Dict[str, str],
                 files: Dict[str, str]) -> Dict[str, Any]:
    """The program ``kcoral run TOOL`` sends (cli/run/program.ts), with this runtime's sources."""
    blob = make_request.blob(_tar(files))
    instructions = [
        kc.module("tool_runner", (TOOLS / "runner.py").read_text()),
        kc.get_function("runner", "tool_runner", "run"),
        kc.module("definition", (TOOLS / f"{tool}.py").read_text()),
        kc.get_function("tool_run", "definition", "run"),
        kc.upload_blob("inputs", "bytes", blob),
        kc.run("run", "runner", kc.ref("inputs"), kc.ref("tool_run"), arguments, env, []),
        kc.ret("outcome", "run"),
    ]
    return make_request(instructions, blobs=[blob])


class Scene:
    """One request's marks directory, stand-in driver log and workspace."""

    def __init__(self, tmp_path: Path, builds: Dict[str, str]) -> None:
        self.marks = tmp_path / "marks"
        self.marks.mkdir()
        self.log = tmp_path / "driver.log"
        self.env = {"LD_LIBRARY_PATH": builds["driver"], "FAKE_CUDA_LOG": str(self.log),
                    "MARK_DIR": str(self.marks)}

    def has(self, name: str) -> bool:
        return (self.marks / name).exists()

    def touch(self, name: str) -> None:
        (self.marks / name).write_text("")

    def wait_for(self, name: str) -> None:
        deadline = time.monotonic() + TIMEOUT
        while not self.has(name):
            assert time.monotonic() < deadline, f"no mark {name!r}"
            time.sleep(0.005)

    def driver_events(self) -> List[Tuple[str, int, int]]:
        if not self.log.exists():
            return []
        out = []
        for line in self.log.read_text().splitlines():
            event, pid, at = line.split()
            out.append((event, int(pid), int(at)))
        return out


def _next_frame(zygote: ZygoteProcess, c: int, pos: int) -> Tuple[int, Dict[str, Any]]:
    deadline = time.monotonic() + TIMEOUT
    with zygote._cond:
        while True:
            for index in range(pos, len(zygote.frames)):
                if zygote.frames[index].get("c") == c:
                    return index, zygote.frames[index]
            pos = len(zygote.frames)
            remaining = deadline - time.monotonic()
            assert remaining > 0 and not zygote.closed, (
                f"no frame from child {c}; stderr: {zygote.stderr_text()[-3000:]}")
            zygote._cond.wait(remaining)


def run_serving(zygote: ZygoteProcess, child, req: Dict[str, Any],
                before_grant: Callable[[int], None] = lambda n: None,
                ) -> Tuple[Dict[str, Any], List[str], List[int]]:
    """Runs ``req``, granting each ``acquire`` after ``before_grant(n)`` (n: 0, 1, ...).
    Returns the outcome, the lease frames and outcome in order, and when each grant was sent
    (``time.monotonic_ns``: the stand-in driver's clock)."""
    pos = zygote.mark()
    child.send({"t": "run", "req": req})
    seen: List[str] = []
    grants: List[int] = []
    while True:
        pos, frame = _next_frame(zygote, child.c, pos)
        pos += 1
        kind = frame["t"]
        if kind == "lease":
            seen.append(frame["a"])
            if frame["a"] == "acquire":
                before_grant(len(grants))
                grants.append(time.monotonic_ns())
                child.send({"t": "lease", "a": "granted"})
        elif kind in ("outcome", "exited"):
            seen.append(kind)
            assert kind == "outcome", f"child exited: {frame}; {zygote.stderr_text()[-3000:]}"
            return frame["outcome"], seen, grants


def completed(outcome: Dict[str, Any]) -> Dict[str, Any]:
    assert outcome["status"] == "COMPLETED", outcome["error"]
    result = json.loads(outcome["results"])["outcome"]
    returncode = result["value"]["returncode"]["value"]
    assert returncode == 0, Path(outcome["stderr"]["path"]).read_text()[-3000:]
    return result


def uses_after(scene: Scene, grant_ns: int) -> None:
    """Every "GPU" use (cuInit included) came after the grant."""
    events = scene.driver_events()
    assert any(event == "use" for event, _, _ in events), events
    assert all(at > grant_ns for _, _, at in events), (events, grant_ns)


# --------------------------------------------------------------------------- the ways in


def _gated_script(make_request, kc, scene: Scene, body: str) -> Dict[str, Any]:
    script = PRELUDE + 'mark("started")\n' + body
    return tool_program(make_request, kc, "python", ["script.py"], scene.env, {"script.py": script})


WAYS_IN = {
    "ctypes_cuInit": "gpu()\n",
    "python_thread": "t = threading.Thread(target=gpu)\nt.start()\nt.join()\n",
    "grandchild_process": (
        "code = 'import ctypes; lib = ctypes.CDLL(\"libcuda.so.1\"); assert lib.cuInit(0) == 0; "
        "c = ctypes.c_void_p(); assert lib.cuCtxCreate_v2(ctypes.byref(c), 0, 0) == 0'\n"
        "subprocess.run([sys.executable, '-c', code], check=True)\n"
    ),
    "compiled_binary": "subprocess.run([os.environ['DRIVER_APP']], check=True)\n",
}


@pytest.mark.parametrize("way", sorted(WAYS_IN))
def test_first_cuda_call_waits_for_the_lease(zygote, child, make_request, kc, tmp_path, builds,
                                             way) -> None:
    scene = Scene(tmp_path, builds)
    scene.env["DRIVER_APP"] = builds["app"]
    req = _gated_script(make_request, kc, scene, WAYS_IN[way] + 'mark("done")\n')

    def before_grant(n: int) -> None:
        if n == 0:
            # The script runs (its interpreter started, outside the lease) and is stopped at its
            # first CUDA call: the driver has done nothing yet.
            assert scene.has("started") and not scene.has("done")
            assert scene.driver_events() == []

    outcome, seen, grants = run_serving(zygote, child, req, before_grant)
    completed(outcome)
    uses_after(scene, grants[0])
    # Held from the first CUDA call to the process's exit, then taken again for the drain
    # (or kept, when the drain asked before the gate saw the exit).
    assert seen in (["acquire", "release", "acquire", "outcome"], ["acquire", "outcome"]), seen


def test_shell_tool_is_gated(zygote, child, make_request, kc, tmp_path, builds) -> None:
    scene = Scene(tmp_path, builds)
    command = f'touch "$MARK_DIR/started"; exec {builds["app"]}'
    req = tool_program(make_request, kc, "shell", ["sh", "-c", command], scene.env, {})

    def before_grant(n: int) -> None:
        if n == 0:
            assert scene.has("started") and scene.driver_events() == []

    outcome, seen, grants = run_serving(zygote, child, req, before_grant)
    completed(outcome)
    uses_after(scene, grants[0])


def test_cpu_only_script_never_takes_the_lease(zygote, child, make_request, kc, tmp_path,
                                               builds) -> None:
    scene = Scene(tmp_path, builds)
    req = _gated_script(make_request, kc, scene, 'time.sleep(0.2)\nmark("done")\n')

    def before_grant(n: int) -> None:
        assert scene.has("done")  # the only acquire is the drain, once the script is over

    outcome, seen, _ = run_serving(zygote, child, req, before_grant)
    completed(outcome)
    assert seen == ["acquire", "outcome"]


def test_fork_after_cuda_init_keeps_the_lease_until_the_fork_exits(
        zygote, child, make_request, kc, tmp_path, builds) -> None:
    scene = Scene(tmp_path, builds)
    parent = PRELUDE + (
        "gpu()\n"
        "if os.fork() == 0:\n"
        "    wait_for('go')\n"
        "    lib = ctypes.CDLL('libcuda.so.1')\n"
        "    ctx = ctypes.c_void_p()\n"
        "    assert lib.cuCtxCreate_v2(ctypes.byref(ctx), 0, 0) == 0\n"
        "    mark('fork_used')\n"
        "    wait_for('go2')\n"
        "    mark('fork_done')\n"
        "    os._exit(0)\n"
    )
    body = ("subprocess.run([sys.executable, 'parent.py'], check=True)\n"
            "mark('parent_done')\n"
            "wait_for('fork_done')\n")
    script = PRELUDE + 'mark("started")\n' + body
    req = tool_program(make_request, kc, "python", ["script.py"], scene.env,
                       {"script.py": script, "parent.py": parent})
    releases_at: Dict[str, int] = {}

    def watch() -> None:
        # The process that called cuInit has exited; its fork still runs: no release yet.
        scene.wait_for("parent_done")
        releases_at["parent_done"] = _releases(zygote, child.c, start)
        scene.touch("go")
        scene.wait_for("fork_used")
        releases_at["fork_used"] = _releases(zygote, child.c, start)
        scene.touch("go2")

    def before_grant(n: int) -> None:
        if n == 0:  # parent.py's cuInit
            assert scene.has("started") and scene.driver_events() == []

    start = zygote.mark()
    watcher = threading.Thread(target=watch)
    watcher.start()
    outcome, seen, grants = run_serving(zygote, child, req, before_grant)
    watcher.join()
    completed(outcome)
    assert releases_at == {"parent_done": 0, "fork_used": 0}
    uses_after(scene, grants[0])
    assert seen in (["acquire", "release", "acquire", "outcome"], ["acquire", "outcome"]), seen


def _releases(zygote: ZygoteProcess, c: int, start: int) -> int:
    return sum(1 for f in zygote.frames_of(c, start) if f["t"] == "lease" and f["a"] == "release")


def test_processes_of_a_request_share_its_lease(zygote, child, make_request, kc, tmp_path,
                                                builds) -> None:
    scene = Scene(tmp_path, builds)
    body = (
        "code = 'import ctypes, os, time, pathlib; lib = ctypes.CDLL(\"libcuda.so.1\"); "
        "lib.cuInit(0); p = pathlib.Path(os.environ[\"MARK_DIR\"]); "
        "(p / str(os.getpid())).write_text(\"\"); "
        "[time.sleep(0.005) for _ in iter(lambda: (p / \"go\").exists(), True)]'\n"
        "procs = [subprocess.Popen([sys.executable, '-c', code]) for _ in range(3)]\n"
        "assert all(p.wait() == 0 for p in procs)\n"
    )
    req = _gated_script(make_request, kc, scene, body)

    def watch() -> None:
        deadline = time.monotonic() + TIMEOUT
        while len([p for p in scene.marks.iterdir() if p.name.isdigit()]) < 3:
            assert time.monotonic() < deadline
            time.sleep(0.005)
        scene.touch("go")

    def before_grant(n: int) -> None:
        if n == 0:  # the first of them to reach cuInit
            assert scene.has("started") and not scene.has("go")

    watcher = threading.Thread(target=watch)
    watcher.start()
    outcome, seen, _ = run_serving(zygote, child, req, before_grant)
    watcher.join()
    completed(outcome)
    # Three processes in CUDA at once, one lease asked for (no process waits for another).
    assert seen in (["acquire", "release", "acquire", "outcome"], ["acquire", "outcome"]), seen


def test_a_process_outside_the_request_is_refused(zygote, child, make_request, kc, tmp_path,
                                                  builds) -> None:
    scene = Scene(tmp_path, builds)
    body = "mark('gate_' + os.environ['KCORAL_GATE'].lstrip('@'))\nwait_for('go')\ngpu()\n"
    req = _gated_script(make_request, kc, scene, body)
    answers: List[Any] = []

    def intruder() -> None:
        try:
            deadline = time.monotonic() + TIMEOUT
            while not any(p.name.startswith("gate_") for p in scene.marks.iterdir()):
                assert time.monotonic() < deadline
                time.sleep(0.005)
            name = next(p.name for p in scene.marks.iterdir() if p.name.startswith("gate_"))[5:]
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(TIMEOUT)
                sock.connect("\0" + name)
                sock.sendall(b"AI")
                answers.append(sock.recv(1))
        except Exception as exc:  # reported by the assertion below
            answers.append(exc)
        finally:
            scene.touch("go")

    thread = threading.Thread(target=intruder)
    thread.start()
    outcome, seen, grants = run_serving(zygote, child, req)
    thread.join()
    completed(outcome)
    assert answers == [b"D"]
    uses_after(scene, grants[0])


# --------------------------------------------------------------------------- profilers


def test_a_replaced_injection_takes_the_lease_at_process_start(
        zygote, child, make_request, kc, tmp_path, builds) -> None:
    scene = Scene(tmp_path, builds)
    body = (
        "env = dict(os.environ, CUDA_INJECTION64_PATH='/opt/profiler/libinjection.so')\n"
        "subprocess.run([sys.executable, '-c', 'import os, pathlib; "
        "(pathlib.Path(os.environ[\"MARK_DIR\"]) / \"profiled\").write_text(\"\")'], "
        "env=env, check=True)\n"
    )
    req = _gated_script(make_request, kc, scene, body)

    def before_grant(n: int) -> None:
        if n == 0:  # the process under another injection waits before it runs any code
            assert scene.has("started") and not scene.has("profiled")

    outcome, seen, _ = run_serving(zygote, child, req, before_grant)
    completed(outcome)
    assert seen in (["acquire", "release", "acquire", "outcome"], ["acquire", "outcome"]), seen


def test_a_profiler_started_by_a_script_holds_the_lease_for_its_life(
        zygote, child, make_request, kc, tmp_path, builds) -> None:
    scene = Scene(tmp_path, builds)
    body = (f"out = subprocess.run([{builds['ncu']!r}], check=True, capture_output=True,"
            " text=True).stdout\n"
            "(pathlib.Path(os.environ['MARK_DIR']) / 'ncu_env').write_text(out)\n"
            "mark('profiled')\n")
    req = _gated_script(make_request, kc, scene, body)

    def before_grant(n: int) -> None:
        if n == 0:
            assert scene.has("started") and not scene.has("profiled")

    outcome, seen, _ = run_serving(zygote, child, req, before_grant)
    completed(outcome)
    names = {line.split("=", 1)[0] for line in (scene.marks / "ncu_env").read_text().splitlines()}
    # ncu refuses to start while another injection is named; its children keep the backstop.
    assert "CUDA_INJECTION64_PATH" not in names and "LD_PRELOAD" in names, sorted(names)


def test_the_ncu_tool_keeps_the_whole_run_lease(zygote, child, make_request, kc, tmp_path,
                                                builds) -> None:
    scene = Scene(tmp_path, builds)
    req = tool_program(make_request, kc, "ncu", ["true"], scene.env, {})
    workspace = Path(req["workspace"])

    def before_grant(n: int) -> None:
        if n == 0:  # before the runner unpacked anything: the run itself takes the lease
            assert not (workspace / "inputs").exists()

    outcome, seen, _ = run_serving(zygote, child, req, before_grant)
    assert seen == ["acquire", "outcome"]


def test_an_unrecognised_runner_keeps_the_whole_run_lease(zygote, child, make_request, kc,
                                                          tmp_path, builds) -> None:
    scene = Scene(tmp_path, builds)
    req = tool_program(make_request, kc, "python", ["script.py"], scene.env,
                       {"script.py": PRELUDE + "mark('started')\n"})
    program = json.loads(req["program"])
    program["instructions"][0]["source"] += "\n# another version of the runner\n"
    req["program"] = json.dumps(program)

    def before_grant(n: int) -> None:
        if n == 0:
            assert not scene.has("started")

    outcome, seen, _ = run_serving(zygote, child, req, before_grant)
    completed(outcome)
    assert seen == ["acquire", "outcome"]


def test_a_cpu_only_function_s_processes_are_gated(zygote, child, make_request, kc, tmp_path,
                                                   builds) -> None:
    scene = Scene(tmp_path, builds)
    source = (
        "import os, subprocess, sys\n"
        "def spawn(env):\n"
        "    code = 'import ctypes; lib = ctypes.CDLL(\"libcuda.so.1\"); lib.cuInit(0); "
        "c = ctypes.c_void_p(); assert lib.cuCtxCreate_v2(ctypes.byref(c), 0, 0) == 0'\n"
        "    open(os.path.join(env['MARK_DIR'], 'started'), 'w').close()\n"
        "    subprocess.run([sys.executable, '-c', code], env={**os.environ, **env}, check=True)\n"
        "    return 1\n"
    )
    instructions = [kc.module("m", source), kc.get_function("f", "m", "spawn", cpu_only=True),
                    kc.run("r", "f", scene.env), kc.ret("r", "r")]
    req = make_request(instructions)

    def before_grant(n: int) -> None:
        if n == 1:  # the module upload took it, the cpu_only run gave it back
            assert scene.has("started") and scene.driver_events() == []

    outcome, seen, grants = run_serving(zygote, child, req, before_grant)
    assert outcome["status"] == "COMPLETED", outcome["error"]
    uses_after(scene, grants[1])
    assert seen[:3] == ["acquire", "release", "acquire"], seen


# --------------------------------------------------------------------------- the lease


class _Backend:
    def __init__(self) -> None:
        self.drains = 0

    def prepare_release(self) -> None:
        self.drains += 1


def _frames(sock: socket.socket) -> List[str]:
    sock.setblocking(False)
    data = b""
    try:
        while True:
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
    except BlockingIOError:
        pass
    out = []
    while data:
        size = int.from_bytes(data[:4], "big")
        out.append(json.loads(data[4:4 + size])["a"])
        data = data[4 + size:]
    return out


def test_lease_is_shared_by_the_engine_and_processes() -> None:
    ours, theirs = socket.socketpair()
    backend = _Backend()
    lease = Lease(FrameSocket(ours), backend)
    granted = b'{"t":"lease","a":"granted"}'
    theirs.sendall(len(granted).to_bytes(4, "big") + granted)
    lease.acquire()
    assert _frames(theirs) == ["acquire"]
    lease.process_started()  # held already: no frame, no wait
    lease.release()  # the engine is done, a process still holds it
    assert _frames(theirs) == [] and lease.held and backend.drains == 1
    lease.process_ended()
    assert _frames(theirs) == ["release"] and not lease.held
    lease.process_ended()  # nothing more to end
    assert _frames(theirs) == []
    ours.close()
    theirs.close()


def test_process_waits_for_a_grant_the_engine_reads() -> None:
    ours, theirs = socket.socketpair()
    lease = Lease(FrameSocket(ours), _Backend())
    granted = b'{"t":"lease","a":"granted"}'
    order: List[str] = []
    engine = threading.Thread(target=lambda: (lease.acquire(), order.append("engine")))
    engine.start()
    deadline = time.monotonic() + TIMEOUT
    while not order and lease._state != 1:  # the engine asked
        assert time.monotonic() < deadline
        time.sleep(0.001)
    process = threading.Thread(target=lambda: (lease.process_started(), order.append("process")))
    process.start()
    theirs.sendall(len(granted).to_bytes(4, "big") + granted)
    engine.join(TIMEOUT)
    process.join(TIMEOUT)
    assert sorted(order) == ["engine", "process"]
    assert _frames(theirs) == ["acquire"]  # one request, one grant, for both
    ours.close()
    theirs.close()


def test_shim_refuses_without_a_gate(builds, tmp_path) -> None:
    env = dict(os.environ, LD_LIBRARY_PATH=builds["driver"], CUDA_INJECTION64_PATH=builds["shim"],
               FAKE_CUDA_LOG=str(tmp_path / "log"))
    env.pop("KCORAL_GATE", None)
    proc = subprocess.run([builds["app"]], env=env, capture_output=True, text=True)
    assert proc.returncode == gate_shim.EXIT_REFUSED
    assert "KCORAL_GATE is not set" in proc.stderr
    assert not (tmp_path / "log").exists()  # the driver did nothing


# --------------------------------------------------------------------------- the engine


class _GuardedSim(SimBackend):
    """Simulated devices that count the calls run under the cpu_only guard."""

    def __init__(self) -> None:
        super().__init__({}, 1)
        self.guarded = 0

    def run_cpu_only(self, fn: Callable[..., Any], args: List[Any]) -> Any:
        self.guarded += 1
        return fn(*args)


class _NoGate:
    def begin_request(self) -> None:
        pass

    def end_request(self) -> None:
        pass


def test_guard_only_where_other_code_ran(tmp_path, monkeypatch, make_request, kc) -> None:
    """A fresh child's first tool request has run no code but this runtime's: the tool run needs
    no CUDA guard; after another request, or beside a module of the program's own, it does."""
    monkeypatch.setattr(engine_module, "kill_leftover_processes", lambda: False)
    backend = _GuardedSim()
    log: List[str] = []

    def run(eng: Engine, extra_module: bool) -> None:
        req = tool_program(make_request, kc, "shell", ["true"], {}, {})
        if extra_module:
            program = json.loads(req["program"])
            program["instructions"].insert(0, kc.module("own", "x = 1\n"))
            req["program"] = json.dumps(program)
        outcome, _, _ = eng.execute(req, False)
        eng.lease.request_done()
        completed(outcome)

    reused = Engine(backend, RecordingLease(log), lambda i: None, _NoGate())
    run(reused, extra_module=False)
    assert backend.guarded == 0
    run(reused, extra_module=False)
    assert backend.guarded == 1
    run(Engine(backend, RecordingLease(log), lambda i: None, _NoGate()), extra_module=True)
    assert backend.guarded == 2
