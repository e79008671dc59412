"""The GPU-state receipt's NVML side (kcoral_runtime.gpu_state) against a stand-in NVML.

Without a GPU driver there is no libnvidia-ml, so ``tests/fixtures/nvml/fake_nvml.c`` is compiled
here: NVML's entry points with their real C signatures over two simulated GPUs, plus hooks to set
the readings, make a function fail (NVML_ERROR_NOT_SUPPORTED, or nvmlInit_v2) and count calls.
The module's ctypes signatures, struct layouts, init/shutdown reference counting and the sampler
thread are exercised for real. ``tests/gpu_state_gpu_check.py`` runs against the real NVML on a
GPU machine.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Dict, Iterator, List

import pytest

RUNTIME_DIR = Path(__file__).resolve().parents[1]
if str(RUNTIME_DIR) not in sys.path:
    sys.path.insert(0, str(RUNTIME_DIR))

from kcoral_runtime import gpu_state  # noqa: E402
from kcoral_runtime.gpu_state import (  # noqa: E402
    THROTTLE_MASK,
    NvmlUnavailable,
    Sample,
    Sampler,
    is_throttled,
    open_device,
    reason_names,
    summarize,
    throttled_windows,
)

from _doubles import build_fake_nvml  # noqa: E402

UUID0 = "GPU-11111111-2222-3333-4444-555555555555"
UUID1 = "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
NOT_SUPPORTED = 3
WAIT = 30.0  # how long a condition may take to come about before the test gives up


@pytest.fixture(scope="module")
def fake_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    return build_fake_nvml(tmp_path_factory.mktemp("fakenvml") / "libfake_nvml.so")


class FakeNvml:
    """Test hooks of the stand-in (same dlopen handle as the module's, so the same state)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.lib = ctypes.CDLL(path)
        self.lib.fake_nvml_set.argtypes = [ctypes.c_int, ctypes.c_uint, ctypes.c_uint,
                                           ctypes.c_uint, ctypes.c_uint, ctypes.c_ulonglong]
        self.lib.fake_nvml_fail.argtypes = [ctypes.c_char_p, ctypes.c_int]
        self.lib.fake_nvml_calls.argtypes = [ctypes.c_char_p]
        self.lib.fake_nvml_set_init_result.argtypes = [ctypes.c_int]

    def reset(self) -> None:
        self.lib.fake_nvml_reset()

    def set(self, index: int, sm: int, mem: int, temperature: int, power_mw: int,
            reasons: int) -> None:
        assert self.lib.fake_nvml_set(index, sm, mem, temperature, power_mw, reasons) == 0

    def fail(self, name: str, result: int = NOT_SUPPORTED) -> None:
        assert self.lib.fake_nvml_fail(name.encode(), result) == 0, name

    def calls(self, name: str) -> int:
        count = self.lib.fake_nvml_calls(name.encode())
        assert count >= 0, name
        return count

    def fail_init(self, result: int) -> None:
        self.lib.fake_nvml_set_init_result(result)

    def state(self) -> Dict[str, int]:
        out = (ctypes.c_int * 3)()
        self.lib.fake_nvml_state(out)
        return {"init": out[0], "shutdown": out[1], "refs": out[2]}

    def open(self, **kwargs: object) -> gpu_state.GpuDevice:
        return open_device(library=self.path, **kwargs)  # type: ignore[arg-type]


@pytest.fixture
def fake(fake_path: str) -> Iterator[FakeNvml]:
    hooks = FakeNvml(fake_path)
    hooks.reset()
    yield hooks
    assert hooks.state()["refs"] == 0, "a test left NVML initialised (a device not closed)"
    assert not gpu_state._SESSIONS, gpu_state._SESSIONS


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.001)


def sample(t: int, sm: int | None = 1000, reasons: int = 0, power: float | None = 100.0,
           mem: int | None = 2600, temperature: int | None = 40) -> Sample:
    return Sample(t_ns=t, sm_clock_mhz=sm, mem_clock_mhz=mem, temperature_c=temperature,
                  power_w=power, reasons=reasons)


# --------------------------------------------------------------------------- identity, opening


def test_identity_gives_every_field(fake: FakeNvml) -> None:
    with fake.open(index=0) as device:
        identity = device.identity()
    assert identity == {
        "name": "NVIDIA Stand-in 80GB HBM3",
        "uuid": UUID0,
        "driver_version": "580.95.05",
        "cuda_driver_version": "13.0",
        "nvml_version": "13.580.95.05",
        "pci_bus_id": "00000000:19:00.0",
        "sm_clock_max_mhz": 1980,
        "mem_clock_max_mhz": 2619,
        "power_limit_w": 700.0,
        "persistence_mode": True,
        "compute_mode": "exclusive_process",
        "clocks_locked": {
            "applications_sm_mhz": 1755,
            "applications_mem_mhz": 2619,
            "default_applications_sm_mhz": 1755,
            "default_applications_mem_mhz": 2619,
            "applications_clocks_changed": False,
        },
    }


