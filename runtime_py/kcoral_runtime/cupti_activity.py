"""CUPTI's activity API through ctypes: every kernel, memcpy and memset the process runs, with
the runtime/driver API call that launched it.

The timer (``timer.py``) reads GPU work through this module; it never sees CUDA events::

    trace = ActivityTrace()          # loads libcupti (cuda_guard.load_cupti), nothing enabled
    trace.start()                    # enable kinds, register buffer callbacks
    t0 = trace.timestamp()           # CUPTI's clock: the same ns scale as every record
    ...launch work, any stream, any thread...
    with trace.own():                # API calls of this thread in here are tagged as ours
        ...the timer's own launches (the L2 flush)...
    batch = trace.collect()          # flush CUPTI's buffers: a Batch of records since the last one
    trace.stop()                     # disable kinds (records still buffered are delivered first)

What a ``Batch`` holds:

* ``api``: one ``ApiRecord`` per runtime (``cuda*``) or driver (``cu*``) API call, with its
  start/end timestamps, thread id and correlation id. GPU work points back at the call that
  launched it through that correlation id, whichever thread made the call.
* ``gpu``: one ``GpuRecord`` per kernel (``CONCURRENT_KERNEL``: kernels are not serialized),
  memcpy (including peer-to-peer) and memset, with GPU start/end, stream, correlation id and an
  identity (kind, name, bytes, launch shape) used to tell whether two calls launched the same
  work.
* ``own``: the correlation ids that ``cuptiActivityPushExternalCorrelationId`` tagged while the
  timer was inside ``own()``: those API calls are the timer's own, made on the timer's thread.
  A call another thread makes meanwhile is not tagged.
* ``dropped``: records CUPTI dropped for want of buffer space (the timer reports them).

Record layouts. CUPTI delivers the record versions of the library that is loaded; the fields read
here sit at the same offsets in every version since CUDA 11 (``CUpti_ActivityKernel4`` to
``CUpti_ActivityKernel10``, ``Memcpy`` to ``Memcpy6``, ``Memset`` to ``Memset4``, ``MemcpyPtoP4``,
``API``, ``ExternalCorrelation``): CUPTI appends fields, never moves them.
``runtime_py/tests/test_timer.py`` compiles the toolkit's headers and checks every offset in
``OFFSETS`` against them. Each family is read with one precompiled ``struct`` (``_LAYOUTS``): the
records are parsed in Python after the timed calls, so their cost is per record, not per field.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, NamedTuple, Optional, Sequence, Set, Tuple

from .cuda_guard import GuardUnavailable, load_cupti

__all__ = [
    "ActivityTrace",
    "ActivityUnavailable",
    "ApiRecord",
    "Batch",
    "GpuRecord",
    "KIND",
    "OFFSETS",
]

CUPTI_SUCCESS = 0
CUPTI_ERROR_MAX_LIMIT_REACHED = 12
CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0 = 3

# CUpti_ActivityKind values (cupti_activity.h).
KIND = {
    "MEMCPY": 1,
    "MEMSET": 2,
    "DRIVER": 4,
    "RUNTIME": 5,
    "CONCURRENT_KERNEL": 10,
    "MEMCPY2": 22,
    "EXTERNAL_CORRELATION": 39,
}
_API_KINDS = (KIND["DRIVER"], KIND["RUNTIME"])
_GPU_KINDS = (KIND["CONCURRENT_KERNEL"], KIND["MEMCPY"], KIND["MEMSET"], KIND["MEMCPY2"])
ENABLED_KINDS = (*_API_KINDS, *_GPU_KINDS, KIND["EXTERNAL_CORRELATION"])

# Byte offsets of the fields read, per record family (checked against the headers by a test).
OFFSETS: Dict[str, Dict[str, int]] = {
    "api": {"cbid": 4, "start": 8, "end": 16, "processId": 24, "threadId": 28, "correlationId": 32},
    "kernel": {
        "start": 16, "end": 24, "deviceId": 40, "contextId": 44, "streamId": 48,
        "gridX": 52, "gridY": 56, "gridZ": 60, "blockX": 64, "blockY": 68, "blockZ": 72,
        "correlationId": 92, "name": 104,
    },
    "memcpy": {"copyKind": 4, "bytes": 8, "start": 16, "end": 24, "deviceId": 32, "streamId": 40,
               "correlationId": 44},
    "memset": {"value": 4, "bytes": 8, "start": 16, "end": 24, "deviceId": 32, "streamId": 40,
               "correlationId": 44},
    "memcpy2": {"copyKind": 4, "bytes": 8, "start": 16, "end": 24, "correlationId": 60},
    "external": {"externalKind": 4, "externalId": 8, "correlationId": 16},
}

BUFFER_BYTES = 8 << 20

# CUPTI's clock is in ns unless a timestamp callback was registered in the process
# (cuptiActivityRegisterTimestampCallback: torch.profiler's Kineto registers one that counts CPU
# ticks, ~2.1 per ns on the H100 hosts measured, and it stays after the profiler ends). The
# trace measures the clock's rate against perf_counter over at least CALIBRATION_NS; a rate
# within SNAP of 1 is taken as exactly 1.
CALIBRATION_NS = 20_000_000
SNAP = 0.002

_u32 = struct.Struct("<I")


def _layout(family: str, fields: Sequence[Tuple[str, str]]) -> Tuple[int, struct.Struct]:
    """One struct reading ``fields`` (name, struct code) of ``family`` in one call: the offset of
    the first field and the format, padded between fields after ``OFFSETS``."""
    offsets = OFFSETS[family]
    first = offsets[fields[0][0]]
    fmt, at = "<", first
    for name, code in fields:
        gap = offsets[name] - at
        if gap < 0:
            raise ValueError(f"{family}.{name}: fields out of order")
        fmt += f"{gap}x" if gap else ""
        fmt += code
        at = offsets[name] + struct.calcsize("<" + code)
    return first, struct.Struct(fmt)


_LAYOUTS = {
    "api": _layout("api", [("cbid", "I"), ("start", "Q"), ("end", "Q"), ("threadId", "I"),
                           ("correlationId", "I")]),
    "kernel": _layout("kernel", [("start", "Q"), ("end", "Q"), ("streamId", "I"), ("gridX", "I"),
                                 ("gridY", "I"), ("gridZ", "I"), ("blockX", "I"), ("blockY", "I"),
                                 ("blockZ", "I"), ("correlationId", "I"), ("name", "Q")]),
    "memcpy": _layout("memcpy", [("copyKind", "B"), ("bytes", "Q"), ("start", "Q"), ("end", "Q"),
                                 ("streamId", "I"), ("correlationId", "I")]),
    "memset": _layout("memset", [("value", "I"), ("bytes", "Q"), ("start", "Q"), ("end", "Q"),
                                 ("streamId", "I"), ("correlationId", "I")]),
    "memcpy2": _layout("memcpy2", [("copyKind", "B"), ("bytes", "Q"), ("start", "Q"), ("end", "Q"),
                                   ("correlationId", "I")]),
    "external": _layout("external", [("externalKind", "I"), ("externalId", "Q"),
                                     ("correlationId", "I")]),
}


class ActivityUnavailable(Exception):
    """CUPTI's activity API cannot be used here (no libcupti, a symbol missing, an error)."""


