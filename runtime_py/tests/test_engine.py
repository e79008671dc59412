"""In-process engine tests for paths a CPU machine cannot reach through real CUDA: drain
errors, the cpu_only guard hook and gpu_access errors (with a fake device backend)."""

from __future__ import annotations

import contextlib
import json
import os
import linecache
from pathlib import Path
from typing import Any, Iterator, List, Optional

import pytest

from kcoral_runtime import devices, engine as engine_module
from kcoral_runtime.devices import CPU_ONLY_UNAVAILABLE, GpuBackend, SimBackend
from kcoral_runtime.engine import Engine
from kcoral_runtime.errors import ExecutionError, GPUAccessViolation

from _doubles import RecordingLease


class FakeGpu(SimBackend):
    """Simulated devices whose drain can be told to fail like CUDA does."""

    def __init__(self) -> None:
        super().__init__({}, 1)
        self.sync_error: Optional[Exception] = None
        self.last_error: Optional[str] = None
        self.last_error_raises = False
        self.cpu_only_error: Optional[Exception] = None

    def synchronize(self) -> None:
        if self.sync_error is not None:
            raise self.sync_error

    def take_last_error(self) -> Optional[str]:
        if self.last_error_raises:
            raise RuntimeError("cannot load libcudart")
        pending, self.last_error = self.last_error, None
        return pending

    def run_cpu_only(self, fn: Any, args: List[Any]) -> Any:
        if self.cpu_only_error is not None:
            raise self.cpu_only_error
        return fn(*args)


@pytest.fixture
def setup(tmp_path: Path, monkeypatch):
    # Never let an in-process engine reap or kill pytest's own children.
    monkeypatch.setattr(engine_module, "kill_leftover_processes", lambda: False)
    log: List[str] = []
    backend = FakeGpu()
    eng = Engine(backend, RecordingLease(log), lambda i: log.append(f"instr {i}"))
    eng.snapshot_state()
    backend.engine_under_test = eng
    counter = [0]

    def execute(instructions, last: bool = False, **extra):
        counter[0] += 1
        work = tmp_path / f"w{counter[0]}"
        res = tmp_path / f"r{counter[0]}"
        work.mkdir()
        res.mkdir()
        req = {"program": json.dumps({"instructions": instructions}), "blobs": {},
               "workspace": str(work), "results": str(res), "output_limit_bytes": 0,
               "max_return_bytes": 1 << 20, "sandbox": False, **extra}
        del log[:]
        outcome, retire, detail = eng.execute(req, last)
        eng.lease.request_done()
        return outcome, retire, list(log)

    return backend, execute


PROGRAM = [
    {"op": "upload", "kind": "module", "id": "m", "source": "def f():\n    return 5\n"},
    {"op": "get_function", "id": "g", "module": {"$ref": "m"}, "name": "f", "cpu_only": True},
    {"op": "run", "id": "r", "fn": {"$ref": "g"}},
    {"op": "return", "key": "r", "value": {"$ref": "r"}},
]


def test_sticky_error_at_drain_poisons(setup) -> None:
    backend, execute = setup
    backend.sync_error = RuntimeError("CUDA error: an illegal memory access was encountered")
    outcome, retire, log = execute(PROGRAM[:1])
    assert retire == "poisoned_context"
    assert outcome["status"] == "FAILED"
    error = outcome["error"]
    assert (error["kind"], error["message"]) == (
        "runtime", "RuntimeError: CUDA error: an illegal memory access was encountered")
    assert (error["instruction_index"], error["instruction_op"], error["instruction_id"]) == (0, "upload", "m")
    assert "Traceback" in error["traceback"]


def test_sticky_error_keeps_the_first_error(setup) -> None:
    backend, execute = setup
    backend.sync_error = RuntimeError("CUDA error: device-side assert triggered")
    boom = [{"op": "upload", "kind": "module", "id": "m", "source": "raise ValueError('x')\n"}]
    outcome, retire, _ = execute(boom)
    assert retire == "poisoned_context"
    assert (outcome["error"]["kind"], outcome["error"]["message"]) == ("parse", "ValueError: x")


