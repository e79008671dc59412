"""Issue 7 wiring: library uploads through the plain C ABI in real zygote children (CPU and
simulated-GPU modes), the memo and sandbox dlclose, and the cpu_only guard's installation and
use by a GPU backend (in process, with the stand-in libcupti of test_cuda_guard)."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import gc
import json
import os
import socket
import struct
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Dict, Iterator, List, Optional, Tuple

import pytest

from kcoral_runtime import child as child_module
from kcoral_runtime import cabi, cuda_guard, devices, libraries, progress
from kcoral_runtime import engine as engine_module
from kcoral_runtime.devices import GpuBackend

from _doubles import FIXTURES, RecordingLease, build_fake_cupti, c_compiler
from kcoral_runtime.engine import Engine
from kcoral_runtime.errors import ExecutionError
from kcoral_runtime.ipc import FrameSocket

C_ABI = {"KCORAL_LIBRARY_ABI": "c"}  # the plain C ABI even where tvm_ffi is installed


def _build(source: Path, out: Path, *extra: str) -> bytes:
    cmd = [c_compiler(), "-shared", "-fPIC", "-O1", "-std=c11", "-Wall", "-Werror", f"-I{FIXTURES}",
           *extra, str(source), "-o", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stdout}{proc.stderr}"
    return out.read_bytes()


@pytest.fixture(scope="module")
def wiring_so(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    data = _build(FIXTURES / "wiring.c", tmp_path_factory.mktemp("wiring") / "libwiring.so")
    assert data[:4] == b"\x7fELF"
    return data


@pytest.fixture(scope="module")
def unresolved_so(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return _build(FIXTURES / "unresolved.c", tmp_path_factory.mktemp("unres") / "libunres.so")


# --------------------------------------------------------------------------- through a zygote

NUMPY_SOURCE = """\
import numpy

def make():
    return numpy.arange(6, dtype=numpy.float32).reshape(2, 3)

def view(x):
    return x[:, ::2]  # a strided view: the C function sees strides (3, 2)

def values(x):
    return x.tolist()

def counter():
    return numpy.zeros(1, dtype=numpy.int64)

def first(x):
    return int(x[0])
"""

TORCH_SOURCE = """\
import torch

def make():
    return torch.arange(6, dtype=torch.float32).reshape(2, 3)

def view(x):
    return x[:, ::2]

def values(x):
    return x.tolist()

def counter():
    return torch.zeros(1, dtype=torch.int64)

def first(x):
    return int(x[0])
