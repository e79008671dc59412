"""A worker whose context ``init`` deferred (``"context": false``, issue 41 item 4).

Its GPU backend learns the devices from the driver API without a context (a stand-in
``libcuda``, fixtures/gate/fake_libcuda.c, answers the queries), and the engine creates the
context under the lease at the first instruction that takes it; a ``kcoral run`` tool's run, file
and bytes uploads, path returns and the drain never create it, and a ``cpu_only`` run creates it
first. A simulated-GPU zygote with the gate shows it on the frames: a deferred worker's script
request asks for the lease only through its processes, and not for a drain.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest

from conftest import ZygoteProcess
from _doubles import RecordingLease, c_compiler
from test_gate import PRELUDE, Scene, _NoGate, builds, completed, run_serving, tool_program  # noqa: F401

from kcoral_runtime import cuda_driver, devices, engine as engine_module
from kcoral_runtime.builtins import ARCH_ENV
from kcoral_runtime.devices import GpuBackend, SimBackend, format_uuid
from kcoral_runtime.engine import Engine

FAKE_DRIVER = Path(__file__).resolve().parent / "fixtures" / "gate" / "fake_libcuda.c"


# --------------------------------------------------------------------------- the GPU backend


@pytest.fixture(scope="module")
def fake_driver(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("driver") / "libcuda.so.1"
    proc = subprocess.run([c_compiler(), "-shared", "-fPIC", "-Wall", "-Werror", str(FAKE_DRIVER),
                           "-o", str(out), "-ldl", "-lpthread"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return str(out)


@pytest.fixture
def gpu_backend(fake_driver, tmp_path, monkeypatch):
    """A GPU backend over the stand-in driver (2 devices of compute capability 9.0) whose torch
    must not initialise CUDA; its eager context creation is recorded, not run."""
    monkeypatch.setattr(cuda_driver, "LIBRARY", fake_driver)
    monkeypatch.setenv("FAKE_CUDA_DEVICES", "2")
    monkeypatch.setenv("FAKE_CUDA_CAPABILITY", "9.0")
    monkeypatch.setenv("FAKE_CUDA_LOG", str(tmp_path / "driver.log"))
    for name in ("TVM_FFI_CUDA_ARCH_LIST", ARCH_ENV):
        monkeypatch.delenv(name, raising=False)
    backend = GpuBackend({})

    def torch_cuda_init() -> None:
        raise AssertionError("torch initialised CUDA")

    monkeypatch.setattr(backend.torch.cuda, "init", torch_cuda_init)
    created: List[str] = []

    def create() -> Tuple[Dict[str, str], List[str]]:
        created.append("context")
        return {"arch": "eager"}, ["GPU-eager"]

    monkeypatch.setattr(backend, "_create_context", create)
    backend.created = created
    return backend


def _driver_log(tmp_path: Path) -> List[str]:
    log = tmp_path / "driver.log"
    return [line.split()[0] for line in log.read_text().splitlines()] if log.exists() else []


def test_deferred_init_reads_the_devices_from_the_driver(gpu_backend, tmp_path) -> None:
    gpu_backend.prepare()
    target, uuids = gpu_backend.init(context=False)
    assert target == {"arch": "sm_90a"}
    assert os.environ[ARCH_ENV] == "sm_90a" and os.environ["TVM_FFI_CUDA_ARCH_LIST"] == "9.0a"
    raw = [bytes((d << 4) | k for k in range(16)) for d in range(2)]
    # As torch's device properties print a UUID, after "GPU-".
    assert uuids == [format_uuid(str(uuid.UUID(bytes=b))) for b in raw]
    assert uuids[0] == "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f"
    assert gpu_backend.context_pending and gpu_backend.created == []
    assert _driver_log(tmp_path) == ["init"]  # cuInit only: no context, no GPU use


def test_nothing_touches_cuda_until_the_context_exists(gpu_backend, monkeypatch) -> None:
    gpu_backend.prepare()
    gpu_backend.init(context=False)

    def no_cudart(torch: Any) -> None:
        raise AssertionError("libcudart asked for its last error")

    monkeypatch.setattr(devices._CudaErrors, "load", no_cudart)
    gpu_backend._cudart = None
    gpu_backend.synchronize()
    gpu_backend.empty_cache()
    gpu_backend.prepare_release()
    assert gpu_backend.take_last_error() is None
    assert gpu_backend.created == []
    gpu_backend.ensure_context()
    gpu_backend.ensure_context()
    assert gpu_backend.created == ["context"] and not gpu_backend.context_pending


def test_init_creates_the_context_unless_deferred(gpu_backend) -> None:
    gpu_backend.prepare()
    assert gpu_backend.init() == ({"arch": "eager"}, ["GPU-eager"])
    assert gpu_backend.created == ["context"] and not gpu_backend.context_pending


def test_without_an_initialised_driver_the_context_is_not_deferred(gpu_backend, tmp_path,
                                                                   monkeypatch) -> None:
    # The gate names its library in CUDA_INJECTION64_PATH after init: a driver first initialised
    # later would load it into the worker itself. No driver here: init creates the context (and
    # with a real driver fails as torch reports it).
    monkeypatch.setattr(cuda_driver, "LIBRARY", str(tmp_path / "missing" / "libcuda.so.1"))
    gpu_backend.prepare()
    assert gpu_backend.init(context=False) == ({"arch": "eager"}, ["GPU-eager"])
    assert gpu_backend.created == ["context"] and not gpu_backend.context_pending


def test_simulated_context_is_recorded() -> None:
    eager = SimBackend({}, 1)
    eager.init()
    assert eager.contexts_created == 1 and not eager.context_pending
    deferred = SimBackend({}, 1)
    assert deferred.init(context=False) == ({"arch": "simulated"}, ["sim-0"])
    assert deferred.contexts_created == 0 and deferred.context_pending
    deferred.ensure_context()
    deferred.ensure_context()
    assert deferred.contexts_created == 1 and not deferred.context_pending


# --------------------------------------------------------------------------- the engine


class _LoggedSim(SimBackend):
    """Simulated devices whose context creation is written into the lease's log."""

    def __init__(self, log: List[str]) -> None:
        super().__init__({}, 1)
        self.log = log

    def ensure_context(self) -> None:
        if self.context_pending:
            self.log.append("context")
        super().ensure_context()