def test_a_field_nvml_does_not_support_is_none(fake: FakeNvml) -> None:
    for name in ("nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetPersistenceMode",
                 "nvmlSystemGetCudaDriverVersion_v2", "nvmlDeviceGetPciInfo_v3",
                 "nvmlDeviceGetApplicationsClock", "nvmlDeviceGetDefaultApplicationsClock"):
        fake.fail(name)
    with fake.open(index=1) as device:
        identity = device.identity()
    for field in ("power_limit_w", "persistence_mode", "cuda_driver_version", "pci_bus_id",
                  "clocks_locked"):
        assert identity[field] is None, field
    assert identity["uuid"] == UUID1
    assert identity["sm_clock_max_mhz"] == 1980
    assert identity["compute_mode"] == "exclusive_process"


def test_a_reading_nvml_does_not_support_is_none_and_reasons_zero(fake: FakeNvml) -> None:
    fake.set(0, 1410, 2619, 61, 250_000, 0x4)
    for name in ("nvmlDeviceGetClockInfo", "nvmlDeviceGetPowerUsage",
                 "nvmlDeviceGetTemperatureV", "nvmlDeviceGetTemperature",
                 "nvmlDeviceGetCurrentClocksEventReasons",
                 "nvmlDeviceGetCurrentClocksThrottleReasons"):
        fake.fail(name)
    with fake.open(index=0) as device:
        reading = device.sample()
    assert (reading.sm_clock_mhz, reading.mem_clock_mhz, reading.temperature_c,
            reading.power_w, reading.reasons) == (None, None, None, None, 0)


def test_sample_reads_the_device_in_five_calls(fake: FakeNvml) -> None:
    fake.set(0, 1410, 2619, 61, 123_456, 0x4 | 0x1)
    names = ["nvmlDeviceGetClockInfo", "nvmlDeviceGetTemperatureV", "nvmlDeviceGetPowerUsage",
             "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetTemperature",
             "nvmlDeviceGetCurrentClocksThrottleReasons"]
    with fake.open(index=0) as device:
        before = {name: fake.calls(name) for name in names}
        reading = device.sample(clock=lambda: 5000)
        after = {name: fake.calls(name) for name in names}
    assert reading == Sample(t_ns=5000, sm_clock_mhz=1410, mem_clock_mhz=2619, temperature_c=61,
                             power_w=123.456, reasons=0x5)
    assert {name: after[name] - before[name] for name in names} == {
        "nvmlDeviceGetClockInfo": 2, "nvmlDeviceGetTemperatureV": 1,
        "nvmlDeviceGetPowerUsage": 1, "nvmlDeviceGetCurrentClocksEventReasons": 1,
        "nvmlDeviceGetTemperature": 0, "nvmlDeviceGetCurrentClocksThrottleReasons": 0,
    }


def test_temperature_and_reasons_fall_back_to_the_older_functions(fake: FakeNvml) -> None:
    fake.set(0, 1410, 2619, 71, 300_000, 0x20)
    fake.fail("nvmlDeviceGetTemperatureV")
    fake.fail("nvmlDeviceGetCurrentClocksEventReasons")
    with fake.open(index=0) as device:
        first = device.sample()
        second = device.sample()
    assert (first.temperature_c, first.reasons) == (71, 0x20)
    assert (second.temperature_c, second.reasons) == (71, 0x20)
    # the failing newer functions were asked once, then left alone
    assert fake.calls("nvmlDeviceGetTemperatureV") == 1
    assert fake.calls("nvmlDeviceGetCurrentClocksEventReasons") == 1
    assert fake.calls("nvmlDeviceGetTemperature") == 2
    assert fake.calls("nvmlDeviceGetCurrentClocksThrottleReasons") == 2


@pytest.mark.parametrize("uuid", [UUID1, UUID1[4:], "gpu-" + UUID1[4:], f"  {UUID1}\n"])
def test_open_by_uuid_with_or_without_the_prefix(fake: FakeNvml, uuid: str) -> None:
    with fake.open(uuid=uuid) as device:
        assert device.identity()["uuid"] == UUID1
        assert device.identity()["pci_bus_id"] == "00000000:3B:00.0"