def test_pending_launch_error_fails_but_keeps_the_worker(setup) -> None:
    backend, execute = setup
    pending = "CUDA error cudaErrorInvalidConfiguration (9): invalid configuration argument"
    backend.last_error = pending
    outcome, retire, _ = execute(PROGRAM)
    assert retire is None
    assert outcome["status"] == "FAILED"
    assert (outcome["error"]["kind"], outcome["error"]["message"]) == ("runtime", pending)
    assert outcome["error"]["traceback"] == ""
    assert (outcome["error"]["instruction_index"], outcome["error"]["instruction_op"]) == (3, "return")
    assert json.loads(outcome["results"]) == {"r": {"type": "integer", "value": 5}}
    outcome, retire, _ = execute(PROGRAM)  # consumed: the next request is clean
    assert outcome["status"] == "COMPLETED" and retire is None


def test_unreadable_last_error_poisons(setup) -> None:
    backend, execute = setup
    backend.last_error_raises = True
    outcome, retire, _ = execute(PROGRAM)
    assert retire == "poisoned_context"
    assert outcome["error"]["message"] == "RuntimeError: cannot load libcudart"


def test_gpu_access_violation_fields(setup) -> None:
    backend, execute = setup
    backend.cpu_only_error = GPUAccessViolation(
        "cudaMalloc", "<uploaded:abc>:3 in f", "  File \"<uploaded:abc>\", line 3\n", 123456789)
    backend.last_error = "CUDA error cudaErrorMemoryAllocation (2): out of memory"
    outcome, retire, log = execute(PROGRAM)
    assert retire is None
    assert log == ["instr 0", "acquire", "instr 1", "instr 2", "release", "acquire"]
    error = outcome["error"]
    assert set(error) == {"kind", "message", "instruction_index", "instruction_op",
                          "instruction_id", "traceback"}
    assert error["kind"] == "gpu_access"
    assert error["message"] == (
        "cpu_only function called cudaMalloc at <uploaded:abc>:3 in f; "
        "CUDA also reports CUDA error cudaErrorMemoryAllocation (2): out of memory")
    assert error["traceback"] == "  File \"<uploaded:abc>\", line 3\n"
    assert (error["instruction_index"], error["instruction_id"]) == (2, "r")
    assert outcome["gpu_access"] == {"cuda_call": "cudaMalloc", "location": "<uploaded:abc>:3 in f",
                                     "detected_at_ns": 123456789}


def test_last_request_skips_reset(setup, monkeypatch) -> None:
    _, execute = setup
    outcome, retire, _ = execute(PROGRAM, last=True)
    assert (outcome["status"], retire) == ("COMPLETED", "request_limit")


def test_reset_failure_poisons(setup, monkeypatch) -> None:
    backend, execute = setup
    calls = []

    def empty_cache() -> None:
        calls.append(1)
        raise RuntimeError("CUDA error: misaligned address")

    monkeypatch.setattr(backend, "empty_cache", empty_cache)
    outcome, retire, _ = execute(PROGRAM)
    assert outcome["status"] == "COMPLETED" and retire == "poisoned_context" and calls


def test_granted_lease_is_not_asked_for_again(setup) -> None:
    _, execute = setup
    outcome, retire, log = execute(PROGRAM[:1], lease_held=True)
    assert (outcome["status"], retire) == ("COMPLETED", None)
    assert log == ["instr 0"]