"""


def scale_program(kc: SimpleNamespace, lib_sha: str, source: str, cpu_only: bool = False) -> List[Dict[str, Any]]:
    return [
        kc.upload_blob("lib", "library", lib_sha),
        kc.get_function("scale", "lib", "scale", cpu_only=cpu_only or None),
        kc.module("m", source),
        kc.get_function("make", "m", "make"),
        kc.get_function("view", "m", "view"),
        kc.get_function("values", "m", "values"),
        kc.run("x", "make"),
        kc.run("v", "view", kc.ref("x")),
        kc.run("r", "scale", kc.ref("v"), 2.5),  # in place, through the view
        kc.run("out", "values", kc.ref("x")),
        kc.ret("r", "r"),
        kc.ret("x", "out"),
    ]


SCALED = [[0.0, 1.0, 5.0], [7.5, 4.0, 12.5]]  # columns 0 and 2 times 2.5


def numbers(node: Dict[str, Any]) -> Any:
    if node["type"] == "array":
        return [numbers(n) for n in node["value"]]
    return node["value"]


@pytest.fixture(params=["cpu", "sim"])
def mode_child(request, cpu_zygote, sim_zygote):
    zygote = cpu_zygote if request.param == "cpu" else sim_zygote
    handle = zygote.child(env=C_ABI, max_requests=0)
    assert handle.ready["t"] == "ready", handle.ready
    yield SimpleNamespace(mode=request.param, handle=handle,
                          source=NUMPY_SOURCE if request.param == "cpu" else TORCH_SOURCE)
    handle.kill()


def test_library_upload_get_function_run(mode_child, make_request, kc, wiring_so) -> None:
    lib = make_request.blob(wiring_so)
    r = mode_child.handle.run(make_request(scale_program(kc, lib, mode_child.source), blobs=[lib]))
    assert r.outcome["status"] == "COMPLETED", r.outcome["error"]
    assert r.results["r"] == {"type": "null"}
    assert numbers(r.results["x"]) == SCALED
    if mode_child.mode == "sim":  # library upload and get_function acquire, like any GPU op
        kinds = [f["a"] for f in r.frames if f["t"] == "lease"]
        assert kinds[:1] == ["acquire"]  # which instruction took it: the in-process test below


def test_uploaded_sim_tensor_is_a_cpu_dltensor(sim_zygote, make_request, kc, wiring_so) -> None:
    """In sim mode an uploaded tensor is a torch CPU tensor: the C function gets {kDLCPU, 0}."""
    handle = sim_zygote.child(env=C_ABI, max_requests=1)
    lib = make_request.blob(wiring_so)
    data = make_request.blob(struct.pack("<4f", 1, 2, 3, 4))
    instructions = [
        kc.upload_blob("lib", "library", lib),
        kc.get_function("scale", "lib", "scale"),
        kc.upload_blob("t", "tensor", data, dtype="float32", shape=[4]),
        kc.run("r", "scale", kc.ref("t"), -1.0),
        kc.ret("t", "t"),
    ]
    r = handle.run(make_request(instructions, blobs=[lib, data]))
    assert r.outcome["status"] == "COMPLETED", r.outcome["error"]
    assert Path(r.outcome["parts"][0]["path"]).read_bytes() == struct.pack("<4f", -1, -2, -3, -4)


def test_missing_symbol_is_compile_naming_it(mode_child, make_request, kc, wiring_so) -> None:
    lib = make_request.blob(wiring_so)
    instructions = [kc.upload_blob("lib", "library", lib), kc.get_function("f", "lib", "no_such_fn")]
    r = mode_child.handle.run(make_request(instructions, blobs=[lib]))
    error = r.outcome["error"]
    assert (error["kind"], error["message"]) == ("compile", "library exports no function 'no_such_fn'")
    assert (error["instruction_index"], error["instruction_op"], error["instruction_id"]) == (
        1, "get_function", "f")
    assert r.retire is None


@pytest.mark.parametrize("blob", [b"this is not an ELF file\n", b"\x7fELF" + b"\0" * 60, b""])
def test_non_elf_blob_is_compile(mode_child, make_request, kc, blob) -> None:
    sha = make_request.blob(blob)
    r = mode_child.handle.run(make_request([kc.upload_blob("lib", "library", sha)], blobs=[sha]))
    error = r.outcome["error"]
    assert error["kind"] == "compile", error
    assert error["message"].startswith("cannot load library: "), error["message"]
    assert (error["instruction_index"], error["instruction_op"], error["instruction_id"]) == (
        0, "upload", "lib")
    assert r.retire is None


def test_unresolved_symbol_is_compile_at_upload(cpu_zygote, make_request, kc, unresolved_so) -> None:
    handle = cpu_zygote.child(env=C_ABI, max_requests=1)
    sha = make_request.blob(unresolved_so)
    r = handle.run(make_request([kc.upload_blob("lib", "library", sha)], blobs=[sha]))
    error = r.outcome["error"]
    assert error["kind"] == "compile" and "undefined symbol" in error["message"], error


def test_nonzero_return_is_runtime_with_library_text(mode_child, make_request, kc, wiring_so) -> None:
    lib = make_request.blob(wiring_so)
    instructions = [kc.upload_blob("lib", "library", lib), kc.get_function("f", "lib", "fail_with"),
                    kc.run("r", "f", "the kernel said no", 7)]
    r = mode_child.handle.run(make_request(instructions, blobs=[lib]))
    assert (r.outcome["error"]["kind"], r.outcome["error"]["message"]) == ("runtime", "the kernel said no")
    instructions[-1] = kc.run("r", "f", "", 7)
    r = mode_child.handle.run(make_request(instructions, blobs=[lib]))
    assert r.outcome["error"]["message"] == "'fail_with' returned 7"
    instructions[-1] = kc.run("r", "f", {"not": "passable"}, 7)
    r = mode_child.handle.run(make_request(instructions, blobs=[lib]))
    assert r.outcome["error"]["kind"] == "runtime"
    assert r.outcome["error"]["message"].startswith(
        "argument 0 of 'fail_with': cannot pass a value of type builtins.dict through the C ABI")


def test_cpu_only_library_and_module_functions_run_directly(mode_child, make_request, kc, wiring_so) -> None:
    lib = make_request.blob(wiring_so)
    r = mode_child.handle.run(
        make_request(scale_program(kc, lib, mode_child.source, cpu_only=True), blobs=[lib]))
    assert r.outcome["status"] == "COMPLETED", r.outcome["error"]
    assert numbers(r.results["x"]) == SCALED
    if mode_child.mode == "sim":  # the cpu_only run dropped the lease first (in-process test below)
        assert "release" in [f["a"] for f in r.frames if f["t"] == "lease"]


def counter_program(kc: SimpleNamespace, lib: str, source: str) -> List[Dict[str, Any]]:
    return [
        kc.upload_blob("lib", "library", lib),
        kc.get_function("count", "lib", "count_calls"),
        kc.module("m", source),
        kc.get_function("counter", "m", "counter"),
        kc.get_function("first", "m", "first"),
        kc.run("c", "counter"),
        kc.run("r", "count", kc.ref("c")),
        kc.run("n", "first", kc.ref("c")),
        kc.ret("n", "n"),
    ]


def test_memo_reuses_the_loaded_library_and_sandbox_closes_it(
    cpu_zygote, make_request, kc, wiring_so, tmp_path
) -> None:
    handle = cpu_zygote.child(env=C_ABI, max_requests=0)
    lib = make_request.blob(wiring_so)
    program = counter_program(kc, lib, NUMPY_SOURCE)
    work = tmp_path / "sandboxed"
    work.mkdir()
    mapped = ("import os\ndef main():\n    return [l for l in open('/proc/self/maps')"
              " if '.kcoral/libraries' in l or 'kcoral-lib-' in l]\n")
    for _ in range(2):  # sandbox: loaded from the workspace, dlclosed at the end of each request
        r = handle.run(make_request(program, blobs=[lib], workspace=work, sandbox=True))
        assert r.outcome["status"] == "COMPLETED", r.outcome["error"]
        assert r.results["n"]["value"] == 1  # a fresh load: static state starts over
        assert r.retire is None, r.frame  # no mapping of a workspace file survived
        assert os.listdir(work / ".kcoral" / "libraries") == []  # the private copy is gone
    r = handle.run(make_request(kc.call(mapped)))
    assert r.results["r"]["value"] == []  # nothing uploaded is mapped any more

    counts = []
    for _ in range(2):  # not sandboxed: memoized across requests, static state persists
        r = handle.run(make_request(program, blobs=[lib]))
        assert r.retire is None, r.frame
        counts.append(r.results["n"]["value"])
    assert counts == [1, 2]
    r = handle.run(make_request(kc.call(mapped)))
    assert len(r.results["r"]["value"]) >= 1  # the memoized library stays mapped (deleted file)
    handle.kill()


def test_memo_evicts_and_closes_beyond_the_limit(tmp_path, monkeypatch, wiring_so) -> None:
    monkeypatch.setattr(libraries, "MEMO_LIMIT", 2)
    monkeypatch.setenv("KCORAL_LIBRARY_ABI", "c")
    loader = libraries.LibraryLoader()
    blobs = []
    for k in range(3):  # three distinct libraries (same code, different bytes)
        path = tmp_path / f"b{k}"
        path.write_bytes(wiring_so + bytes([k]) * (k + 1))
        blobs.append((str(path), f"{k:064x}"))
    first = loader.load(blobs[0][0], blobs[0][1], False, str(tmp_path))
    assert isinstance(first, cabi.CLibrary) and loader.abi == "c"
    assert loader.load(blobs[0][0], blobs[0][1], False, str(tmp_path)) is first  # memo hit
    fn = first.get_function("scale")
    loader.load(*blobs[1], False, str(tmp_path))
    loader.load(*blobs[2], False, str(tmp_path))
    assert loader.memoized() == [blobs[1][1], blobs[2][1]]
    assert not first.closed  # evicted, but the request may still call it
    loader.end_request(False)
    assert first.closed
    with pytest.raises(ExecutionError) as info:
        fn(None, 1.0)
    assert (info.value.kind, info.value.message) == ("runtime", "the uploaded library was closed")
    again = loader.load(blobs[0][0], blobs[0][1], False, str(tmp_path))
    assert again is not first and not again.closed
    loader.end_request(True)
    assert again.closed and loader.memoized() == []


def test_library_abi_choice(monkeypatch) -> None:
    monkeypatch.setenv("KCORAL_LIBRARY_ABI", "bogus")
    with pytest.raises(ExecutionError) as info:
        libraries.choose_abi()
    assert info.value.kind == "engine" and "KCORAL_LIBRARY_ABI='bogus'" in info.value.message
    monkeypatch.setenv("KCORAL_LIBRARY_ABI", "c")
    assert libraries.choose_abi() == "c"
    monkeypatch.setenv("KCORAL_LIBRARY_ABI", "auto")
    assert libraries.choose_abi() == ("tvm_ffi" if libraries.tvm_ffi_available() else "c")
    monkeypatch.setenv("KCORAL_LIBRARY_ABI", "tvm_ffi")
    loader = libraries.LibraryLoader()
    if libraries._import_tvm_ffi() is None:
        with pytest.raises(ExecutionError) as info:
            loader.load("/nonexistent", "0" * 64, False, "/tmp")
        assert info.value.kind == "unavailable"
    else:
        assert loader.abi == "tvm_ffi"


def test_bad_abi_env_fails_the_upload_in_a_child(cpu_zygote, make_request, kc, wiring_so) -> None:
    handle = cpu_zygote.child(env={"KCORAL_LIBRARY_ABI": "fortran"}, max_requests=1)
    lib = make_request.blob(wiring_so)
    r = handle.run(make_request([kc.upload_blob("lib", "library", lib)], blobs=[lib]))
    assert r.outcome["error"]["kind"] == "engine"
    assert "KCORAL_LIBRARY_ABI='fortran'" in r.outcome["error"]["message"]


# --------------------------------------------------------------------------- the cpu_only guard


def test_install_cpu_only_guard_by_mode() -> None:
    try:
        child_module.install_cpu_only_guard("gpu")
        assert devices.cpu_only_guard_factory() is cuda_guard.cpu_only_guard
        child_module.install_cpu_only_guard("sim")
        assert devices.cpu_only_guard_factory() is None
        child_module.install_cpu_only_guard("gpu")
        child_module.install_cpu_only_guard("cpu")
        assert devices.cpu_only_guard_factory() is None
    finally:
        devices.set_cpu_only_guard(None)


class _FakeCudaBackend:
    """Enough of a GPU backend for Child._init (no CUDA)."""

    uses_lease = True
    torch = None
    tensor_type = None
    context_pending = False

    def __init__(self, mode: str, prepare_error: Optional[BaseException] = None) -> None:
        self.mode = mode
        self.libraries = libraries.LibraryLoader()
        self.reused = False
        self.calls: List[str] = []
        self.prepare_error = prepare_error

    def prepare(self) -> None:
        self.calls.append("prepare")
        if self.prepare_error is not None:
            raise self.prepare_error

    def init(self, context: bool = True) -> Tuple[Dict[str, str], List[str]]:
        self.calls.append("init")
        return {"arch": "sm_90a"}, ["GPU-fake"]


@pytest.mark.parametrize("mode, installed", [("gpu", True), ("sim", False), ("cpu", False)])
def test_child_init_installs_the_guard_after_init(monkeypatch, mode, installed) -> None:
    made: List[str] = []

    def make_backend(m: str, versions: Dict[str, str], sim_devices: int) -> _FakeCudaBackend:
        assert devices.cpu_only_guard_factory() is None  # not before the backend exists
        made.append(m)
        return _FakeCudaBackend(m)

    def no_exit(code: int) -> None:
        raise AssertionError(f"the child would have exited with {code}")

    monkeypatch.setattr(child_module, "make_backend", make_backend)
    monkeypatch.setattr(child_module, "_exit", no_exit)  # never os._exit the test process
    ours, theirs = socket.socketpair()
    try:
        c = child_module.Child(ours, mode, {"v": "1"}, 1, 0, progress.new_page())
        c.prepare()
        c._init()
        gc.unfreeze()
        frame = FrameSocket(theirs).recv()
        assert frame == {"t": "ready", "target": {"arch": "sm_90a"}, "versions": {"v": "1"},
                         "device_uuids": ["GPU-fake"], "context": "created"}
        assert made == [mode]
        factory = devices.cpu_only_guard_factory()
        assert (factory is cuda_guard.cpu_only_guard) if installed else factory is None
    finally:
        devices.set_cpu_only_guard(None)
        ours.close()
        theirs.close()


class _Exited(Exception):
    pass


def test_child_prepares_at_once_and_creates_the_context_only_at_init(monkeypatch) -> None:
    """The lease-free part (driver initialisation) runs before ``init`` arrives; the context
    (``backend.init``) only when it does, with nothing sent in between."""
    made: List[_FakeCudaBackend] = []

    def make_backend(m: str, versions: Dict[str, str], sim_devices: int) -> _FakeCudaBackend:
        made.append(_FakeCudaBackend(m))
        return made[-1]

    monkeypatch.setattr(child_module, "make_backend", make_backend)
    ours, theirs = socket.socketpair()
    try:
        c = child_module.Child(ours, "gpu", {}, 1, 1, progress.new_page())
        c.prepare()
        assert made[0].calls == ["prepare"]
        assert made[0].reused is False  # one request per child: no cached pinned staging
        theirs.setblocking(False)
        with pytest.raises(BlockingIOError):
            theirs.recv(1)  # nothing is said before init
        theirs.setblocking(True)
        c._init()
        gc.unfreeze()
        assert made[0].calls == ["prepare", "init"]
        assert FrameSocket(theirs).recv()["t"] == "ready"
    finally:
        devices.set_cpu_only_guard(None)
        ours.close()
        theirs.close()


def test_a_failed_prepare_is_answered_at_init(monkeypatch) -> None:
    exits: List[int] = []

    def no_exit(code: int) -> None:
        exits.append(code)
        raise _Exited()

    monkeypatch.setattr(
        child_module, "make_backend",
        lambda m, v, n: _FakeCudaBackend(m, RuntimeError("no CUDA device is visible")),
    )
    monkeypatch.setattr(child_module, "_exit", no_exit)
    ours, theirs = socket.socketpair()
    try:
        c = child_module.Child(ours, "gpu", {}, 1, 1, progress.new_page())
        c.prepare()  # does not raise: the server hears of it when it asks for the context
        assert exits == []
        with pytest.raises(_Exited):
            c._init()
        frame = FrameSocket(theirs).recv()
        assert frame["t"] == "init_failed"
        assert frame["message"] == "RuntimeError: no CUDA device is visible"
        assert "no CUDA device is visible" in frame["traceback"]
        assert exits == [1]
    finally:
        ours.close()
        theirs.close()


def test_zygote_never_loads_cupti(cpu_zygote, sim_zygote, make_request, kc) -> None:
    """A child is a copy of its zygote: the guard's CUPTI state there is the zygote's."""
    source = (
        "from kcoral_runtime import cuda_guard as g, devices\n"
        "def main():\n"
        "    return [g._chosen is None, g._cupti_by_path == {}, g._active is None,\n"
        "            devices.cpu_only_guard_factory() is None]\n"
    )
    for zygote in (cpu_zygote, sim_zygote):
        handle = zygote.child(max_requests=1)
        r = handle.run(make_request(kc.call(source)))
        assert [v["value"] for v in r.results["r"]["value"]] == [True, True, True, True], zygote.mode


def test_gpu_backend_sets_the_compile_arch(monkeypatch) -> None:
    calls: List[str] = []

    class Cuda:
        def init(self) -> None:
            calls.append("init")

        def device_count(self) -> int:
            return 1

        def synchronize(self, index: int) -> None:
            pass

        def get_device_capability(self, index: int) -> Tuple[int, int]:
            return (9, 0)

        def get_device_properties(self, index: int) -> Any:
            return SimpleNamespace(uuid="abc")

    fake_torch = SimpleNamespace(cuda=Cuda(), empty=lambda *a, **k: None)
    backend = GpuBackend({})
    backend.torch = fake_torch
    monkeypatch.setattr(devices._CudaErrors, "load", classmethod(lambda cls, torch: None))
    monkeypatch.delenv("KCORAL_CUDA_ARCH", raising=False)
    monkeypatch.delenv("TVM_FFI_CUDA_ARCH_LIST", raising=False)
    assert backend.init() == ({"arch": "sm_90a"}, ["GPU-abc"])
    assert os.environ["KCORAL_CUDA_ARCH"] == "sm_90a"
    assert os.environ["TVM_FFI_CUDA_ARCH_LIST"] == "9.0a"
    monkeypatch.setenv("KCORAL_CUDA_ARCH", "sm_100a")  # an operator's choice wins
    backend.init()
    assert os.environ["KCORAL_CUDA_ARCH"] == "sm_100a"


# In-process engine with a GPU backend whose CUDA parts are inert and the REAL cpu_only guard,
# pointed at the stand-in libcupti (tests/fixtures/cabi/fake_cupti.c; see test_cuda_guard.py).


@pytest.fixture(scope="module")
def fake_cupti(tmp_path_factory: pytest.TempPathFactory) -> str:
    return build_fake_cupti(tmp_path_factory.mktemp("wiringcupti") / "libwiring_fake_cupti.so")


class _InertGpu(GpuBackend):
    def __init__(self) -> None:
        super().__init__({})

    def take_last_error(self) -> Optional[str]:
        return None

    def empty_cache(self) -> None:
        pass

    def prepare_release(self) -> None:
        pass


@pytest.fixture
def gpu_engine(tmp_path: Path, monkeypatch, fake_cupti: str):
    monkeypatch.setattr(engine_module, "kill_leftover_processes", lambda: False)
    log: List[str] = []
    eng = Engine(_InertGpu(), RecordingLease(log), lambda i: log.append(f"instr {i}"))
    eng.snapshot_state()
    devices.set_cpu_only_guard(functools.partial(cuda_guard.cpu_only_guard, fake_cupti))
    fake = ctypes.CDLL(fake_cupti)
    fake.fake_state.argtypes = [ctypes.POINTER(ctypes.c_int)]
    counter = [0]

    def execute(instructions: List[Dict[str, Any]]) -> Tuple[Dict[str, Any], List[str]]:
        counter[0] += 1
        work = tmp_path / f"w{counter[0]}"
        res = tmp_path / f"r{counter[0]}"
        work.mkdir()
        res.mkdir()
        req = {"program": json.dumps({"instructions": instructions}), "blobs": {},
               "workspace": str(work), "results": str(res), "output_limit_bytes": 0,
               "max_return_bytes": 1 << 20, "sandbox": False}
        del log[:]
        outcome, _, _ = eng.execute(req, False)
        eng.lease.request_done()
        return outcome, list(log)

    def subscribed() -> int:
        out = (ctypes.c_int * 6)()
        fake.fake_state(out)
        return out[0]

    yield SimpleNamespace(execute=execute, subscribed=subscribed)
    devices.set_cpu_only_guard(None)
    assert cuda_guard._active is None


def _guarded_program(source: str) -> List[Dict[str, Any]]:
    return [
        {"op": "upload", "kind": "module", "id": "m", "source": source},
        {"op": "get_function", "id": "g", "module": {"$ref": "m"}, "name": "build", "cpu_only": True},
        {"op": "run", "id": "r", "fn": {"$ref": "g"}},
        {"op": "return", "key": "r", "value": {"$ref": "r"}},
    ]


def test_gpu_cpu_only_violation_through_the_engine(gpu_engine, fake_cupti) -> None:
    source = (
        "import ctypes, gc\n"
        f"lib = ctypes.CDLL({fake_cupti!r})\n"
        "lib.fake_api_call.argtypes = [ctypes.c_int, ctypes.c_char_p]\n"
        "def build():\n"
        "    assert not gc.isenabled()  # the cyclic collector pauses during the guard\n"
        "    lib.fake_api_call(2, b'cudaStreamSynchronize')\n"
        "    return 1\n"
    )
    outcome, log = gpu_engine.execute(_guarded_program(source))
    assert log == ["instr 0", "acquire", "instr 1", "instr 2", "release", "acquire"]
    assert outcome["status"] == "FAILED"
    error = outcome["error"]
    assert error["kind"] == "gpu_access"
    assert error["message"].startswith("cpu_only function called cudaStreamSynchronize at <uploaded:")
    assert (error["instruction_index"], error["instruction_op"], error["instruction_id"]) == (2, "run", "r")
    access = outcome["gpu_access"]
    assert set(access) == {"cuda_call", "location", "detected_at_ns"}
    assert access["cuda_call"] == "cudaStreamSynchronize"
    assert access["location"].startswith("<uploaded:") and access["location"].endswith(":6 in build")
    assert isinstance(access["detected_at_ns"], int) and access["detected_at_ns"] > 0
    assert "lib.fake_api_call(2, b'cudaStreamSynchronize')" in error["traceback"]
    assert gc.isenabled() and gpu_engine.subscribed() == 0


def test_gpu_cpu_only_clean_run_completes(gpu_engine) -> None:
    outcome, _ = gpu_engine.execute(_guarded_program("def build():\n    return sum(range(5))\n"))
    assert outcome["status"] == "COMPLETED", outcome["error"]
    assert json.loads(outcome["results"]) == {"r": {"type": "integer", "value": 10}}
    assert outcome["gpu_access"] is None and gpu_engine.subscribed() == 0


def test_gpu_cpu_only_without_cupti_is_unavailable(gpu_engine, tmp_path) -> None:
    devices.set_cpu_only_guard(functools.partial(cuda_guard.cpu_only_guard, str(tmp_path / "nope.so")))
    outcome, _ = gpu_engine.execute(_guarded_program("def build():\n    return 1\n"))
    error = outcome["error"]
    assert error["kind"] == "unavailable"
    assert error["message"].startswith("cpu_only requires the CUPTI guard: cannot load libcupti: ")


def test_a_guard_left_running_by_the_program_is_stopped(gpu_engine, fake_cupti) -> None:
    source = (
        "from kcoral_runtime.cuda_guard import CudaGuard\n"
        "def build():\n"
        f"    CudaGuard({fake_cupti!r}).start()\n"
        "    return 1\n"
    )
    program = _guarded_program(source)
    program[1] = {**program[1], "cpu_only": False}
    outcome, _ = gpu_engine.execute(program)
    assert outcome["status"] == "COMPLETED", outcome["error"]
    assert cuda_guard._active is None and gpu_engine.subscribed() == 0


def test_gpu_backend_collects_garbage_before_the_guard() -> None:
    """Cyclic garbage made before a cpu_only call is freed before the guard starts (freeing
    an earlier instruction's CUDA tensors must not count as the function's GPU access), and the
    cyclic collector is paused during the call and resumed after it."""
    backend = GpuBackend({})
    events: List[str] = []

    class Holder:
        def __del__(self) -> None:
            events.append("freed")

    @contextlib.contextmanager
    def guard() -> Iterator[None]:
        events.append("enter")
        yield
        events.append("exit")

    def fn() -> str:
        events.append(f"call gc={gc.isenabled()}")
        return "done"

    threshold = gc.get_threshold()
    gc.set_threshold(0)  # no automatic collection: only run_cpu_only's own collect frees it
    try:
        cycle = Holder()
        cycle.self = cycle  # type: ignore[attr-defined]
        del cycle
        devices.set_cpu_only_guard(guard)
        assert backend.run_cpu_only(fn, []) == "done"
    finally:
        devices.set_cpu_only_guard(None)
        gc.set_threshold(*threshold)
    assert events == ["freed", "enter", "call gc=False", "exit"]
    assert gc.isenabled()
