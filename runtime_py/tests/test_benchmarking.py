"""benchmarking.measure end to end on CPU: a stand-in torch whose "GPU work" is stand-in CUPTI
records (tests/fixtures/cabi/fake_cupti.c) and a stand-in NVML (tests/fixtures/nvml/fake_nvml.c).

What runs for real: the timer's attribution, the result's fields, the receipt's NVML readings and
throttle flags, adaptive rounds and the events fallback's bookkeeping. What is stood in: the
device (no kernels execute; each launch is a record with a chosen duration). tests/gpu/timing_gpu.py
runs the same measure against the real driver, CUPTI and NVML.
"""

from __future__ import annotations

import ctypes
import random
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Iterator

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _doubles import build_fake_cupti, build_fake_nvml, c_compiler  # noqa: E402
from kcoral_runtime import benchmarking, cupti_activity, gpu_state  # noqa: E402
from kcoral_runtime.benchmarking import Settings, measure  # noqa: E402
from kcoral_runtime.cupti_activity import KIND  # noqa: E402
from kcoral_runtime.errors import ExecutionError  # noqa: E402

RUNTIME = KIND["RUNTIME"]
KERNEL = KIND["CONCURRENT_KERNEL"]
MEMSET = KIND["MEMSET"]
DRIVER_SOURCE = Path(__file__).resolve().parent / "fixtures" / "driver" / "fake_persisting_l2.c"
UUID0 = "GPU-11111111-2222-3333-4444-555555555555"
SW_POWER_CAP = 0x4