def test_reply_before_reset_leaves_the_reset_to_finish_request(setup, monkeypatch) -> None:
    backend, execute = setup
    calls: List[str] = []
    monkeypatch.setattr(backend, "empty_cache", lambda: calls.append("empty_cache"))
    outcome, retire, _ = execute(PROGRAM, reply_before_reset=True)
    assert (outcome["status"], retire, calls) == ("COMPLETED", None, [])
    eng = backend.engine_under_test
    seeded = list(eng.modules.seeded)
    assert eng.reset_pending and seeded and all(k in linecache.cache for k in seeded)
    assert eng.finish_request() == (None, None)
    assert calls == ["empty_cache"] and not eng.reset_pending
    assert not eng.modules.seeded and not any(k in linecache.cache for k in seeded)
    assert eng.finish_request() == (None, None) and calls == ["empty_cache"]  # nothing pending

    def empty_cache() -> None:
        raise RuntimeError("CUDA error: misaligned address")

    monkeypatch.setattr(backend, "empty_cache", empty_cache)
    outcome, retire, _ = execute(PROGRAM, reply_before_reset=True)
    assert (outcome["status"], retire) == ("COMPLETED", None)
    retire, detail = eng.finish_request()
    assert retire == "poisoned_context" and "misaligned address" in (detail or "")


def _order(eng: Engine, backend: Any, monkeypatch) -> List[str]:
    """The engine's lease log, with the reset's and the sandbox checks' steps written into it."""
    log = eng.lease.log

    def recording(name: str, fn: Any) -> Any:
        def step(*args: Any) -> Any:
            log.append(name)
            return fn(*args)

        return step

    monkeypatch.setattr(backend, "empty_cache", recording("empty_cache", backend.empty_cache))
    assert eng.state is not None
    monkeypatch.setattr(eng.state, "restore", recording("restore", eng.state.restore))
    for name in ("clean_and_check_process", "check_descriptors", "check_mappings"):
        method = getattr(engine_module.SandboxState, name)
        monkeypatch.setattr(engine_module.SandboxState, name, recording(name, method))
    return log


@pytest.fixture
def ordered(setup, monkeypatch):
    """The engine under test and its lease log with the reset's and checks' steps in it."""
    backend, _ = setup
    eng = backend.engine_under_test
    return eng, _order(eng, backend, monkeypatch)


_STEPS = {"acquire", "release", "empty_cache", "restore", "clean_and_check_process",
          "check_descriptors", "check_mappings"}


def _steps(log: List[str]) -> List[str]:
    steps = [entry for entry in log if entry in _STEPS]
    del log[:]
    return steps


def test_unsandboxed_reset_after_the_answer_stays_under_the_lease(setup, monkeypatch) -> None:
    backend, execute = setup
    eng = backend.engine_under_test
    log = _order(eng, backend, monkeypatch)
    setenv = [{"op": "upload", "kind": "module", "id": "m",
               "source": "import os\ndef f():\n    os.environ['KC_RESET_ORDER'] = '1'\n"},
              {"op": "get_function", "id": "g", "module": {"$ref": "m"}, "name": "f"},
              {"op": "run", "id": "r", "fn": {"$ref": "g"}}]
    outcome, retire, _ = execute(setenv, reply_before_reset=True)
    assert (outcome["status"], retire) == ("COMPLETED", None) and eng.reset_pending
    del log[:]
    eng.lease.held = True  # the outcome's ``cleanup`` keeps the lease with the child
    assert eng.finish_request() == (None, None)
    # All of it under the lease; the ``clean`` frame hands the lease back.
    assert _steps(log) == ["restore", "empty_cache"] and eng.lease.held
    assert "KC_RESET_ORDER" not in os.environ


def _sandboxed(eng: Engine, tmp_path: Path, name: str, source: str):
    """Runs ``source``'s ``f`` in sandbox mode with ``reply_before_reset``, as the server sends
    it: (outcome, retire, detail)."""
    work = tmp_path / f"sw-{name}"
    res = tmp_path / f"sr-{name}"
    work.mkdir()
    res.mkdir()
    program = [{"op": "upload", "kind": "module", "id": "m", "source": source},
               {"op": "get_function", "id": "g", "module": {"$ref": "m"}, "name": "f"},
               {"op": "run", "id": "r", "fn": {"$ref": "g"}}]
    req = {"program": json.dumps({"instructions": program}), "blobs": {},
           "workspace": str(work), "results": str(res), "output_limit_bytes": 0,
           "max_return_bytes": 1 << 20, "sandbox": True, "reply_before_reset": True}
    outcome, retire, detail = eng.execute(req, False)
    eng.lease.request_done()
    return outcome, retire, detail


