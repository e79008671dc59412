"""The cpu_only guard (kcoral_runtime.cuda_guard).

Without a GPU driver the real libcupti cannot subscribe (cuptiSubscribe returns
CUPTI_ERROR_UNKNOWN), so the callback path is driven here through a stand-in libcupti
(tests/fixtures/cabi/fake_cupti.c) compiled against the toolkit's real cupti_callbacks.h: the
guard's ctypes signatures, the CUpti_CallbackData layout, the one-subscriber rule and the
unsubscribe-always behaviour are exercised for real. ``test_real_cupti`` uses the installed
libcupti: on a machine with a driver it checks a genuine violation, else that ``start()`` raises
``GuardUnavailable``. ``tests/gpu_checks.py`` checks torch.cuda calls on the H200.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import linecache
import os
import sys
import sysconfig
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Dict, List

import pytest

RUNTIME_DIR = Path(__file__).resolve().parents[1]
if str(RUNTIME_DIR) not in sys.path:
    sys.path.insert(0, str(RUNTIME_DIR))

from kcoral_runtime import cuda_guard  # noqa: E402
from kcoral_runtime.cuda_guard import CudaGuard, GuardUnavailable, Violation  # noqa: E402
from kcoral_runtime.errors import ExecutionError, GPUAccessViolation  # noqa: E402

from _doubles import build_fake_cupti  # noqa: E402

RUNTIME = 2
DRIVER = 1


@pytest.fixture(scope="module")
def fake_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    return build_fake_cupti(tmp_path_factory.mktemp("fakecupti") / "libfake_cupti.so")


class Fake:
    """Test hooks of the stand-in libcupti (same handle as the guard's: dlopen refcounts)."""

    def __init__(self, path: str) -> None:
        self.lib = ctypes.CDLL(path)
        self.lib.fake_api_call.argtypes = [ctypes.c_int, ctypes.c_char_p]
        self.lib.fake_api_exit_only.argtypes = [ctypes.c_int, ctypes.c_char_p]
        self.lib.fake_api_call_on_native_thread.argtypes = [ctypes.c_int, ctypes.c_char_p]
        self.lib.fake_set_results.argtypes = [ctypes.c_int, ctypes.c_int]

    def call(self, domain: int, name: bytes) -> None:
        self.lib.fake_api_call(domain, name)

    def state(self) -> Dict[str, int]:
        out = (ctypes.c_int * 6)()
        self.lib.fake_state(out)
        keys = ("subscribed", "runtime", "driver", "subscribes", "unsubscribes", "resource")
        return dict(zip(keys, out))


@pytest.fixture
def fake(fake_path: str) -> Fake:
    f = Fake(fake_path)
    f.lib.fake_set_results(0, 0)
    assert f.state()["subscribed"] == 0, "a previous test left the fake CUPTI subscribed"
    yield f
    f.lib.fake_set_results(0, 0)
    assert cuda_guard._active is None
    assert f.state()["subscribed"] == 0


def uploaded(source: str, digest: str = "abcd") -> Dict[str, Any]:
    """Execute like the engine's module upload: filename <uploaded:...>, source in linecache."""
    filename = f"<uploaded:{digest}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace: Dict[str, Any] = {}
    exec(compile(source, filename, "exec"), namespace)
    return namespace


USER_SOURCE = """\
def user_fn(api):
    total = sum(range(10))
    api(2, b"cudaDeviceSynchronize")
    api(1, b"cuCtxSynchronize")
    api(2, b"cudaGetDevice")
    return total
"""


# --------------------------------------------------------------------------- the callback path


def test_first_call_is_recorded_with_uploaded_location(fake: Fake, fake_path: str) -> None:
    ns = uploaded(USER_SOURCE)
    guard = CudaGuard(fake_path)
    before = time.monotonic_ns()
    with guard:
        state = fake.state()
        assert (state["subscribed"], state["runtime"], state["driver"], state["resource"]) == (1, 1, 1, 0)
        assert ns["user_fn"](fake.call) == 45  # the call proceeds
    after = time.monotonic_ns()
    v = guard.violation
    assert isinstance(v, Violation)
    assert v.cuda_call == "cudaDeviceSynchronize"
    assert v.location == "<uploaded:abcd>:3 in user_fn"
    assert before <= v.detected_at_ns <= after
    assert v.call_count == 3
    assert v.traceback.startswith("Traceback (most recent call last):\n")
    assert 'File "<uploaded:abcd>", line 3, in user_fn\n    api(2, b"cudaDeviceSynchronize")' in v.traceback
    assert v.calls == ("cudaDeviceSynchronize", "cuCtxSynchronize", "cudaGetDevice")
    assert v.traceback.endswith(
        "GPUAccessViolation: cpu_only function called cudaDeviceSynchronize at"
        " <uploaded:abcd>:3 in user_fn (thread MainThread); 3 CUDA API entries while watched:"
        " cudaDeviceSynchronize, cuCtxSynchronize, cudaGetDevice\n"
    )
    assert "_on_callback" not in v.traceback  # the guard's own frame is not part of the stack
    assert "test_first_call_is_recorded_with_uploaded_location" in v.traceback
    assert fake.state()["subscribed"] == 0
    assert guard.stop() is v  # idempotent


def test_driver_api_call(fake: Fake, fake_path: str) -> None:
    with CudaGuard(fake_path) as guard:
        fake.call(DRIVER, b"cuMemAlloc_v2")
    assert guard.violation is not None and guard.violation.cuda_call == "cuMemAlloc_v2"
    assert guard.violation.call_count == 1 and guard.violation.calls == ("cuMemAlloc_v2",)
    assert guard.violation.traceback.endswith("(thread MainThread)\n")


def test_distinct_calls_are_capped(fake: Fake, fake_path: str) -> None:
    with CudaGuard(fake_path) as guard:
        for i in range(20):
            fake.call(RUNTIME, f"cudaCall{i % 12}".encode())
    v = guard.violation
    assert v is not None and v.call_count == 20
    assert v.calls == tuple(f"cudaCall{i}" for i in range(cuda_guard.MAX_DISTINCT_CALLS))
    assert v.traceback.endswith("cudaCall6, cudaCall7, ...\n")


def test_nothing_reported_without_cuda_calls(fake: Fake, fake_path: str) -> None:
    import numpy as np
    import torch

    with CudaGuard(fake_path) as guard:
        (torch.ones(64) * 2).sum().item()
        np.linalg.inv(np.eye(3))
        fake.lib.fake_api_exit_only(RUNTIME, b"cudaFree")  # exit callbacks are not entries
    assert guard.violation is None and guard.stop() is None


def test_calls_outside_the_window_are_ignored(fake: Fake, fake_path: str) -> None:
    guard = CudaGuard(fake_path)
    fake.call(RUNTIME, b"cudaBefore")
    guard.start()
    guard.stop()
    fake.call(RUNTIME, b"cudaAfter")
    assert guard.violation is None
    # A callback that arrives after stop() (e.g. a racing thread) is not recorded either.
    guard._record(b"cudaLate", time.monotonic_ns(), sys._getframe())
    assert guard.violation is None and guard.stop() is None


def test_guard_is_reusable_and_resets(fake: Fake, fake_path: str) -> None:
    guard = CudaGuard(fake_path)
    with guard:
        fake.call(RUNTIME, b"cudaOne")
    assert guard.violation is not None and guard.violation.cuda_call == "cudaOne"
    with guard:
        pass
    assert guard.violation is None
    subscribes = fake.state()["subscribes"]
    for _ in range(100):
        with guard:
            pass
    state = fake.state()
    assert state["subscribes"] == subscribes + 100 and state["unsubscribes"] >= 100


def test_location_skips_stdlib_frames(fake: Fake, fake_path: str) -> None:
    # A helper whose file is inside the standard library is internal: the location is our caller.
    stdlib_file = os.path.join(sysconfig.get_paths()["stdlib"], "kcoral_fake_helper.py")
    helper_ns: Dict[str, Any] = {}
    exec(compile("def helper(api):\n    api(2, b'cudaMalloc')\n", stdlib_file, "exec"), helper_ns)

    def caller() -> None:
        helper_ns["helper"](fake.lib.fake_api_call)  # <- expected location

    with CudaGuard(fake_path) as guard:
        caller()
    assert guard.violation is not None
    expected_line = caller.__code__.co_firstlineno + 1
    assert guard.violation.location == f"{__file__}:{expected_line} in caller"


def test_location_in_workspace_module(fake: Fake, fake_path: str, tmp_path: Path) -> None:
    (tmp_path / "kcoral_ws_helper.py").write_text("def go(api):\n    x = 1\n    api(2, b'cudaMemcpy')\n")
    sys.path.insert(0, str(tmp_path))
    try:
        import kcoral_ws_helper  # type: ignore[import-not-found]

        with CudaGuard(fake_path) as guard:
            kcoral_ws_helper.go(fake.lib.fake_api_call)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("kcoral_ws_helper", None)
    assert guard.violation is not None
    assert guard.violation.location == f"{tmp_path / 'kcoral_ws_helper.py'}:3 in go"


def test_call_from_a_python_thread(fake: Fake, fake_path: str) -> None:
    ns = uploaded("def in_thread(api):\n    api(2, b'cudaStreamCreate')\n", "th01")
    with CudaGuard(fake_path) as guard:
        t = threading.Thread(target=ns["in_thread"], args=(fake.call,), name="user-thread")
        t.start()
        t.join()
    v = guard.violation
    assert v is not None and v.cuda_call == "cudaStreamCreate"
    assert v.location == "<uploaded:th01>:2 in in_thread"
    assert "(thread user-thread)" in v.traceback


def test_call_from_a_native_thread(fake: Fake, fake_path: str) -> None:
    with CudaGuard(fake_path) as guard:
        assert fake.lib.fake_api_call_on_native_thread(RUNTIME, b"cudaLaunchKernel") == 0
    v = guard.violation
    assert v is not None and v.cuda_call == "cudaLaunchKernel"
    assert v.location == cuda_guard.NO_PYTHON_FRAME
    assert "GPUAccessViolation: cpu_only function called cudaLaunchKernel" in v.traceback


def test_unsubscribes_when_the_body_raises(fake: Fake, fake_path: str) -> None:
    guard = CudaGuard(fake_path)
    with pytest.raises(ZeroDivisionError):
        with guard:
            fake.call(RUNTIME, b"cudaEventRecord")
            1 / 0
    assert fake.state()["subscribed"] == 0
    assert guard.violation is not None and guard.violation.cuda_call == "cudaEventRecord"


# --------------------------------------------------------------------------- unavailable paths


def test_subscribe_failure_is_unavailable_and_not_sticky(fake: Fake, fake_path: str) -> None:
    fake.lib.fake_set_results(999, 0)
    guard = CudaGuard(fake_path)
    with pytest.raises(GuardUnavailable) as info:
        guard.start()
    assert "CUPTI_ERROR_UNKNOWN (999)" in str(info.value)
    assert cuda_guard._active is None and not guard.active
    fake.lib.fake_set_results(0, 0)
    with guard:
        pass
    assert guard.violation is None


def test_enable_failure_unsubscribes(fake: Fake, fake_path: str) -> None:
    fake.lib.fake_set_results(0, 15)
    before = fake.state()["unsubscribes"]
    with pytest.raises(GuardUnavailable) as info:
        CudaGuard(fake_path).start()
    assert "CUPTI_ERROR_NOT_INITIALIZED (15)" in str(info.value)
    state = fake.state()
    assert state["subscribed"] == 0 and state["unsubscribes"] == before + 1


def test_one_guard_at_a_time(fake: Fake, fake_path: str) -> None:
    first = CudaGuard(fake_path)
    first.start()
    try:
        with pytest.raises(GuardUnavailable) as info:
            CudaGuard(fake_path).start()
        assert "another CudaGuard is active" in str(info.value)
        with pytest.raises(RuntimeError):
            first.start()
    finally:
        first.stop()


def test_foreign_subscriber_is_unavailable(fake: Fake, fake_path: str) -> None:
    callback = cuda_guard._CALLBACK_TYPE(lambda *a: None)
    handle = ctypes.c_void_p()
    subscribe = fake.lib.cuptiSubscribe
    subscribe.argtypes = [ctypes.POINTER(ctypes.c_void_p), cuda_guard._CALLBACK_TYPE, ctypes.c_void_p]
    assert subscribe(ctypes.byref(handle), callback, None) == 0  # "a profiler" got there first
    try:
        with pytest.raises(GuardUnavailable) as info:
            CudaGuard(fake_path).start()
        assert "MULTIPLE_SUBSCRIBERS" in str(info.value) and "profiler" in str(info.value)
    finally:
        fake.lib.cuptiUnsubscribe.argtypes = [ctypes.c_void_p]
        assert fake.lib.cuptiUnsubscribe(handle) == 0


def test_bogus_library_path(tmp_path: Path) -> None:
    with pytest.raises(GuardUnavailable) as info:
        CudaGuard(str(tmp_path / "libcupti.so.404")).start()
    assert "cannot load libcupti" in str(info.value)
    assert cuda_guard._active is None


def test_library_without_cupti_symbols(tmp_path: Path) -> None:
    libc = ctypes.util.find_library("c")
    assert libc
    with pytest.raises(GuardUnavailable) as info:
        CudaGuard(libc).start()
    assert "not a usable libcupti" in str(info.value)


# --------------------------------------------------------------------------- cpu_only_guard


def test_cpu_only_guard_raises_gpu_access_violation(fake: Fake, fake_path: str) -> None:
    ns = uploaded(USER_SOURCE, "beef")
    with pytest.raises(GPUAccessViolation) as info:
        with cuda_guard.cpu_only_guard(fake_path):
            ns["user_fn"](fake.call)
    exc = info.value
    assert exc.kind == "gpu_access"
    assert exc.cuda_call == "cudaDeviceSynchronize"
    assert exc.location == "<uploaded:beef>:3 in user_fn"
    assert '"<uploaded:beef>", line 3' in exc.call_stack
    assert isinstance(exc.detected_at_ns, int) and exc.detected_at_ns > 0
    assert exc.message == (
        "cpu_only function called cudaDeviceSynchronize at <uploaded:beef>:3 in user_fn"
    )


def test_cpu_only_guard_violation_wins_over_body_exception(fake: Fake, fake_path: str) -> None:
    with pytest.raises(GPUAccessViolation) as info:
        with cuda_guard.cpu_only_guard(fake_path):
            fake.call(RUNTIME, b"cudaGetDeviceCount")
            raise RuntimeError("CUDA driver initialization failed")
    assert isinstance(info.value.__context__, RuntimeError)


def test_cpu_only_guard_clean_run(fake: Fake, fake_path: str) -> None:
    results: List[int] = []
    with cuda_guard.cpu_only_guard(fake_path):
        results.append(sum(range(5)))
    assert results == [10]
    with pytest.raises(KeyError):  # the body's own exception passes through unchanged
        with cuda_guard.cpu_only_guard(fake_path):
            {}["missing"]


def test_cpu_only_guard_unavailable(tmp_path: Path) -> None:
    ran: List[bool] = []
    with pytest.raises(ExecutionError) as info:
        with cuda_guard.cpu_only_guard(str(tmp_path / "nope.so")):
            ran.append(True)
    assert info.value.kind == "unavailable" and not isinstance(info.value, GPUAccessViolation)
    assert ran == []


# --------------------------------------------------------------------------- locations, discovery


def test_frame_location_rules() -> None:
    stdlib = sysconfig.get_paths()["stdlib"]
    purelib = sysconfig.get_paths()["purelib"]
    pkg = os.path.dirname(cuda_guard.__file__)
    import torch

    torch_dir = os.path.dirname(torch.__file__)
    F = traceback.FrameSummary
    user = F("/work/ws/user.py", 10, "user", lookup_line=False)
    uploaded_frame = F("<uploaded:1234>", 5, "kernel", lookup_line=False)
    std = F(os.path.join(stdlib, "json", "decoder.py"), 1, "decode", lookup_line=False)
    ours = F(os.path.join(pkg, "engine.py"), 2, "_invoke", lookup_line=False)
    tor = F(os.path.join(torch_dir, "cuda", "__init__.py"), 3, "synchronize", lookup_line=False)
    third = F(os.path.join(purelib, "triton", "runtime", "jit.py"), 4, "run", lookup_line=False)
    frozen = F("<frozen importlib._bootstrap>", 6, "_load", lookup_line=False)

    assert cuda_guard.frame_location([ours, uploaded_frame, third, tor]) == "<uploaded:1234>:5 in kernel"
    assert cuda_guard.frame_location([ours, user, std, tor]) == "/work/ws/user.py:10 in user"
    assert cuda_guard.frame_location([ours, user, third, tor]).startswith(os.path.join(purelib, "triton"))
    assert cuda_guard.frame_location([ours, std, frozen, tor]).startswith(
        os.path.join(torch_dir, "cuda", "__init__.py") + ":3"
    )  # everything internal: the innermost frame
    assert cuda_guard.frame_location([]) == cuda_guard.NO_PYTHON_FRAME


def test_candidates_env_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cuda_guard.LIBRARY_ENV, "/opt/custom/libcupti.so.13")
    assert cuda_guard.cupti_candidates() == ["/opt/custom/libcupti.so.13"]