@pytest.fixture(scope="module")
def cupti(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    path = build_fake_cupti(tmp_path_factory.mktemp("benchcupti") / "libbench_fake_cupti.so")
    lib = ctypes.CDLL(path)
    lib.fake_activity_launch.argtypes = [ctypes.c_int, ctypes.c_uint32, ctypes.c_int,
                                         ctypes.c_char_p, ctypes.c_uint32, ctypes.c_uint64,
                                         ctypes.c_uint64, ctypes.c_uint64]
    lib.fake_activity_launch.restype = ctypes.c_uint32
    lib._path = path  # type: ignore[attr-defined]
    return lib


@pytest.fixture(scope="module")
def nvml_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    return build_fake_nvml(tmp_path_factory.mktemp("benchnvml") / "libbench_fake_nvml.so")


@pytest.fixture()
def nvml(nvml_path: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[ctypes.CDLL]:
    monkeypatch.setenv("KCORAL_NVML_LIBRARY", nvml_path)
    lib = ctypes.CDLL(nvml_path)
    lib.fake_nvml_set.argtypes = [ctypes.c_int, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint,
                                  ctypes.c_uint, ctypes.c_ulonglong]
    lib.fake_nvml_reset()
    yield lib
    lib.fake_nvml_reset()


class FakeTorch:
    """The torch surface measure() uses; the L2 flush is a stand-in memset of the buffer size."""

    __version__ = "0.0-stand-in"
    int32 = "int32"

    def __init__(self, cupti: ctypes.CDLL, uuid: str = UUID0) -> None:
        self.cupti = cupti
        self.syncs = 0
        self.flushes = 0
        self.version = SimpleNamespace(cuda="13.0")
        outer = self

        class Cuda:
            @staticmethod
            def is_available() -> bool:
                return True

            @staticmethod
            def current_device() -> int:
                return 0

            @staticmethod
            def synchronize(device: int = 0) -> None:
                outer.syncs += 1
                outer.cupti.fake_activity_drain()

            @staticmethod
            def get_device_properties(device: int) -> Any:
                return SimpleNamespace(L2_cache_size=50 << 20, name="Stand-in GPU", uuid=uuid)

        self.cuda = Cuda()

    def empty(self, count: int, dtype: Any, device: int) -> Any:
        outer = self
        size = count * 4

        class Buffer:
            def zero_(self) -> None:
                outer.flushes += 1
                outer.cupti.fake_activity_launch(RUNTIME, 1, MEMSET, None, 0, 10, 40_000, size)

        return Buffer()


@pytest.fixture()
def torch(cupti: ctypes.CDLL, monkeypatch: pytest.MonkeyPatch) -> FakeTorch:
    fake = FakeTorch(cupti)
    monkeypatch.setattr(benchmarking, "cuda_torch", lambda label: fake)
    return fake


def launcher(cupti: ctypes.CDLL, durations: Callable[[], int], stream: int = 13,
             name: bytes = b"gemm") -> Callable[[], None]:
    def call() -> None:
        cupti.fake_activity_launch(RUNTIME, 1, KERNEL, name, stream, 500, durations(), 0)
    return call


def run(cupti: ctypes.CDLL, fn: Callable[..., Any], **settings: Any) -> dict:
    return measure("benchmark", fn, (), Settings(**settings), keep_times=True,
                   cupti_library=cupti._path,  # type: ignore[attr-defined]
                   calibrate_clock=False)


def test_a_side_stream_kernel_is_timed_and_the_result_carries_a_receipt(cupti, torch, nvml):
    nvml.fake_nvml_set(0, 1980, 2619, 41, 350_000, 0)
    result = run(cupti, launcher(cupti, lambda: 2_640_000), warmup=3, repeat=10)
    assert result["timing"] == "cupti_activity"
    assert result["times_ms"] == [2.64] * 10
    assert result["latency_ms_median"] == 2.64
    assert result["ci95_ms"] == [2.64, 2.64]
    assert result["ci95_rel_half_width"] == 0.0
    assert result["samples"] == result["repeat"] == 10
    assert result["activities_stable"] is True
    assert result["escaped_work"] is False
    assert result["calls_without_activity"] == 0
    assert result["kernels"] == ["gemm"]
    assert result["throttled_calls"] == 0
    assert result["cold_l2"] == {"flush_bytes": 100 << 20, "l2_bytes": 50 << 20,
                                 "persisting_l2_reset": result["cold_l2"]["persisting_l2_reset"]}
    assert torch.flushes == 13, "one flush before every warmup and timed call"
    receipt = result["receipt"]
    assert receipt["gpu"]["uuid"] == UUID0
    assert receipt["gpu"]["name"]
    assert receipt["nvml_error"] is None
    assert receipt["timing_fallback_reason"] is None
    assert receipt["cupti_ticks_per_ns"] == 1.0
    assert receipt["versions"]["torch"] == "0.0-stand-in"
    assert receipt["versions"]["cuda_runtime"] == "13.0"
    assert isinstance(receipt["versions"]["cupti"], int)
    clocks = receipt["clocks"]
    assert clocks["samples"] >= 2
    assert clocks["sm_clock_mhz"] == {"min": 1980, "median": 1980, "max": 1980}
    assert clocks["mem_clock_mhz"]["median"] == 2619
    assert clocks["temperature_c"]["max"] == 41
    assert clocks["power_w"]["median"] == pytest.approx(350.0)
    assert clocks["throttled_samples"] == 0
    assert receipt["measured_at"].endswith("+00:00")


def test_calls_under_a_power_cap_are_flagged_and_named(cupti, torch, nvml):
    nvml.fake_nvml_set(0, 1200, 2619, 85, 700_000, SW_POWER_CAP)
    result = run(cupti, launcher(cupti, lambda: 1_000_000), warmup=0, repeat=8)
    assert result["throttled_calls"] == 8
    assert result["receipt"]["clocks"]["throttled_samples"] >= 2
    assert result["receipt"]["clocks"]["reasons_seen"]
    # Every call throttled: discarding would leave nothing, so all stay and the count says so.
    kept = run(cupti, launcher(cupti, lambda: 1_000_000), warmup=0, repeat=8,
               discard_throttled=True)
    assert kept["discarded_calls"] == 0 and kept["samples"] == 8


def test_throttled_calls_are_those_overlapping_a_throttled_window():
    spans = [(0, 10), (20, 30), (40, 50), None]
    assert benchmarking.throttled_calls(spans, [(25, 41)]) == [False, True, True, False]
    assert benchmarking.throttled_calls(spans, []) == [False] * 4


def test_unstable_work_and_alternating_kernels_are_reported(cupti, torch, nvml):
    flip = iter(range(1000))

    def call() -> None:
        name = b"fast" if next(flip) % 2 else b"slow"
        cupti.fake_activity_launch(RUNTIME, 1, KERNEL, name, 7, 20, 1_000, 0)

    result = run(cupti, call, warmup=0, repeat=6)
    assert result["activities_stable"] is False


def test_a_function_without_gpu_work_is_an_error(cupti, torch, nvml):
    with pytest.raises(ExecutionError, match="launched no GPU work"):
        run(cupti, lambda: None, warmup=0, repeat=5)
    assert not gpu_state._SESSIONS, "NVML closed on the error path too"
    assert cupti_activity._active_trace is None, "the trace stopped on the error path too"


def test_adaptive_stops_when_the_interval_is_tight(cupti, torch, nvml):
    result = run(cupti, launcher(cupti, lambda: 1_000_000), warmup=0, repeat=3, adaptive=True)
    assert result["adaptive"]["reached"] is True
    assert result["adaptive"]["rounds"] == 2, "6 samples are the fewest with a 95 % interval"
    assert result["samples"] == 6


def test_adaptive_stops_at_the_budget_when_the_noise_stays_high(cupti, torch, nvml):
    rng = random.Random(5)
    result = run(cupti, launcher(cupti, lambda: rng.randint(1_000, 100_000)), warmup=0, repeat=20,
                 adaptive=True, target_rel_ci=1e-6, budget_s=0.3)
    assert result["adaptive"]["reached"] is False
    assert result["adaptive"]["rounds"] >= 2
    assert result["samples"] == 20 * result["adaptive"]["rounds"]
    assert result["ci95_rel_half_width"] > 1e-6


def test_fixed_count_reports_no_adaptive_block(cupti, torch, nvml):
    result = run(cupti, launcher(cupti, lambda: 5_000), warmup=0, repeat=7)
    assert result["adaptive"] is None and result["samples"] == 7


def test_without_nvml_the_receipt_says_why(cupti, torch, monkeypatch):
    monkeypatch.setenv("KCORAL_NVML_LIBRARY", "/nonexistent/libnvidia-ml.so.1")
    result = run(cupti, launcher(cupti, lambda: 5_000), warmup=0, repeat=6)
    receipt = result["receipt"]
    assert "cannot load NVML" in receipt["nvml_error"]
    assert receipt["clocks"] is None
    assert receipt["gpu"] == {"name": "Stand-in GPU", "uuid": UUID0}


class EventTorch(FakeTorch):
    """Adds CUDA events whose elapsed time is a fixed 0.25 ms."""

    def __init__(self, cupti: ctypes.CDLL) -> None:
        super().__init__(cupti)

        class Event:
            def __init__(self, enable_timing: bool = False) -> None:
                pass

            def record(self, stream: Any = None) -> None:
                pass

            def synchronize(self) -> None:
                pass

            def elapsed_time(self, end: "Event") -> float:
                return 0.25

        self.cuda.Event = Event  # type: ignore[attr-defined]
        self.cuda.current_stream = lambda device: None  # type: ignore[attr-defined]


def test_without_cupti_events_close_each_call_with_a_device_sync(cupti, monkeypatch, nvml):
    fake = EventTorch(cupti)
    monkeypatch.setattr(benchmarking, "cuda_torch", lambda label: fake)
    result = measure("benchmark", lambda: None, (), Settings(warmup=0, repeat=6),
                     cupti_library="/nonexistent/libcupti.so")
    assert result["timing"] == "cuda_events_device_sync"
    assert result["latency_ms_median"] == 0.25
    assert result["activities_stable"] is None and result["escaped_work"] is None
    assert result["receipt"]["timing_fallback_reason"]
    assert result["receipt"]["versions"]["cupti"] is None
    assert fake.syncs >= 2 * 6, "a device-wide synchronize before and inside every timed call"


@pytest.fixture()
def driver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ctypes.CDLL:
    out = tmp_path / "libfake_driver_l2.so"
    cmd = [c_compiler(), "-shared", "-fPIC", "-Wall", "-Werror", str(DRIVER_SOURCE), "-o", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    monkeypatch.setattr(benchmarking, "DRIVER_LIBRARY", str(out))
    lib = ctypes.CDLL(str(out))
    lib.cuCtxSetLimit.argtypes = [ctypes.c_int, ctypes.c_size_t]
    return lib


def test_a_persisting_l2_carve_out_is_undone_before_every_call_and_counted(cupti, torch, nvml,
                                                                           driver):
    def carve_out() -> None:
        driver.cuCtxSetLimit(0x06, 32 << 20)  # what a candidate does to keep its data in L2
        cupti.fake_activity_launch(RUNTIME, 1, KERNEL, b"k", 7, 20, 1_000, 0)

    result = run(cupti, carve_out, warmup=2, repeat=6)
    assert result["cold_l2"]["persisting_l2_reset"] is True
    assert result["persisting_l2_calls"] == 8, "after each warmup and timed call"
    assert driver.fake_resets() == 10, "reset at the start, before every call and at the end"
    honest = run(cupti, launcher(cupti, lambda: 1_000), warmup=2, repeat=6)
    assert honest["persisting_l2_calls"] == 0


def test_without_the_driver_the_carve_out_count_is_unknown(cupti, torch, nvml, monkeypatch):
    monkeypatch.setattr(benchmarking, "DRIVER_LIBRARY", "/nonexistent/libcuda.so.1")
    result = run(cupti, launcher(cupti, lambda: 1_000), warmup=0, repeat=6)
    assert result["persisting_l2_calls"] is None
    assert result["cold_l2"]["persisting_l2_reset"] is False


@pytest.mark.parametrize("field, value, fragment", [
    ("repeat", 0, "repeat must be an integer >= 1"),
    ("warmup", -1, "warmup must be an integer >= 0"),
    ("adaptive", "yes", "adaptive must be a bool"),
    ("target_rel_ci", 0, "target_rel_ci must be a number > 0"),
    ("budget_s", -1.0, "budget_s must be a number > 0"),
    ("discard_throttled", 1, "discard_throttled must be a bool"),
])
def test_settings_are_checked(torch, field: str, value: Any, fragment: str) -> None:
    with pytest.raises(ExecutionError, match=fragment):
        measure("benchmark", lambda: None, (), Settings(**{field: value}))