@pytest.fixture
def deferred(monkeypatch, tmp_path):
    """``(engine, backend, log, execute)``: an engine with the gate over a context-less worker."""
    monkeypatch.setattr(engine_module, "kill_leftover_processes", lambda: False)
    log: List[str] = []
    backend = _LoggedSim(log)
    backend.init(context=False)
    eng = Engine(backend, RecordingLease(log), lambda i: log.append(f"instr {i}"), _NoGate())

    def execute(req: Dict[str, Any], last: bool = True) -> Tuple[Dict[str, Any], List[str]]:
        del log[:]
        outcome, _, _ = eng.execute(req, last)
        eng.lease.request_done()
        return outcome, list(log)

    return eng, backend, log, execute


def _with(req: Dict[str, Any], make_request, blob: str, before: List[Dict[str, Any]] = (),
          after: List[Dict[str, Any]] = ()) -> Dict[str, Any]:
    """``req`` with instructions before and after its own, and ``blob`` given to the worker."""
    program = json.loads(req["program"])
    program["instructions"] = [*before, *program["instructions"], *after]
    blobs = {**req["blobs"], blob: str(make_request.blob_dir / blob)}
    return {**req, "program": json.dumps(program), "blobs": blobs}


def test_a_tool_run_file_upload_and_path_return_create_no_context(deferred, make_request,
                                                                   kc) -> None:
    _, backend, _, execute = deferred
    blob = make_request.blob(b"data")
    req = _with(tool_program(make_request, kc, "shell", ["true"], {}, {}), make_request, blob,
                before=[kc.upload_blob("f", "file", blob, path="in.txt")],
                after=[kc.ret_path("copy", "file", "in.txt")])
    outcome, log = execute(req)
    completed(outcome)
    # No lease, no context: neither the tool's instructions, the file, the path nor the drain.
    assert log == [f"instr {i}" for i in range(9)], log
    assert backend.context_pending and backend.contexts_created == 0


def test_the_first_instruction_that_takes_the_lease_creates_it(deferred, make_request,
                                                               kc) -> None:
    _, backend, _, execute = deferred
    blob = make_request.blob(b"data")
    req = make_request([kc.upload_blob("b", "bytes", blob), *kc.call("def main():\n    return 2\n")],
                       blobs=[blob])
    outcome, log = execute(req)
    assert outcome["status"] == "COMPLETED", outcome["error"]
    assert log == ["instr 0", "instr 1", "acquire", "context", "instr 2", "instr 3", "instr 4"]
    assert backend.contexts_created == 1