def test_sandbox_checks_before_the_outcome_reset_after_snapshot_while_idle(
    ordered, tmp_path, monkeypatch
) -> None:
    eng, log = ordered
    snapshots: List[object] = []

    class Counted(engine_module.SandboxState):
        def __init__(self) -> None:
            super().__init__()
            snapshots.append(self)

    monkeypatch.setattr(engine_module, "SandboxState", Counted)
    ok = "def f():\n    return 1\n"
    del log[:]
    outcome, retire, detail = _sandboxed(eng, tmp_path, "1", ok)
    assert (outcome["status"], retire, detail) == ("COMPLETED", None, None)
    # Before the outcome: the in-process checks and the GPU part of the reset under the lease
    # (taken by the module upload), then the lease back.
    assert _steps(log) == ["acquire", "clean_and_check_process", "empty_cache", "release"]
    assert eng.reset_pending and len(snapshots) == 1  # the first one at the request's start
    assert not eng.modules.seeded  # forgotten before the checks (namespaces collected)
    assert eng.finish_request() == (None, None)
    # After the answer, no lease: the file checks, then the host-only state.
    assert _steps(log) == ["check_descriptors", "check_mappings", "restore"]
    assert not eng.lease.held
    eng.idle()
    assert len(snapshots) == 2  # the next request's, while idle
    outcome, retire, _ = _sandboxed(eng, tmp_path, "2", ok)
    assert (outcome["status"], retire) == ("COMPLETED", None) and len(snapshots) == 2
    assert eng.finish_request() == (None, None)
    eng.idle()
    assert len(snapshots) == 3


def test_sandbox_host_state_failure_after_the_answer_retires_under_the_lease(
    ordered, tmp_path, monkeypatch
) -> None:
    eng, log = ordered

    def cannot(*_: Any) -> None:
        raise engine_module.StateNotRestored("resource limit 7 (64, 64) not restored")

    assert eng.state is not None
    monkeypatch.setattr(eng.state, "restore", cannot)
    outcome, retire, _ = _sandboxed(eng, tmp_path, "state", "def f():\n    return 1\n")
    assert (outcome["status"], retire) == ("COMPLETED", None) and not eng.lease.held
    del log[:]
    retire, detail = eng.finish_request()
    assert (retire, detail) == ("process_state", "resource limit 7 (64, 64) not restored")
    # Its exit stays under the lease.
    assert _steps(log) == ["check_descriptors", "check_mappings", "acquire"] and eng.lease.held


def _leak_found_after_the_answer(
    eng: Engine, log: List[str], tmp_path: Path, name: str, source: str, leaked: str
) -> str:
    """Runs ``source`` (which leaves workspace file ``leaked`` open or mapped) sandboxed: the
    outcome carries no verdict; the file checks after the answer find it, also once the server
    has emptied the workspace, and the child retires under the lease. Returns the detail."""
    outcome, retire, _ = _sandboxed(eng, tmp_path, name, source)
    assert (outcome["status"], retire) == ("COMPLETED", None) and eng.reset_pending
    os.unlink(tmp_path / f"sw-{name}" / leaked)  # the server empties the workspace
    del log[:]
    retire, detail = eng.finish_request()
    assert retire == "sandbox_cleanup" and detail is not None
    # Found without the lease; taken again: the exit stays under it.
    assert _steps(log) == ["check_descriptors", "check_mappings", "acquire"]
    assert eng.lease.held
    return detail


def test_sandbox_file_leak_retires_right_after_the_answer_under_the_lease(
    ordered, tmp_path
) -> None:
    """A workspace file still open is found after the answer (the seat is busy until then),
    also once the server has emptied the workspace; the child retires under the lease."""
    eng, log = ordered
    leak = "import builtins\ndef f():\n    builtins._kcoral_test_kept = open('kept.txt', 'w')\n"
    try:
        detail = _leak_found_after_the_answer(eng, log, tmp_path, "leak", leak, "kept.txt")
        assert "open files in the workspace" in detail and "kept.txt" in detail
        eng.idle()
        assert eng._sandbox_next is None  # a retiring child takes no next snapshot
    finally:
        import builtins

        getattr(builtins, "_kcoral_test_kept").close()
        del builtins._kcoral_test_kept  # type: ignore[attr-defined]