def test_candidates_search_order(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(cuda_guard.LIBRARY_ENV, raising=False)
    site_dir = tmp_path / "site"
    wheel = site_dir / "nvidia" / "cu13" / "lib"
    wheel.mkdir(parents=True)
    (wheel / "libcupti.so.13").write_bytes(b"")
    old_wheel = site_dir / "nvidia" / "cuda_cupti" / "lib"
    old_wheel.mkdir(parents=True)
    (old_wheel / "libcupti.so.12").write_bytes(b"")
    home = tmp_path / "cuda_home"
    (home / "extras" / "CUPTI" / "lib64").mkdir(parents=True)
    (home / "extras" / "CUPTI" / "lib64" / "libcupti.so").write_bytes(b"")
    (home / "extras" / "CUPTI" / "lib64" / "libcupti.so.13").write_bytes(b"")
    (home / "lib64").mkdir()
    (home / "lib64" / "libcupti.so.13").write_bytes(b"")
    monkeypatch.setattr(sys, "path", [str(site_dir)] + sys.path)
    monkeypatch.setenv("CUDA_HOME", str(home))
    monkeypatch.delenv("CUDA_PATH", raising=False)
    got = cuda_guard.cupti_candidates()
    expected = [
        str(wheel / "libcupti.so.13"),
        str(old_wheel / "libcupti.so.12"),
        str(home / "extras" / "CUPTI" / "lib64" / "libcupti.so.13"),
        str(home / "extras" / "CUPTI" / "lib64" / "libcupti.so"),
        str(home / "lib64" / "libcupti.so.13"),
    ]
    indices = [got.index(e) for e in expected]
    assert indices == sorted(indices), got
    mapped = cuda_guard._mapped_cupti()
    assert got[: len(mapped)] == mapped  # already-mapped copies come first


def _driver_present() -> bool:
    for name in ("libcuda.so.1", "libcuda.so"):
        try:
            ctypes.CDLL(name)
            return True
        except OSError:
            continue
    return False


def test_real_cupti() -> None:
    """The installed libcupti: a real violation with a driver; GuardUnavailable without one."""
    if os.environ.get(cuda_guard.LIBRARY_ENV):
        pytest.fail(f"unset {cuda_guard.LIBRARY_ENV} for this test")
    guard = CudaGuard()
    if not _driver_present():
        # No driver: CUPTI cannot initialize (CUPTI_ERROR_UNKNOWN), or there is no libcupti.
        for _ in range(2):  # and the failure leaves nothing behind
            with pytest.raises(GuardUnavailable):
                guard.start()
            assert cuda_guard._active is None and not guard.active
        return
    cudart = None
    for candidate in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):
        try:
            cudart = ctypes.CDLL(candidate)
            break
        except OSError:
            continue
    if cudart is None:
        cudart = ctypes.CDLL("/usr/local/cuda/lib64/libcudart.so")
    ns = uploaded("def count(rt, out):\n    return rt.cudaGetDeviceCount(out)\n", "real")
    out = ctypes.c_int()
    with guard:
        ns["count"](cudart, ctypes.byref(out))
    assert guard.violation is not None
    assert guard.violation.cuda_call == "cudaGetDeviceCount"
    assert guard.violation.location == "<uploaded:real>:2 in count"
    with guard:
        sum(range(100))
    assert guard.violation is None