class ApiRecord(NamedTuple):
    """One runtime or driver API call, from its entry to its return (CUPTI timestamps)."""

    kind: int  # KIND["RUNTIME"] or KIND["DRIVER"]
    cbid: int
    start: int
    end: int
    thread_id: int
    correlation_id: int


class GpuRecord(NamedTuple):
    """One kernel, memcpy or memset as the GPU ran it (CUPTI timestamps)."""

    kind: int
    start: int
    end: int
    stream_id: int
    correlation_id: int
    identity: Tuple[object, ...]  # what makes two calls' work "the same"
    name: str = ""


@dataclass
class Batch:
    api: List[ApiRecord] = field(default_factory=list)
    gpu: List[GpuRecord] = field(default_factory=list)
    own: Set[int] = field(default_factory=set)
    dropped: int = 0


# --------------------------------------------------------------------------- record parsing


_KERNEL = KIND["CONCURRENT_KERNEL"]
_MEMCPY = KIND["MEMCPY"]
_MEMSET = KIND["MEMSET"]
_MEMCPY2 = KIND["MEMCPY2"]
_EXTERNAL = KIND["EXTERNAL_CORRELATION"]


def parse_record(data: "bytes | memoryview", offset: int, name_of: "NameReader"
                 ) -> Tuple[str, object]:
    """One record at ``offset`` of ``data`` -> ("api"|"gpu"|"external"|"other", value)."""
    kind = _u32.unpack_from(data, offset)[0]
    if kind in _API_KINDS:
        at, layout = _LAYOUTS["api"]
        cbid, start, end, thread, correlation = layout.unpack_from(data, offset + at)
        return "api", ApiRecord(kind, cbid, start, end, thread, correlation)
    if kind == _KERNEL:
        at, layout = _LAYOUTS["kernel"]
        start, end, stream, gx, gy, gz, bx, by, bz, correlation, pointer = \
            layout.unpack_from(data, offset + at)
        name = name_of(pointer)
        return "gpu", GpuRecord(kind, start, end, stream, correlation,
                                ("kernel", name, (gx, gy, gz, bx, by, bz)), name)
    if kind == _MEMCPY:
        at, layout = _LAYOUTS["memcpy"]
        copy_kind, nbytes, start, end, stream, correlation = layout.unpack_from(data, offset + at)
        return "gpu", GpuRecord(kind, start, end, stream, correlation,
                                ("memcpy", nbytes, copy_kind), "memcpy")
    if kind == _MEMSET:
        at, layout = _LAYOUTS["memset"]
        value, nbytes, start, end, stream, correlation = layout.unpack_from(data, offset + at)
        return "gpu", GpuRecord(kind, start, end, stream, correlation,
                                ("memset", nbytes, value), "memset")
    if kind == _MEMCPY2:
        at, layout = _LAYOUTS["memcpy2"]
        copy_kind, nbytes, start, end, correlation = layout.unpack_from(data, offset + at)
        return "gpu", GpuRecord(kind, start, end, 0, correlation,
                                ("memcpy_p2p", nbytes, copy_kind), "memcpy_p2p")
    if kind == _EXTERNAL:
        at, layout = _LAYOUTS["external"]
        return "external", layout.unpack_from(data, offset + at)
    return "other", kind