def test_sandbox_thread_leak_retires_without_giving_the_lease_back(ordered, tmp_path, monkeypatch) -> None:
    eng, log = ordered
    stop = "import threading\nstop = threading.Event()\n"
    source = stop + "def f():\n    threading.Thread(target=stop.wait, name='kc-held').start()\n"
    del log[:]
    outcome, retire, detail = _sandboxed(eng, tmp_path, "thread", source)
    try:
        assert (outcome["status"], retire) == ("COMPLETED", "sandbox_cleanup")
        assert "Python threads still running: kc-held" in (detail or "")
        # The thread may still reach the GPU: the lease is never given back.
        assert _steps(log) == ["acquire", "clean_and_check_process"]
    finally:
        import threading

        for thread in threading.enumerate():
            if thread.name == "kc-held":
                thread._target.__self__.set()  # type: ignore[attr-defined]
                thread.join()


def test_sandbox_signal_handlers_go_back_before_the_checks(setup, tmp_path) -> None:
    import signal

    backend, _ = setup
    eng = backend.engine_under_test
    before = signal.getsignal(signal.SIGUSR1)
    source = "import signal\ndef f():\n    signal.signal(signal.SIGUSR1, lambda *a: None)\n"
    try:
        outcome, retire, _ = _sandboxed(eng, tmp_path, "sig", source)
        assert (outcome["status"], retire) == ("COMPLETED", None) and eng.reset_pending
        assert signal.getsignal(signal.SIGUSR1) is before  # before the answer, not after it
        assert eng.finish_request() == (None, None)
    finally:
        signal.signal(signal.SIGUSR1, before)


def test_sandbox_check_that_cannot_run_retires(setup, tmp_path, monkeypatch) -> None:
    backend, _ = setup
    eng = backend.engine_under_test

    def fail(self: Any, workspace: str) -> None:
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(engine_module.SandboxState, "clean_and_check_process", fail)
    outcome, retire, detail = _sandboxed(eng, tmp_path, "fail", "def f():\n    return 1\n")
    assert (outcome["status"], retire) == ("COMPLETED", "sandbox_cleanup")
    assert detail == "sandbox checks failed: OSError: [Errno 24] Too many open files"
    assert not eng.reset_pending


def test_release_failure_is_a_runtime_error_and_keeps_the_lease(tmp_path, monkeypatch) -> None:
    from kcoral_runtime.lease import Lease

    class Channel:
        sock = None

    backend = FakeGpu()
    lease = Lease(Channel(), backend)  # type: ignore[arg-type]
    lease.held = True
    backend.prepare_release = lambda: (_ for _ in ()).throw(RuntimeError("CUDA error: x"))  # type: ignore
    with pytest.raises(ExecutionError) as info:
        lease.release()
    assert (info.value.kind, info.value.message) == ("runtime", "RuntimeError: CUDA error: x")
    assert lease.held


def test_gpu_backend_cpu_only_needs_the_guard() -> None:
    backend = GpuBackend({})
    with pytest.raises(ExecutionError) as info:
        backend.run_cpu_only(lambda: 1, [])
    assert (info.value.kind, info.value.message) == ("unavailable", CPU_ONLY_UNAVAILABLE)

    entered: List[str] = []

    @contextlib.contextmanager
    def guard() -> Iterator[None]:
        entered.append("in")
        yield
        entered.append("out")

    devices.set_cpu_only_guard(guard)
    try:
        assert backend.run_cpu_only(lambda a, b: a + b, [2, 3]) == 5
    finally:
        devices.set_cpu_only_guard(None)
    assert entered == ["in", "out"]


@pytest.mark.parametrize(
    "spec, expected",
    [(None, ["sim-0", "sim-1", "sim-2"]), ("sim-2,sim-0", ["sim-2", "sim-0"]), ("1", ["sim-1"]),
     (" sim-1 , ", ["sim-1"])],
)
def test_visible_sim_devices(spec, expected) -> None:
    assert devices.visible_sim_devices(spec, 3) == expected