def test_device_queries_yield_to_the_first_real_call(fake: Fake, fake_path: str) -> None:
    # torch.cuda.synchronize() asks cudaGetDevice first; the error names the synchronize.
    with CudaGuard(fake_path) as guard:
        fake.call(RUNTIME, b"cudaGetDevice")
        fake.call(RUNTIME, b"cudaDeviceSynchronize")
        fake.call(RUNTIME, b"cudaLaunchKernel")
    violation = guard.violation
    assert violation is not None
    assert violation.cuda_call == "cudaDeviceSynchronize"
    assert violation.calls[:2] == ("cudaGetDevice", "cudaDeviceSynchronize")


def test_only_device_queries_still_violate(fake: Fake, fake_path: str) -> None:
    with CudaGuard(fake_path) as guard:
        fake.call(RUNTIME, b"cudaGetDeviceCount")
    assert guard.violation is not None
    assert guard.violation.cuda_call == "cudaGetDeviceCount"


def test_query_names_include_driver_versions() -> None:
    for name in ("cudaGetDevice", "cuCtxGetDevice_v2", "cuDeviceGetAttribute", "cudaPeekAtLastError",
                 "cuMemGetInfo_v2", "cudaGetDeviceProperties_v2"):
        assert cuda_guard.is_query_call(name), name
    for name in ("cudaDeviceSynchronize", "cuCtxSynchronize", "cudaLaunchKernel", "cuMemAlloc_v2",
                 "cudaMemcpyAsync_ptsz", "cudaSetDevice"):
        assert not cuda_guard.is_query_call(name), name