def test_a_gpu_not_there_is_nvml_unavailable(fake: FakeNvml) -> None:
    with pytest.raises(NvmlUnavailable, match=r"no GPU with UUID GPU-0000-dead: Not Found \(6\)"):
        fake.open(uuid="0000-dead")
    with pytest.raises(NvmlUnavailable, match=r"no GPU at NVML index 2 \(NVML sees 2\)"):
        fake.open(index=2)
    assert fake.state() == {"init": 2, "shutdown": 2, "refs": 0}


def test_bad_arguments_are_named(fake: FakeNvml) -> None:
    with pytest.raises(ValueError, match="exactly one of uuid= and index="):
        fake.open()
    with pytest.raises(ValueError, match="exactly one of uuid= and index="):
        fake.open(uuid=UUID0, index=0)
    with pytest.raises(ValueError, match="non-negative int, not -1"):
        fake.open(index=-1)
    with pytest.raises(ValueError, match="empty GPU UUID"):
        fake.open(uuid=" ")
    assert fake.state()["init"] == 0


def test_no_library_is_nvml_unavailable_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    missing = "/nonexistent/libnvidia-ml.so.1"
    with pytest.raises(NvmlUnavailable, match=r"cannot load NVML \(/nonexistent/libnvidia-ml"):
        open_device(index=0, library=missing)
    monkeypatch.setenv(gpu_state.LIBRARY_ENV, missing)
    with pytest.raises(NvmlUnavailable, match="cannot load NVML.*No such file"):
        open_device(index=0)
    libc = ctypes.util.find_library("c")
    assert libc
    with pytest.raises(NvmlUnavailable, match="is not NVML: it has no nvmlInit_v2"):
        open_device(index=0, library=libc)
    assert not gpu_state._SESSIONS


def test_the_driver_sonames_are_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(gpu_state.LIBRARY_ENV, raising=False)
    assert gpu_state.library_candidates() == ["libnvidia-ml.so.1", "libnvidia-ml.so"]
    monkeypatch.setenv(gpu_state.LIBRARY_ENV, "/x/libnvml.so")
    assert gpu_state.library_candidates() == ["/x/libnvml.so"]
    assert gpu_state.library_candidates("/y/lib.so") == ["/y/lib.so"]