class NameReader:
    """Kernel names by pointer, read once each (CUPTI keeps the strings alive)."""

    def __init__(self) -> None:
        self._names: Dict[int, str] = {}

    def __call__(self, pointer: int) -> str:
        if not pointer:
            return ""
        name = self._names.get(pointer)
        if name is None:
            name = ctypes.string_at(pointer).decode("utf-8", "replace")
            self._names[pointer] = name
        return name


# --------------------------------------------------------------------------- the binding

_REQUEST_TYPE = ctypes.CFUNCTYPE(
    None,
    ctypes.POINTER(ctypes.c_void_p),
    ctypes.POINTER(ctypes.c_size_t),
    ctypes.POINTER(ctypes.c_size_t),
)
_COMPLETE_TYPE = ctypes.CFUNCTYPE(
    None, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t
)


class _Api:
    """The activity entry points of one loaded libcupti, with their C signatures."""

    def __init__(self, lib: ctypes.CDLL, path: str) -> None:
        self.path = path

        def fn(name: str, argtypes: list) -> ctypes._CFuncPtr:  # type: ignore[name-defined]
            try:
                f = getattr(lib, name)
            except AttributeError as exc:
                raise ActivityUnavailable(f"{path} has no {name}") from exc
            f.argtypes = argtypes
            f.restype = ctypes.c_int
            return f

        self.enable = fn("cuptiActivityEnable", [ctypes.c_int])
        self.disable = fn("cuptiActivityDisable", [ctypes.c_int])
        self.register = fn("cuptiActivityRegisterCallbacks", [_REQUEST_TYPE, _COMPLETE_TYPE])
        self.flush_all = fn("cuptiActivityFlushAll", [ctypes.c_uint32])
        self.next_record = fn(
            "cuptiActivityGetNextRecord",
            [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p)],
        )
        self.dropped = fn(
            "cuptiActivityGetNumDroppedRecords",
            [ctypes.c_void_p, ctypes.c_uint32, ctypes.POINTER(ctypes.c_size_t)],
        )
        self.get_timestamp = fn("cuptiGetTimestamp", [ctypes.POINTER(ctypes.c_uint64)])
        self.push_external = fn(
            "cuptiActivityPushExternalCorrelationId", [ctypes.c_int, ctypes.c_uint64]
        )
        self.pop_external = fn(
            "cuptiActivityPopExternalCorrelationId", [ctypes.c_int, ctypes.POINTER(ctypes.c_uint64)]
        )
        try:
            self.get_version = fn("cuptiGetVersion", [ctypes.POINTER(ctypes.c_uint32)])
        except ActivityUnavailable:
            self.get_version = None


