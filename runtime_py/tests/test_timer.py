"""The activity timer (kcoral_runtime.timer, cupti_activity) against the stand-in libcupti.

The stand-in (tests/fixtures/cabi/fake_cupti.c) writes the toolkit's own record structs into the
buffers the binding hands out, so these tests exercise the real parsing, the external-correlation
tagging of the timer's own work and the attribution rules. Each "GPU call" below is a
``fake_activity_launch``: an API record at the stand-in's clock and, optionally, a kernel/memset
record some nanoseconds later on any stream. The real CUPTI runs in tests/gpu/ on a GPU machine.
"""

from __future__ import annotations

import ctypes
import itertools
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, List

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _doubles import build_fake_cupti, c_compiler, cuda_include  # noqa: E402
from kcoral_runtime import cupti_activity, timer  # noqa: E402
from kcoral_runtime.cupti_activity import KIND, ActivityTrace  # noqa: E402

RUNTIME = KIND["RUNTIME"]
DRIVER = KIND["DRIVER"]
KERNEL = KIND["CONCURRENT_KERNEL"]
MEMSET = KIND["MEMSET"]
STILL_RUNNING = 2**64 - 1


@pytest.fixture(scope="module")
def fake(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    path = build_fake_cupti(tmp_path_factory.mktemp("timercupti") / "libtimer_fake_cupti.so")
    lib = ctypes.CDLL(path)
    args = [ctypes.c_int, ctypes.c_uint32, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32,
            ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint64]
    lib.fake_activity_launch.argtypes = args
    lib.fake_activity_launch.restype = ctypes.c_uint32
    lib.fake_activity_launch_on_native_thread.argtypes = args
    lib.fake_activity_launch_on_native_thread.restype = ctypes.c_int
    lib.fake_set_real_clock.argtypes = [ctypes.c_double]
    lib._path = path  # type: ignore[attr-defined]
    return lib


@pytest.fixture()
def trace(fake: ctypes.CDLL):
    t = ActivityTrace(library=fake._path, calibrate=False)  # type: ignore[attr-defined]
    t.start()
    try:
        yield t
    finally:
        t.stop()


def kernel(fake: ctypes.CDLL, name: bytes = b"gemm", stream: int = 7, delay: int = 20,
           duration: int = 2_000, thread: int = 1, api: int = RUNTIME) -> None:
    fake.fake_activity_launch(api, thread, KERNEL, name, stream, delay, duration, 0)


def flush(fake: ctypes.CDLL) -> Callable[[], None]:
    """The timer's own L2 flush: a memset on the legacy stream."""
    return lambda: fake.fake_activity_launch(RUNTIME, 1, MEMSET, None, 0, 10, 50_000, 1 << 26)


def measure(trace: ActivityTrace, fake: ctypes.CDLL, call: Callable[[], None], repeat: int = 5,
            sync: Callable[[], None] = lambda: None) -> timer.Measured:
    return timer.measure_activity(call, repeat, flush(fake), sync, trace, grace_s=0)


def test_an_honest_kernel_is_timed_by_its_gpu_span(trace, fake):
    got = measure(trace, fake, lambda: kernel(fake, duration=2_000))
    assert got.timing == "cupti_activity"
    assert got.times_ms == [0.002] * 5
    assert got.activities_stable is True
    assert got.escaped_activities == 0
    assert got.calls_without_activity == 0
    assert got.kernels == ["gemm"]


def test_work_on_a_side_stream_is_inside_the_span(trace, fake):
    # A GEMM on a leaked non-blocking stream that starts long after the call returned on the
    # host: CUDA events on the current stream would see nothing; its activity span is 2.64 ms.
    got = measure(trace, fake, lambda: kernel(fake, stream=13, delay=500_000, duration=2_640_000))
    assert got.times_ms == [2.64] * 5
    assert got.escaped_activities == 0


def test_several_launches_span_from_the_first_start_to_the_last_end(trace, fake):
    def call() -> None:
        kernel(fake, name=b"a", stream=7, delay=20, duration=1_000)  # 20 .. 1020 after entry
        kernel(fake, name=b"b", stream=9, delay=100, duration=3_000)  # entered 5 ns later
    got = measure(trace, fake, call)
    # the first starts at e+20, the second ends at e+5+100+3000 = e+3105: 3085 ns
    assert got.times_ms == pytest.approx([0.003085] * 5)
    assert got.activities_stable is True


def test_work_launched_from_another_thread_during_the_call_is_attributed(trace, fake):
    def call() -> None:
        kernel(fake, duration=1_000)
        assert fake.fake_activity_launch_on_native_thread(
            DRIVER, 99, KERNEL, b"helper", 21, 0, 4_000, 0) == 0
    got = measure(trace, fake, call)
    assert got.escaped_activities == 0
    assert all(t >= 0.004 for t in got.times_ms), got.times_ms


def test_work_launched_after_the_call_returned_is_escaped(trace, fake):
    pending: List[int] = []

    def call() -> None:
        kernel(fake, duration=1_000)
        pending.append(1)  # a thread/callback will launch more once the call has returned

    def sync() -> None:  # it fires while the timer waits for the device
        while pending:
            pending.pop()
            fake.fake_activity_launch_on_native_thread(RUNTIME, 42, KERNEL, b"late", 3, 0, 9_000, 0)

    got = measure(trace, fake, call, sync=sync)
    assert got.escaped_activities == 5
    assert got.times_ms == [0.001] * 5


def test_another_threads_launch_during_the_timers_own_flush_is_not_taken_for_the_timers(trace, fake):
    own = flush(fake)
    count = [0]

    def prepare() -> None:
        own()
        if count[0] == 0:
            fake.fake_activity_launch_on_native_thread(RUNTIME, 7, KERNEL, b"sneak", 5, 0, 1_000, 0)
        count[0] += 1

    got = timer.measure_activity(lambda: kernel(fake), 3, prepare, lambda: None, trace, grace_s=0)
    assert got.escaped_activities == 1
    assert got.times_ms == [0.002] * 3


def test_calls_that_launch_different_work_are_unstable(trace, fake):
    turn = [0]

    def call() -> None:
        turn[0] += 1
        kernel(fake, name=b"fast" if turn[0] % 2 else b"slow")

    got = measure(trace, fake, call, repeat=4)
    assert got.activities_stable is False


def test_a_call_that_skips_its_work_is_unstable_and_counted(trace, fake):
    turn = [0]

    def call() -> None:  # batch-and-skip: the first call does the work, the others nothing
        turn[0] += 1
        if turn[0] == 1:
            kernel(fake, duration=10_000)

    got = measure(trace, fake, call, repeat=4)
    assert got.activities_stable is False
    assert got.calls_without_activity == 3
    assert got.times_ms == [0.01, 0.0, 0.0, 0.0]


def test_an_api_call_without_gpu_work_times_nothing(trace, fake):
    got = measure(trace, fake, lambda: fake.fake_activity_launch(RUNTIME, 1, 0, None, 0, 0, 0, 0))
    assert got.calls_without_activity == 5
    assert got.activities_stable is True


def test_work_still_running_when_collected_is_reported(trace, fake):
    got = measure(trace, fake, lambda: kernel(fake, duration=STILL_RUNNING), repeat=2)
    assert got.escaped_activities == 2
    assert got.calls_without_activity == 2


def test_records_beyond_one_buffer_are_all_delivered(trace, fake, monkeypatch):
    monkeypatch.setattr(cupti_activity, "BUFFER_BYTES", 4096)  # a few records per buffer
    got = measure(trace, fake, lambda: [kernel(fake, duration=100) for _ in range(40)], repeat=3)
    assert got.activities_stable is True
    assert got.escaped_activities == 0
    assert got.dropped_records == 0


def test_timestamps_and_version_come_from_cupti(trace, fake):
    first = trace.timestamp()
    assert trace.timestamp() == first + 10
    assert trace.version() is not None and trace.version() > 0


def test_one_trace_at_a_time(trace, fake):
    other = ActivityTrace(library=fake._path, calibrate=False)
    with pytest.raises(cupti_activity.ActivityUnavailable, match="another activity trace"):
        other.start()


def test_a_missing_library_is_unavailable(tmp_path):
    with pytest.raises(cupti_activity.ActivityUnavailable):
        ActivityTrace(library=str(tmp_path / "libcupti.so.404"))


def test_the_record_offsets_match_the_toolkit_headers(tmp_path):
    """OFFSETS against offsetof() of every record version the reader may be handed."""
    checks = {
        "api": ["CUpti_ActivityAPI"],
        "kernel": [f"CUpti_ActivityKernel{v}" for v in range(4, 11)],
        "memcpy": ["CUpti_ActivityMemcpy", *[f"CUpti_ActivityMemcpy{v}" for v in range(3, 7)]],
        "memset": ["CUpti_ActivityMemset", *[f"CUpti_ActivityMemset{v}" for v in range(2, 5)]],
        "memcpy2": ["CUpti_ActivityMemcpyPtoP4"],
        "external": ["CUpti_ActivityExternalCorrelation"],
    }
    lines = ["#include <stdio.h>", "#include <stddef.h>", "#include <cupti.h>", "int main(void) {"]
    for family, types in checks.items():
        for type_name in types:
            for name in cupti_activity.OFFSETS[family]:
                lines.append(f'printf("{family} {type_name} {name} %zu\\n", offsetof({type_name}, {name}));')
    lines.append("return 0; }")
    source = tmp_path / "offsets.c"
    source.write_text("\n".join(lines))
    binary = tmp_path / "offsets"
    build = subprocess.run([c_compiler(), f"-I{cuda_include()}", str(source), "-o", str(binary)],
                           capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    out = subprocess.run([str(binary)], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        family, type_name, name, offset = line.split()
        assert cupti_activity.OFFSETS[family][name] == int(offset), (type_name, name)
    kinds = subprocess.run(
        [c_compiler(), f"-I{cuda_include()}", "-x", "c", "-", "-o", str(tmp_path / "kinds")],
        input="#include <stdio.h>\n#include <cupti.h>\nint main(void){printf(\"%d %d %d %d %d %d %d\","
        " CUPTI_ACTIVITY_KIND_MEMCPY, CUPTI_ACTIVITY_KIND_MEMSET, CUPTI_ACTIVITY_KIND_DRIVER,"
        " CUPTI_ACTIVITY_KIND_RUNTIME, CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,"
        " CUPTI_ACTIVITY_KIND_MEMCPY2, CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION); return 0;}",
        capture_output=True, text=True)
    assert kinds.returncode == 0, kinds.stderr
    values = subprocess.run([str(tmp_path / "kinds")], capture_output=True, text=True).stdout.split()
    names = ["MEMCPY", "MEMSET", "DRIVER", "RUNTIME", "CONCURRENT_KERNEL", "MEMCPY2",
             "EXTERNAL_CORRELATION"]
    assert {n: KIND[n] for n in names} == dict(zip(names, map(int, values)))


def measure_on_real_clock(fake, ticks_per_ns: float, duration: int, repeat: int) -> timer.Measured:
    """Kernels of ``duration`` ticks timed by a calibrating trace while the stand-in's clock
    follows real time at ``ticks_per_ns``."""
    fake.fake_set_real_clock(ticks_per_ns)
    try:
        t = ActivityTrace(library=fake._path)  # type: ignore[attr-defined]
        t.start()
        try:
            return timer.measure_activity(lambda: kernel(fake, duration=duration), repeat,
                                          flush(fake), lambda: None, t, grace_s=0)
        finally:
            t.stop()
    finally:
        fake.fake_set_real_clock(0)


def test_a_clock_in_cpu_ticks_is_calibrated_to_nanoseconds(fake):
    # torch.profiler (Kineto) registers a CUPTI timestamp callback counting CPU ticks (~2.1 per
    # ns on an H100 host); the trace measures the rate, so a 1 ms kernel still reads 1 ms.
    got = measure_on_real_clock(fake, 2.1, duration=2_100_000, repeat=5)
    assert got.ticks_per_ns == pytest.approx(2.1, rel=2e-3)
    assert got.times_ms == pytest.approx([1.0] * 5, rel=2e-3)


def test_the_calibration_keeps_the_tightest_of_several_clock_readings(fake, monkeypatch):
    # On a loaded host the thread can be preempted between a clock pair's reads; one such pair
    # at one end of the calibration window skews the rate (here the first read: by ~5 %).
    t = ActivityTrace(library=fake._path)  # type: ignore[attr-defined]
    calls = itertools.count()

    def first_read_preempted() -> int:
        if next(calls) == 0:
            time.sleep(0.002)
        return int(time.perf_counter_ns() * 2.1)

    monkeypatch.setattr(t, "timestamp", first_read_preempted)
    t._anchor = t._clock_pair()
    assert t.ticks_per_ns() == pytest.approx(2.1, rel=1e-3)


def test_a_clock_in_nanoseconds_is_taken_as_exactly_that(fake):
    got = measure_on_real_clock(fake, 1.0, duration=2_000, repeat=3)
    assert got.ticks_per_ns == 1.0
    assert got.times_ms == [0.002] * 3