def test_the_library_env_names_the_library(fake: FakeNvml,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(gpu_state.LIBRARY_ENV, fake.path)
    with open_device(uuid=UUID0) as device:
        assert device.identity()["name"] == "NVIDIA Stand-in 80GB HBM3"


def test_init_failure_is_nvml_unavailable(fake: FakeNvml) -> None:
    fake.fail_init(9)
    with pytest.raises(NvmlUnavailable, match=r"nvmlInit_v2 failed: Driver Not Loaded \(9\)"):
        fake.open(index=0)
    assert fake.state() == {"init": 1, "shutdown": 0, "refs": 0}
    assert not gpu_state._SESSIONS
    fake.fail_init(0)
    with fake.open(index=0) as device:
        assert device.identity()["uuid"] == UUID0


def test_init_and_shutdown_are_balanced(fake: FakeNvml) -> None:
    first = fake.open(uuid=UUID0)
    second = fake.open(index=1)
    assert fake.state() == {"init": 1, "shutdown": 0, "refs": 1}
    first.close()
    first.close()  # again: no second release
    assert fake.state() == {"init": 1, "shutdown": 0, "refs": 1}
    assert second.sample().sm_clock_mhz == 1980  # still initialised for the other device
    second.close()
    assert fake.state() == {"init": 1, "shutdown": 1, "refs": 0}
    with fake.open(index=0):
        assert fake.state() == {"init": 2, "shutdown": 1, "refs": 1}
    assert fake.state() == {"init": 2, "shutdown": 2, "refs": 0}


def test_a_closed_device_says_so(fake: FakeNvml) -> None:
    device = fake.open(index=0)
    device.close()
    assert device.closed
    with pytest.raises(ValueError, match="GpuDevice is closed"):
        device.sample()
    with pytest.raises(ValueError, match="GpuDevice is closed"):
        device.identity()


# --------------------------------------------------------------------------- the sampler


class CountingClock:
    """A caller's clock far from time.monotonic_ns, recording which threads read it."""

    def __init__(self) -> None:
        self.now = 10**15
        self.threads: List[str] = []
        self.lock = threading.Lock()

    def __call__(self) -> int:
        with self.lock:
            self.now += 1000
            self.threads.append(threading.current_thread().name)
            return self.now


def sampler_threads() -> List[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "kcoral-gpu-sampler"]


def test_sampler_reads_at_start_and_at_stop(fake: FakeNvml) -> None:
    clock = CountingClock()
    fake.set(0, 1980, 2619, 40, 100_000, 0x1)
    with fake.open(index=0) as device:
        sampler = Sampler(device, interval_s=3600, clock=clock)
        sampler.start()
        fake.set(0, 1500, 2619, 45, 200_000, 0x4)
        samples = sampler.stop()
    assert [(s.sm_clock_mhz, s.power_w, s.reasons) for s in samples] == [
        (1980, 100.0, 0x1), (1500, 200.0, 0x4)]
    assert set(clock.threads) == {threading.current_thread().name}
    assert samples[0].t_ns == 10**15 + 1500 and samples[1].t_ns == 10**15 + 3500
    assert sampler.error is None


def test_sampler_collects_readings_and_sees_changes_mid_run(fake: FakeNvml) -> None:
    clock = CountingClock()
    fake.set(0, 1980, 2619, 40, 100_000, 0x1)
    with fake.open(index=0) as device:
        sampler = Sampler(device, interval_s=0.001, clock=clock)
        sampler.start()
        try:
            for sm, temperature, power, reasons in ((1980, 40, 100_000, 0x1),
                                                    (1410, 87, 690_000, 0x4 | 0x20),
                                                    (1755, 50, 300_000, 0x0)):
                fake.set(0, sm, 2619, temperature, power, reasons)
                seen = fake.calls("nvmlDeviceGetPowerUsage")
                # two more readings begun: one taken wholly after the change
                wait_for(lambda: fake.calls("nvmlDeviceGetPowerUsage") >= seen + 2,
                         "the sampler thread to take two readings")
        finally:
            samples = sampler.stop()
    assert sampler.error is None
    assert not sampler_threads()
    assert len(samples) >= 8
    times = [s.t_ns for s in samples]
    assert times == sorted(times) and len(set(times)) == len(times)
    assert all(10**15 < t <= clock.now for t in times)
    assert "kcoral-gpu-sampler" in clock.threads
    middle = [(s.sm_clock_mhz, s.temperature_c, s.power_w, s.reasons) for s in samples[1:-1]]
    assert (1980, 40, 100.0, 0x1) in middle
    assert (1410, 87, 690.0, 0x24) in middle
    assert (samples[-1].sm_clock_mhz, samples[-1].reasons) == (1755, 0)
    summary = summarize(samples)
    assert summary["sm_clock_mhz"]["min"] == 1410 and summary["sm_clock_mhz"]["max"] == 1980
    assert summary["reasons_seen"] == ["gpu_idle", "sw_power_cap", "sw_thermal_slowdown"]
    windows = throttled_windows(samples)
    assert len(windows) == 1
    throttled = [s.t_ns for s in samples if s.reasons == 0x24]
    assert windows[0][0] == throttled[0] and windows[0][1] > throttled[-1]


def test_the_sampler_thread_is_gone_after_stop(fake: FakeNvml) -> None:
    with fake.open(index=0) as device:
        sampler = Sampler(device, interval_s=0.001)
        sampler.start()
        assert len(sampler_threads()) == 1
        assert sampler_threads()[0].daemon
        sampler.stop()
    assert not sampler_threads()


def test_the_sampler_keeps_at_most_max_samples(fake: FakeNvml) -> None:
    with fake.open(index=0) as device:
        sampler = Sampler(device, interval_s=0.0005, max_samples=8)
        sampler.start()
        try:
            wait_for(lambda: sampler.thinned >= 3, "the sampler to thin its readings three times")
        finally:
            samples = sampler.stop()
    assert sampler.error is None
    assert 4 <= len(samples) <= 8
    times = [s.t_ns for s in samples]
    assert times == sorted(times)


def test_thinning_keeps_the_reasons_of_a_dropped_reading() -> None:
    readings = [sample(0, reasons=0x1), sample(10, reasons=0x4), sample(20), sample(30),
                sample(40, reasons=0x40)]
    thinned = gpu_state._thin(readings)
    assert [(s.t_ns, s.reasons) for s in thinned] == [(0, 0x5), (20, 0), (40, 0x40)]


def test_an_error_in_the_sampler_thread_is_kept_not_raised(fake: FakeNvml,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    raised: List[object] = []
    monkeypatch.setattr(threading, "excepthook", raised.append)

    def clock() -> int:
        if threading.current_thread().name == "kcoral-gpu-sampler":
            raise RuntimeError("clock broke")
        return time.monotonic_ns()

    with fake.open(index=0) as device:
        sampler = Sampler(device, interval_s=0.0005, clock=clock)
        sampler.start()
        wait_for(lambda: not sampler_threads(), "the failing sampler thread to end")
        samples = sampler.stop()
    assert sampler.error == "RuntimeError: clock broke"
    assert len(samples) == 2
    assert raised == []


def test_sampler_misuse_is_named(fake: FakeNvml) -> None:
    with fake.open(index=0) as device:
        with pytest.raises(ValueError, match="interval_s must be a positive number"):
            Sampler(device, interval_s=0)
        with pytest.raises(ValueError, match="max_samples must be an int of at least 4"):
            Sampler(device, max_samples=3)
        with pytest.raises(ValueError, match="clock must be a callable"):
            Sampler(device, clock=5)  # type: ignore[arg-type]
        sampler = Sampler(device, interval_s=3600)
        with pytest.raises(RuntimeError, match="the sampler is new, not running"):
            sampler.stop()
        sampler.start()
        with pytest.raises(RuntimeError, match="the sampler is running"):
            sampler.start()
        sampler.stop()
        with pytest.raises(RuntimeError, match="the sampler is stopped"):
            sampler.start()


# --------------------------------------------------------------------------- summaries


def test_summarize_gives_min_median_max_reasons_and_throttled_count() -> None:
    readings = [
        sample(0, sm=1980, power=100.0, reasons=0x1, temperature=None),
        sample(1, sm=1410, power=700.5, reasons=0x4, temperature=None),
        sample(2, sm=1755, power=300.0, reasons=0x40 | 0x2, temperature=None),
        sample(3, sm=None, power=None, reasons=0x0, temperature=None),
        sample(4, sm=1500, power=200.0, reasons=0x10, temperature=None),
    ]
    assert summarize(readings) == {
        "samples": 5,
        "sm_clock_mhz": {"min": 1410, "median": 1627.5, "max": 1980},
        "mem_clock_mhz": {"min": 2600, "median": 2600, "max": 2600},
        "temperature_c": None,
        "power_w": {"min": 100.0, "median": 250.0, "max": 700.5},
        "reasons_seen": ["gpu_idle", "applications_clocks_setting", "sw_power_cap", "sync_boost",
                         "hw_thermal_slowdown"],
        "throttled_samples": 2,
    }
    assert summarize([]) == {"samples": 0, "sm_clock_mhz": None, "mem_clock_mhz": None,
                             "temperature_c": None, "power_w": None, "reasons_seen": [],
                             "throttled_samples": 0}


def test_throttled_windows_run_to_the_next_reading_and_merge() -> None:
    readings = [
        sample(0, reasons=0x1),
        sample(10, reasons=0x4),
        sample(20, reasons=0x4),
        sample(30, reasons=0x8),  # a different throttle reason right after: one window
        sample(40, reasons=0x2 | 0x10 | 0x100),  # not power or thermal
        sample(50, reasons=0x80),
        sample(60, reasons=0x0),
        sample(70, reasons=0x20),  # the last reading: its own instant
    ]
    assert throttled_windows(readings) == [(10, 40), (50, 60), (70, 70)]
    assert throttled_windows(list(reversed(readings))) == [(10, 40), (50, 60), (70, 70)]
    assert throttled_windows([sample(0), sample(5)]) == []


def test_reason_names_and_the_throttle_mask() -> None:
    assert reason_names(0x4 | 0x40) == ["sw_power_cap", "hw_thermal_slowdown"]
    assert reason_names(0x1 | 0x100) == ["gpu_idle", "display_clock_setting"]
    assert reason_names(0x200 | 0x8) == ["hw_slowdown", "unknown_0x200"]
    assert reason_names(0) == []
    assert THROTTLE_MASK == 0x4 | 0x8 | 0x20 | 0x40 | 0x80
    assert not is_throttled(0x1 | 0x2 | 0x10 | 0x100)
    assert all(is_throttled(bit) for bit in (0x4, 0x8, 0x20, 0x40, 0x80))


# --------------------------------------------------------------------------- kcoral_runtime.nvml


def run_nvml_cli(library: str) -> object:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(RUNTIME_DIR)
    env[gpu_state.LIBRARY_ENV] = library
    proc = subprocess.run([sys.executable, "-m", "kcoral_runtime.nvml"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_the_nvml_cli_finds_the_library_as_gpu_state_does(fake_path: str) -> None:
    assert run_nvml_cli(fake_path) == [
        {"index": 0, "uuid": UUID0, "minor": 0, "name": "NVIDIA Stand-in 80GB HBM3"},
        {"index": 1, "uuid": UUID1, "minor": 1, "name": "NVIDIA Stand-in 80GB HBM3"},
    ]
    assert run_nvml_cli("/nonexistent/libnvidia-ml.so.1") == []