_apis: Dict[str, _Api] = {}
_trace_lock = threading.Lock()
_active_trace: Optional["ActivityTrace"] = None
_own_ids = itertools.count(1)


def _on_request(buffer, size, max_records) -> None:  # type: ignore[no-untyped-def]
    trace = _active_trace
    try:
        if trace is None:
            buffer[0] = None
            size[0] = 0
            return
        address, nbytes = trace._new_buffer()
        buffer[0] = address
        size[0] = nbytes
        max_records[0] = 0
    except BaseException:
        buffer[0] = None
        size[0] = 0


def _on_complete(context, stream_id, buffer, size, valid_size) -> None:  # type: ignore[no-untyped-def]
    trace = _active_trace
    try:
        if trace is not None and buffer:
            trace._take_buffer(buffer, valid_size)
    except BaseException:
        pass


_popped = ctypes.c_uint64()  # where cuptiActivityPopExternalCorrelationId writes (unused)

# Module lifetime: CUPTI may call them for as long as the process lives.
_REQUEST = _REQUEST_TYPE(_on_request)
_COMPLETE = _COMPLETE_TYPE(_on_complete)


class ActivityTrace:
    """Activity records of this process between ``start()`` and ``stop()`` (module docstring).

    One trace at a time per process. ``library``: a libcupti path instead of the search (tests).
    ``calibrate``: measure the clock's rate (``ticks_per_ns``); the tests' stand-in clock is a
    counter, not a clock, and they turn it off.
    """

    def __init__(self, library: Optional[str] = None, calibrate: bool = True) -> None:
        try:
            cupti = load_cupti(library)
        except GuardUnavailable as exc:
            raise ActivityUnavailable(str(exc)) from exc
        api = _apis.get(cupti.path)
        if api is None:
            api = _Api(cupti.lib, cupti.path)
            _apis[cupti.path] = api
        self.api = api
        self.path = cupti.path
        self._buffers: Dict[int, ctypes.Array] = {}  # address -> buffer (kept alive)
        self._free: List[ctypes.Array] = []
        self._lock = threading.Lock()
        self._pending = Batch()
        self._filled: List[Tuple[int, int]] = []  # (address, valid bytes), parsed at collect()
        self._external: Dict[int, int] = {}  # correlation id -> external id (tagged calls)
        self._own_external: Set[int] = set()
        self._names = NameReader()
        self._sizes: Optional[Dict[int, int]] = {}  # record kind -> bytes (_record_offsets)
        self._enabled: List[int] = []
        self.calibrate = calibrate
        self._anchor: Optional[Tuple[int, int]] = None  # (CUPTI clock, perf_counter_ns)

    # ----------------------------------------------------------------- lifecycle

    def start(self) -> None:
        global _active_trace
        with _trace_lock:
            if _active_trace is not None:
                raise ActivityUnavailable("another activity trace is running in this process")
            _active_trace = self
        try:
            # Every start: another activity client in the process (torch.profiler's Kineto)
            # may have registered its own buffer callbacks since the last trace.
            self._check(self.api.register(_REQUEST, _COMPLETE), "cuptiActivityRegisterCallbacks")
            with self._lock:  # buffers ready before timing: none is zeroed while calls run
                while len(self._free) < 2:
                    self._free.append(ctypes.create_string_buffer(BUFFER_BYTES))
            for kind in ENABLED_KINDS:
                self._check(self.api.enable(kind), f"cuptiActivityEnable({kind})")
                self._enabled.append(kind)
            if self.calibrate:
                self._anchor = self._clock_pair()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Disable every kind this trace enabled; records still buffered are dropped."""
        global _active_trace
        try:
            if self._enabled:
                self.api.flush_all(0)
        finally:
            for kind in reversed(self._enabled):
                self.api.disable(kind)
            self._enabled = []
            with self._lock:
                filled, self._filled = self._filled, []
            for address, _ in filled:
                self._release(address)
            with _trace_lock:
                if _active_trace is self:
                    _active_trace = None

    def __enter__(self) -> "ActivityTrace":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ----------------------------------------------------------------- use

    def timestamp(self) -> int:
        """CUPTI's clock in ns, the clock of every record's start and end."""
        value = ctypes.c_uint64()
        self._check(self.api.get_timestamp(ctypes.byref(value)), "cuptiGetTimestamp")
        return int(value.value)

    def _clock_pair(self, tries: int = 5) -> Tuple[int, int]:
        """A CUPTI reading and the perf_counter instant it was taken at: of ``tries`` readings
        bracketed by two perf_counter reads, the one with the tightest bracket (a thread
        preempted between the reads of one pair would skew the rate on a loaded host)."""
        best: Optional[Tuple[int, int, int]] = None
        for _ in range(tries):
            before = time.perf_counter_ns()
            ticks = self.timestamp()
            after = time.perf_counter_ns()
            if best is None or after - before < best[0]:
                best = (after - before, ticks, (before + after) // 2)
        assert best is not None
        return best[1], best[2]

    def ticks_per_ns(self) -> float:
        """CUPTI clock ticks per nanosecond since ``start()`` (1.0 when within ``SNAP`` of it, or
        without calibration). Waits until ``CALIBRATION_NS`` have passed since the start."""
        if not self.calibrate or self._anchor is None:
            return 1.0
        ticks0, real0 = self._anchor
        while True:
            ticks1, real1 = self._clock_pair()
            if real1 - real0 >= CALIBRATION_NS:
                break
            time.sleep((CALIBRATION_NS - (real1 - real0)) / 1e9)
        rate = (ticks1 - ticks0) / (real1 - real0)
        return 1.0 if abs(rate - 1.0) <= SNAP else rate

    @contextlib.contextmanager
    def own(self) -> Iterator[None]:
        """API calls this thread makes inside are the timer's own (tagged by external id)."""
        self.begin_own()
        try:
            yield
        finally:
            self.end_own()

    def begin_own(self) -> None:
        """``own()`` without the context manager (the timer's loop): tag this thread's calls."""
        tag = next(_own_ids)
        self._check(
            self.api.push_external(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, tag),
            "cuptiActivityPushExternalCorrelationId",
        )
        self._own_external.add(tag)

    def end_own(self) -> None:
        """Ends what ``begin_own`` started."""
        self.api.pop_external(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, ctypes.byref(_popped))

    def collect(self) -> Batch:
        """Deliver every buffered record (``cuptiActivityFlushAll``) and return them, parsed.

        Buffers CUPTI completes while calls run are only queued (its callback may run on its own
        thread, and parsing there would take the interpreter from the timed thread); they are all
        parsed here, after the calls."""
        self._check(self.api.flush_all(1), "cuptiActivityFlushAll")  # 1: flush incomplete too
        with self._lock:
            filled, self._filled = self._filled, []
        for address, valid in filled:
            try:
                self._parse_buffer(address, valid)
            finally:
                self._release(address)
        with self._lock:
            batch, self._pending = self._pending, Batch()
            external, self._external = self._external, {}
        batch.own = {c for c, tag in external.items() if tag in self._own_external}
        return batch

    def version(self) -> Optional[int]:
        if self.api.get_version is None:
            return None
        value = ctypes.c_uint32()
        if self.api.get_version(ctypes.byref(value)) != CUPTI_SUCCESS:
            return None
        return int(value.value)

    # ----------------------------------------------------------------- buffers

    def _new_buffer(self) -> Tuple[int, int]:
        with self._lock:
            buf = self._free.pop() if self._free else ctypes.create_string_buffer(BUFFER_BYTES)
            address = ctypes.addressof(buf)
            self._buffers[address] = buf
        return address, BUFFER_BYTES

    def _take_buffer(self, address: int, valid: int) -> None:
        """CUPTI handed back a buffer: queue it for ``collect`` (the next flush)."""
        with self._lock:
            self._filled.append((address, valid))

    def _release(self, address: int) -> None:
        with self._lock:
            buf = self._buffers.pop(address, None)
            if buf is not None and len(self._free) < 4:
                self._free.append(buf)

    def _parse_buffer(self, address: int, valid: int) -> None:
        data = memoryview((ctypes.c_char * valid).from_address(address)) if valid else b""
        api: List[ApiRecord] = []
        gpu: List[GpuRecord] = []
        external: Dict[int, int] = {}
        for offset in self._record_offsets(address, valid, data):
            family, value = parse_record(data, offset, self._names)
            if family == "api":
                api.append(value)  # type: ignore[arg-type]
            elif family == "gpu":
                gpu.append(value)  # type: ignore[arg-type]
            elif family == "external":
                ext_kind, ext_id, correlation = value  # type: ignore[misc]
                if ext_kind == CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0:
                    external[correlation] = ext_id
        dropped = ctypes.c_size_t()
        if self.api.dropped(None, 0, ctypes.byref(dropped)) != CUPTI_SUCCESS:
            dropped.value = 0
        with self._lock:
            self._pending.api.extend(api)
            self._pending.gpu.extend(gpu)
            self._pending.dropped += int(dropped.value)
            self._external.update(external)

    def _record_offsets(self, address: int, valid: int, data: "bytes | memoryview"
                        ) -> Iterator[int]:
        """The offset of every record of a completed buffer, in order.

        ``cuptiActivityGetNextRecord`` finds each record; it costs a foreign call per record,
        about half of the parsing. Every record of one kind has the same size in a loaded
        CUPTI, so the walk learns each kind's size from CUPTI's own answer the first time it
        meets the kind and then steps over the kind's records itself. A step that lands on a
        kind this trace does not enable, or past the buffer, is not trusted: the walk asks
        CUPTI again from the last record it found and stops learning (``_sizes`` is None)."""
        record = ctypes.c_void_p()
        if not valid or self.api.next_record(address, valid, ctypes.byref(record)) != CUPTI_SUCCESS:
            return
        offset = record.value - address
        while True:
            yield offset
            kind = _u32.unpack_from(data, offset)[0]
            sizes = self._sizes
            size = sizes.get(kind) if sizes is not None else None
            if size is not None:
                following = offset + size
                if following >= valid:
                    if following == valid:
                        return
                elif _u32.unpack_from(data, following)[0] in ENABLED_KINDS:
                    offset = following
                    continue
                self._sizes = None  # a learned size led astray: CUPTI walks the rest
            record.value = address + offset
            if self.api.next_record(address, valid, ctypes.byref(record)) != CUPTI_SUCCESS:
                return  # CUPTI_ERROR_MAX_LIMIT_REACHED: the end of the buffer
            following = record.value - address
            if self._sizes is not None and following > offset:
                self._sizes[kind] = following - offset
            offset = following

    def _check(self, code: int, what: str) -> None:
        if code != CUPTI_SUCCESS:
            raise ActivityUnavailable(f"{what} failed with CUPTI error {code} ({self.path})")