def test_target_and_uuid_helpers() -> None:
    assert devices.arch_of(9, 0) == ("sm_90a", "9.0a")
    assert devices.arch_of(10, 0) == ("sm_100a", "10.0a")
    assert devices.arch_of(7, 5) == ("sm_75", "7.5")
    assert devices.format_uuid("e9e6f259-ea96") == "GPU-e9e6f259-ea96"
    assert devices.format_uuid("GPU-e9e6f259") == "GPU-e9e6f259"
    import importlib.metadata

    try:
        expected = {"tvm_ffi": importlib.metadata.version("apache-tvm-ffi")}
    except importlib.metadata.PackageNotFoundError:
        expected = {}
    assert devices.collect_versions("cpu") == expected


def test_sandbox_state_drops_workspace_modules_new_or_replacing(tmp_path) -> None:
    import sys
    import types

    from kcoral_runtime.leak_checks import SandboxState

    work = tmp_path / "ws"
    work.mkdir()
    state = SandboxState()
    assert state.clean_and_check_process(str(work)) is None  # nothing changed: the quick path
    kept_json = sys.modules["json"]
    new = types.ModuleType("kc_new")
    new.__file__ = str(work / "kc_new.py")
    replacing = types.ModuleType("json")
    replacing.__file__ = str(work / "json.py")
    elsewhere = types.ModuleType("kc_elsewhere")  # new, but not from the workspace: kept
    elsewhere.__file__ = str(tmp_path / "kc_elsewhere.py")
    try:
        sys.modules["json"] = replacing  # alone: as many modules as before, one replaced
        assert state.clean_and_check_process(str(work)) is None
        assert "json" not in sys.modules
        sys.modules.update(kc_new=new, json=replacing, kc_elsewhere=elsewhere)
        assert state.clean_and_check_process(str(work)) is None
        assert "kc_new" not in sys.modules and "json" not in sys.modules
        assert sys.modules["kc_elsewhere"] is elsewhere
    finally:
        sys.modules["json"] = kept_json
        sys.modules.pop("kc_new", None)
        sys.modules.pop("kc_elsewhere", None)


def test_sandbox_state_drops_modules_imported_through_a_link_into_the_workspace(
    tmp_path, monkeypatch
) -> None:
    """In a sandbox ``/tmp`` leads to ``/work/.kcoral/tmp``: a module imported from ``/tmp``
    is the workspace's, and the next request (another workspace) must not find it."""
    import sys
    import types

    from kcoral_runtime import leak_checks

    work = tmp_path / "ws"
    (work / ".kcoral" / "tmp").mkdir(parents=True)
    alias = tmp_path / "tmp-link"
    alias.symlink_to(work / ".kcoral" / "tmp")
    monkeypatch.setattr(leak_checks, "WORKSPACE_ALIASES", (str(alias),))
    monkeypatch.setattr(leak_checks, "_SPELLINGS", {})
    state = leak_checks.SandboxState()
    module = types.ModuleType("kc_via_link")
    module.__file__ = str(alias / "kc_via_link.py")
    sys.modules["kc_via_link"] = module
    sys.path_importer_cache[str(alias)] = None
    try:
        assert state.clean_and_check_process(str(work)) is None
        assert "kc_via_link" not in sys.modules
        assert str(alias) not in sys.path_importer_cache
    finally:
        sys.modules.pop("kc_via_link", None)
        sys.path_importer_cache.pop(str(alias), None)


