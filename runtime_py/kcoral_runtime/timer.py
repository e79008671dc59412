"""The benchmark timer: each timed call's time is the span of the GPU work it launched.

Flow of one timed call (activity timing, the default wherever libcupti loads)::

    own():  reset persisting L2 -> overwrite the flush buffer        (tagged as the timer's own)
    device synchronize
    t0 = CUPTI timestamp
    fn(*args)                                                         (any stream, any thread)
    t1 = CUPTI timestamp
    device synchronize                                                (every stream drained)

After the calls, CUPTI's buffers are collected and ``attribute`` assigns the GPU work:

* a runtime/driver API call that *entered* inside ``[t0, t1]``, on any thread, belongs to the
  call; every kernel, memcpy and memset correlated with it is the call's work, whenever and on
  whichever stream it ran. The call's time is the span from its work's first start to its last
  end (host gaps between launches included, as upstream KCoral defines it);
* work of the timer's own tagged calls is left out;
* any other work seen while tracing — launched between calls, during the timer's flush by
  another thread, or after the last call (a thread or host callback the call left behind) — is
  **escaped work**: it is counted in ``escaped_activities`` and ``escaped_work`` is true;
* ``activities_stable`` is true when every call launched the same multiset of work (kernel
  name and launch shape; copy/set kind and size), false otherwise (a call that caches, skips or
  alternates its work).

Without CUPTI, ``measure_events`` brackets each call with CUDA events on the current stream and
closes it with a device-wide synchronize before the end event, so work on other streams cannot
escape (the end event then also carries the synchronize's return, a few microseconds).
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .cupti_activity import ActivityTrace, Batch, GpuRecord

__all__ = [
    "Attribution",
    "CallWork",
    "attribute",
    "measure_activity",
    "measure_events",
    "Measured",
]

# How long tracing stays on after the last call, to see work a call left behind (a thread or a
# host callback launching after the call returned).
ESCAPE_GRACE_S = 0.01


@dataclass
class CallWork:
    """The GPU work attributed to one timed call."""

    window: Tuple[int, int]  # host [t0, t1] on CUPTI's clock
    records: List[GpuRecord] = field(default_factory=list)

    @property
    def span(self) -> Optional[Tuple[int, int]]:
        first = last = 0
        for r in self.records:
            if r.end >= r.start > 0:
                if not first or r.start < first:
                    first = r.start
                if r.end > last:
                    last = r.end
        return (first, last) if first else None

    @property
    def time_ms(self) -> Optional[float]:
        span = self.span
        return None if span is None else (span[1] - span[0]) / 1e6

    def identity(self) -> Counter:
        return Counter(r.identity for r in self.records)


@dataclass
class Attribution:
    calls: List[CallWork]
    escaped: List[GpuRecord]
    incomplete: int  # records without a valid end (still running when collected)

    @property
    def activities_stable(self) -> bool:
        if not self.calls:
            return True
        first = self.calls[0].identity()
        return all(c.identity() == first for c in self.calls[1:])

    @property
    def calls_without_activity(self) -> int:
        return sum(1 for c in self.calls if c.span is None)


def attribute(windows: Sequence[Tuple[int, int]], batch: Batch) -> Attribution:
    """Assign ``batch``'s GPU records to the call windows (module docstring)."""
    starts: List[Tuple[int, int]] = sorted((a.start, a.correlation_id) for a in batch.api)
    keys = [s for s, _ in starts]
    owner: Dict[int, int] = {}  # correlation id -> window index
    for index, (t0, t1) in enumerate(windows):
        for position in range(bisect.bisect_left(keys, t0), bisect.bisect_right(keys, t1)):
            correlation = starts[position][1]
            if correlation not in batch.own:
                owner[correlation] = index
    calls = [CallWork(window=(t0, t1)) for t0, t1 in windows]
    escaped: List[GpuRecord] = []
    incomplete = 0
    for record in batch.gpu:
        if record.correlation_id in batch.own:
            continue
        if not (record.end >= record.start > 0):
            incomplete += 1
        index = owner.get(record.correlation_id)
        if index is None:
            escaped.append(record)
        else:
            calls[index].records.append(record)
    return Attribution(calls, escaped, incomplete)


@dataclass
class Measured:
    """What a timing loop returns: per-call times and what it saw."""

    times_ms: List[float]
    spans: List[Optional[Tuple[int, int]]]  # per call, on ``clock``'s scale (for throttle windows)
    timing: str  # "cupti_activity" or "cuda_events_device_sync"
    activities_stable: Optional[bool] = None
    escaped_activities: Optional[int] = None
    calls_without_activity: int = 0
    dropped_records: int = 0
    threads_started: int = 0
    kernels: List[str] = field(default_factory=list)  # names of the first call's kernels
    ticks_per_ns: float = 1.0  # the CUPTI clock's rate the spans were divided by


def _thread_count() -> int:
    try:
        import os

        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def measure_activity(
    call: Callable[[], Any],
    repeat: int,
    prepare: Callable[[], None],
    sync: Callable[[], None],
    trace: ActivityTrace,
    grace_s: float = ESCAPE_GRACE_S,
) -> Measured:
    """Time ``repeat`` calls by CUPTI activity (module docstring). ``prepare`` runs before each
    call as the timer's own work (the L2 reset and flush); ``sync`` drains the device. The trace
    must be started; it is collected here."""
    threads_before = _thread_count()
    windows: List[Tuple[int, int]] = []
    sync()
    trace.collect()  # nothing from before the first call counts
    timestamp = trace.timestamp
    for _ in range(repeat):
        trace.begin_own()
        try:
            prepare()
        finally:
            trace.end_own()
        sync()
        t0 = timestamp()
        call()
        t1 = timestamp()
        sync()
        windows.append((t0, t1))
    if grace_s > 0:
        time.sleep(grace_s)
        sync()
    batch = trace.collect()
    rate = trace.ticks_per_ns()
    found = attribute(windows, batch)
    times: List[float] = []
    spans: List[Optional[Tuple[int, int]]] = []
    for work in found.calls:
        span = work.span
        spans.append(span)
        times.append(0.0 if span is None else (span[1] - span[0]) / rate / 1e6)
    kernels = [r.name for r in found.calls[0].records if r.identity[0] == "kernel"] if found.calls else []
    return Measured(
        times_ms=times,
        spans=spans,
        timing="cupti_activity",
        activities_stable=found.activities_stable,
        escaped_activities=len(found.escaped) + found.incomplete,
        calls_without_activity=found.calls_without_activity,
        dropped_records=batch.dropped,
        threads_started=max(0, _thread_count() - threads_before),
        kernels=kernels[:16],
        ticks_per_ns=rate,
    )


def measure_events(
    call: Callable[[], Any],
    repeat: int,
    prepare: Callable[[], None],
    torch: Any,
) -> Measured:
    """Time ``repeat`` calls with CUDA events closed by a device-wide synchronize (no CUPTI)."""
    device = torch.cuda.current_device()
    stream = torch.cuda.current_stream(device)
    times: List[float] = []
    spans: List[Optional[Tuple[int, int]]] = []
    torch.cuda.synchronize(device)
    for _ in range(repeat):
        prepare()
        torch.cuda.synchronize(device)
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        host0 = time.monotonic_ns()
        start.record(stream)
        call()
        torch.cuda.synchronize(device)  # every stream, so nothing escapes the end event
        end.record(stream)
        end.synchronize()
        host1 = time.monotonic_ns()
        times.append(float(start.elapsed_time(end)))
        spans.append((host0, host1))
    return Measured(times_ms=times, spans=spans, timing="cuda_events_device_sync")