def test_a_cpu_only_run_creates_it_under_the_lease_first(deferred, make_request, kc) -> None:
    _, backend, _, execute = deferred
    req = tool_program(make_request, kc, "shell", ["true"], {}, {})
    program = json.loads(req["program"])
    program["instructions"][1]["cpu_only"] = True  # the runner's run: cpu_only, not gated
    req["program"] = json.dumps(program)
    outcome, log = execute(req)
    completed(outcome)
    run_at = log.index("instr 5")
    assert log[run_at:run_at + 4] == ["instr 5", "acquire", "context", "release"], log
    assert "context" not in log[:run_at] and backend.contexts_created == 1


def test_a_guarded_tool_run_creates_it_under_the_lease_first(deferred, make_request, kc) -> None:
    """A tool run that is not the worker's first request runs under the CUDA guard, which needs
    the context."""
    _, backend, _, execute = deferred
    blob = make_request.blob(b"data")
    outcome, log = execute(make_request([kc.upload_blob("b", "bytes", blob)], blobs=[blob]),
                           last=False)
    assert outcome["status"] == "COMPLETED" and log == ["instr 0"], (outcome, log)
    outcome, log = execute(tool_program(make_request, kc, "shell", ["true"], {}, {}))
    completed(outcome)
    run_at = log.index("instr 5")
    assert log[run_at:run_at + 4] == ["instr 5", "acquire", "context", "release"], log
    assert backend.contexts_created == 1


def test_a_failed_program_s_drain_creates_no_context(deferred, make_request, kc) -> None:
    _, backend, _, execute = deferred
    blob = make_request.blob(b"data")
    req = make_request([kc.upload_blob("b", "bytes", blob), kc.ret_path("x", "file", "absent")],
                       blobs=[blob])
    outcome, log = execute(req)
    assert outcome["status"] == "FAILED"
    assert log == ["instr 0", "instr 1"] and backend.context_pending


# --------------------------------------------------------------------------- frames


@pytest.fixture(scope="module")
def gated_zygote(builds):
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


def _fresh_child(zygote: ZygoteProcess, context: Optional[bool]):
    handle = zygote.child(max_requests=1, init=False)
    start = zygote.mark()
    frame: Dict[str, Any] = {"t": "init", "c": handle.c}
    if context is not None:
        frame["context"] = context
    zygote.send(frame)
    handle.ready = zygote.wait(
        lambda f: f.get("c") == handle.c and f["t"] in ("ready", "init_failed", "exited"),
        start=start)
    assert handle.ready["t"] == "ready", handle.ready
    return handle


def test_ready_says_whether_the_context_was_deferred(gated_zygote) -> None:
    eager = _fresh_child(gated_zygote, None)
    deferred = _fresh_child(gated_zygote, False)
    assert eager.ready["context"] == "created" and deferred.ready["context"] == "deferred"
    for key in ("target", "device_uuids", "versions"):
        assert deferred.ready[key] == eager.ready[key]
    eager.kill()
    deferred.kill()


def test_a_deferred_worker_s_script_takes_the_lease_only_through_its_process(
        gated_zygote, make_request, kc, tmp_path, builds) -> None:
    scene = Scene(tmp_path, builds)
    script = PRELUDE + 'mark("started")\ngpu()\nmark("done")\n'
    req = tool_program(make_request, kc, "python", ["script.py"], scene.env, {"script.py": script})
    child = _fresh_child(gated_zygote, False)
    outcome, seen, _ = run_serving(gated_zygote, child, req)
    completed(outcome)
    # The process's hold, and no drain after it (the worker has no context to drain or tear
    # down); the hold ends with the outcome when the gate had not yet seen the process's exit.
    assert seen in (["acquire", "release", "outcome"], ["acquire", "outcome"]), seen
    assert child.wait_exited()["code"] == 0


def test_a_deferred_worker_s_cpu_only_script_never_takes_the_lease(
        gated_zygote, make_request, kc, tmp_path, builds) -> None:
    scene = Scene(tmp_path, builds)
    script = PRELUDE + 'mark("done")\n'
    req = tool_program(make_request, kc, "python", ["script.py"], scene.env, {"script.py": script})
    child = _fresh_child(gated_zygote, False)
    outcome, seen, _ = run_serving(gated_zygote, child, req)
    completed(outcome)
    assert seen == ["outcome"], seen
    assert scene.has("done") and scene.driver_events() == []


def test_a_deferred_worker_runs_a_program_that_takes_the_lease(gated_zygote, make_request,
                                                               kc) -> None:
    child = _fresh_child(gated_zygote, False)
    req = make_request(kc.call("def main():\n    return 3\n"))
    outcome, seen, _ = run_serving(gated_zygote, child, req)
    assert outcome["status"] == "COMPLETED", outcome["error"]
    assert json.loads(outcome["results"])["r"]["value"] == 3
    assert seen == ["acquire", "outcome"], seen