def test_sandbox_mapping_check_reads_names_only_for_ranges_it_does_not_know(
    tmp_path, monkeypatch
) -> None:
    """``/proc/self/maps`` (a path per mapping) is read only when a file-backed range exists
    that was neither there before any program nor a library's from outside the workspace."""
    import ctypes
    import mmap
    import subprocess

    from kcoral_runtime import leak_checks

    from _doubles import c_compiler

    monkeypatch.setattr(leak_checks, "KNOWN_RANGES", set())
    monkeypatch.setattr(leak_checks, "_FIRST_MAPPINGS_LEARNED", [])
    reads: List[bool] = []
    real = leak_checks.mapped_under

    def counted(*args: Any, **kwargs: Any) -> Any:
        reads.append(True)
        return real(*args, **kwargs)

    monkeypatch.setattr(leak_checks, "mapped_under", counted)
    work = tmp_path / "ws"
    work.mkdir()
    state = leak_checks.SandboxState()  # the first snapshot: what is mapped now is known
    assert leak_checks.file_mapping_ranges() <= leak_checks.KNOWN_RANGES
    assert state.clean_and_check(str(work)) is None and len(reads) == 0

    def mapped(path: Path) -> mmap.mmap:
        path.write_bytes(bytes(4096))
        with open(path, "r+b") as fh:
            return mmap.mmap(fh.fileno(), 4096)

    inside = mapped(work / "kept.bin")
    try:
        detail = state.clean_and_check(str(work))
        assert detail is not None and "kept.bin" in detail and len(reads) == 1
    finally:
        inside.close()
    outside = mapped(tmp_path / "data.bin")  # a data file outside: fine, but never learned
    try:
        assert state.clean_and_check(str(work)) is None and len(reads) == 2
        assert state.clean_and_check(str(work)) is None and len(reads) == 3
    finally:
        outside.close()
    source = tmp_path / "kc_lib.c"
    source.write_text("int kc_lib_answer(void) { return 42; }\n")
    subprocess.run([c_compiler(), "-shared", "-fPIC", str(source), "-o", str(tmp_path / "kc.so")],
                   check=True)
    assert ctypes.CDLL(str(tmp_path / "kc.so")).kc_lib_answer() == 42  # a library, outside
    assert state.clean_and_check(str(work)) is None and len(reads) == 4  # read once, learned
    assert state.clean_and_check(str(work)) is None and len(reads) == 4
    monkeypatch.setattr(leak_checks, "file_mapping_ranges", lambda: None)  # cannot be listed
    assert state.clean_and_check(str(work)) is None and len(reads) == 5


def test_sandbox_state_invalidates_import_caches_only_after_imports(tmp_path, monkeypatch) -> None:
    import importlib
    import sys
    import types

    from kcoral_runtime.leak_checks import SandboxState

    work = tmp_path / "ws"
    work.mkdir()
    calls: List[bool] = []
    real = importlib.invalidate_caches
    monkeypatch.setattr(importlib, "invalidate_caches", lambda: (calls.append(True), real()))
    state = SandboxState()
    sys.path_importer_cache[str(work)] = None  # the workspace's own finder: dropped, no more
    assert state.clean_and_check_process(str(work)) is None and calls == []
    elsewhere = str(tmp_path / "elsewhere")
    sys.path_importer_cache[elsewhere] = None  # a directory looked in for the first time
    try:
        assert state.clean_and_check_process(str(work)) is None and calls == [True]
    finally:
        sys.path_importer_cache.pop(elsewhere, None)
    sys.modules["kc_added"] = types.ModuleType("kc_added")  # a module added
    try:
        assert state.clean_and_check_process(str(work)) is None and calls == [True, True]
    finally:
        sys.modules.pop("kc_added", None)


def test_sandbox_mapped_file_retires_right_after_the_answer_under_the_lease(
    ordered, tmp_path
) -> None:
    """A workspace file still mapped is found after the answer (the seat is busy until then),
    also once the server has emptied the workspace; the child retires under the lease."""
    eng, log = ordered
    # Mapped through the C library with the descriptor closed (Python's mmap keeps a
    # descriptor of its own, which the descriptor check would find before the answer).
    leak = ("import builtins, ctypes, os\n"
            "def f():\n"
            "    with open('mapped.bin', 'wb') as fh:\n"
            "        fh.write(bytes(4096))\n"
            "    fd = os.open('mapped.bin', os.O_RDONLY)\n"
            "    libc = ctypes.CDLL(None)\n"
            "    libc.mmap.restype = ctypes.c_void_p\n"
            "    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,\n"
            "                         ctypes.c_int, ctypes.c_int, ctypes.c_long]\n"
            "    builtins._kcoral_test_map = libc.mmap(None, 4096, 1, 1, fd, 0)\n"
            "    os.close(fd)\n")
    try:
        detail = _leak_found_after_the_answer(eng, log, tmp_path, "map", leak, "mapped.bin")
        assert "workspace files still mapped" in detail and "mapped.bin" in detail
    finally:
        import builtins
        import ctypes

        libc = ctypes.CDLL(None)
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.munmap(getattr(builtins, "_kcoral_test_map"), 4096)
        del builtins._kcoral_test_map  # type: ignore[attr-defined]


def test_sandbox_descriptor_check_reads_targets_only_for_descriptors_it_does_not_know(
    tmp_path, monkeypatch
) -> None:
    """A pipe's target is read once and then known by its identity; a regular file's is read
    every time; a workspace file put on a known number (``dup2``) or a workspace FIFO is found."""
    from kcoral_runtime import leak_checks

    monkeypatch.setattr(leak_checks, "KNOWN_DESCRIPTORS", {})
    reads: List[str] = []
    real = os.readlink

    def counted(path: Any, *args: Any, **kwargs: Any) -> Any:
        reads.append(str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(os, "readlink", counted)
    work = tmp_path / "ws"
    work.mkdir()
    r, w = os.pipe()
    outside = open(tmp_path / "outside.txt", "w")
    fifo = work / "queue"
    os.mkfifo(fifo)
    try:
        assert leak_checks.workspace_descriptors(str(work)) == []
        assert f"/proc/self/fd/{r}" in reads and f"/proc/self/fd/{outside.fileno()}" in reads
        assert r in leak_checks.KNOWN_DESCRIPTORS and outside.fileno() not in leak_checks.KNOWN_DESCRIPTORS
        reads.clear()
        assert leak_checks.workspace_descriptors(str(work)) == []
        assert f"/proc/self/fd/{r}" not in reads  # known: not read again
        assert f"/proc/self/fd/{outside.fileno()}" in reads  # a regular file: always read
        with open(work / "kept.bin", "w") as inside:
            os.dup2(inside.fileno(), r)  # a workspace file on the known number
        found = leak_checks.workspace_descriptors(str(work))
        assert found == [f"{r} -> {work / 'kept.bin'}"]
        os.close(r)
        r = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        found = leak_checks.workspace_descriptors(str(work))
        assert found == [f"{r} -> {fifo}"]
        info = os.fstat(r)
        assert leak_checks.KNOWN_DESCRIPTORS.get(r) != (info.st_dev, info.st_ino)  # never learned
    finally:
        os.close(r)
        os.close(w)
        outside.close()


def test_kept_returns_are_reported_apart_from_the_parts(setup) -> None:
    _, execute = setup
    source = "def f():\n    return b'x' * 64, b'y'\n"
    program = [
        {"op": "upload", "kind": "module", "id": "m", "source": source},
        {"op": "get_function", "id": "g", "module": {"$ref": "m"}, "name": "f"},
        {"op": "run", "id": "r", "fn": {"$ref": "g"}},
        {"op": "return", "key": "r", "value": {"$ref": "r"}},
    ]
    outcome, _, _ = execute(program, keep_min_bytes=16, keep_max_bytes=1 << 20)
    node = json.loads(outcome["results"])["r"]["value"]
    assert node[0]["type"] == "kept" and node[0]["size"] == 64
    assert node[1]["type"] == "bytes" and node[1]["part"] == "return:0"
    assert [k["size"] for k in outcome["kept"]] == [64] and len(outcome["parts"]) == 1
    assert node[0]["sha256"] == outcome["kept"][0]["placeholder"]  # the server's to fill
    assert Path(outcome["kept"][0]["path"]).read_bytes() == b"x" * 64
    # Without the request's keep_min_bytes nothing is kept.
    outcome, _, _ = execute(program)
    assert "kept" not in outcome and len(outcome["parts"]) == 2
