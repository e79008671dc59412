"""One benchmark measurement on the worker's CUDA device, shared by ``kcoral_runtime.builtins``
and the upstream-compatible ``kcoral.builtins``.

    measure(fn, args, settings)
      |- warmup calls, each after a cold-L2 preparation (untimed)
      |- NVML sampler on (gpu_state.Sampler, CUPTI's clock)          -> the receipt's clocks
      |- CUPTI activity trace on (timer.measure_activity)            -> per-call GPU spans
      |     or, without libcupti, CUDA events + device synchronize   (timer.measure_events)
      |- fixed count, or adaptive rounds until the median's 95 % CI half-width <= target
      |- throttled calls flagged (their span overlaps an NVML throttle window), optionally dropped
      '- result dict: upstream's keys + ci95, flags, receipt (docs/timing.md lists every field)

Cold L2 (``flush_l2``): before every call, warmup included and outside the timed span, the
persisting-L2 lines are reset and the persisting limit set to 0 (``cuCtxResetPersistingL2Cache``,
``cuCtxSetLimit(CU_LIMIT_PERSISTING_L2_CACHE_SIZE, 0)``: a carve-out a call set up survives a
plain overwrite), then a buffer of twice the L2 (at least 64 MiB) is overwritten.
"""

from __future__ import annotations

import ctypes
import datetime
import platform
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .errors import ExecutionError
from .timer import Measured, measure_activity, measure_events
from .timing_stats import relative_half_width, summarize_times

__all__ = ["Settings", "measure", "flush_buffer_bytes", "throttled_calls"]

CU_LIMIT_PERSISTING_L2_CACHE_SIZE = 0x06
DRIVER_LIBRARY = "libcuda.so.1"  # the CUDA driver (tests point it at a stand-in)
MAX_ADAPTIVE_CALLS = 100_000


def flush_buffer_bytes(l2_cache_bytes: int) -> int:
    """Size of the buffer written between calls: twice the L2, at least 64 MiB."""
    return max(2 * int(l2_cache_bytes), 64 << 20)


@dataclass
class Settings:
    warmup: int = 25
    repeat: int = 100
    flush_l2: bool = True
    adaptive: bool = False
    target_rel_ci: float = 0.005
    budget_s: float = 10.0
    discard_throttled: bool = False
    sample_interval_s: float = 0.002


def check_settings(label: str, settings: Settings) -> None:
    def count(name: str, value: Any, minimum: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ExecutionError("runtime", f"{label}: {name} must be an integer >= {minimum}")

    def flag(name: str, value: Any) -> None:
        if not isinstance(value, bool):
            raise ExecutionError("runtime", f"{label}: {name} must be a bool")

    def positive(name: str, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ExecutionError("runtime", f"{label}: {name} must be a number > 0")

    count("warmup", settings.warmup, 0)
    count("repeat", settings.repeat, 1)
    flag("flush_l2", settings.flush_l2)
    flag("adaptive", settings.adaptive)
    flag("discard_throttled", settings.discard_throttled)
    positive("target_rel_ci", settings.target_rel_ci)
    positive("budget_s", settings.budget_s)
    positive("sample_interval_s", settings.sample_interval_s)


def cuda_torch(label: str) -> Any:
    try:
        import torch
    except ImportError:
        raise ExecutionError("unavailable", f"{label} requires a CUDA device") from None
    if not torch.cuda.is_available():
        raise ExecutionError("unavailable", f"{label} requires a CUDA device")
    return torch


# --------------------------------------------------------------------------- cold L2


class _PersistingL2:
    """The driver calls that undo a persisting-L2 carve-out and notice one (None where libcuda
    lacks them). ``seen``: how many checks found the persisting limit above 0, i.e. after how
    many calls the code under test had set up a carve-out (each check follows one call)."""

    def __init__(self) -> None:
        self.reset: Optional[Any] = None
        self.set_limit: Optional[Any] = None
        self.get_limit: Optional[Any] = None
        self.seen = 0
        try:
            lib = ctypes.CDLL(DRIVER_LIBRARY)
            self.reset = lib.cuCtxResetPersistingL2Cache
            self.reset.restype = ctypes.c_int
            self.set_limit = lib.cuCtxSetLimit
            self.set_limit.argtypes = [ctypes.c_int, ctypes.c_size_t]
            self.set_limit.restype = ctypes.c_int
            self.get_limit = lib.cuCtxGetLimit
            self.get_limit.argtypes = [ctypes.POINTER(ctypes.c_size_t), ctypes.c_int]
            self.get_limit.restype = ctypes.c_int
        except (OSError, AttributeError):
            self.reset = self.set_limit = self.get_limit = None

    @property
    def available(self) -> bool:
        return self.reset is not None

    def check(self) -> None:
        if self.get_limit is None:
            return
        value = ctypes.c_size_t(0)
        if self.get_limit(ctypes.byref(value), CU_LIMIT_PERSISTING_L2_CACHE_SIZE) == 0 \
                and value.value > 0:
            self.seen += 1

    def __call__(self) -> None:
        self.check()
        self.undo()

    def undo(self) -> None:
        if self.set_limit is not None:
            self.set_limit(CU_LIMIT_PERSISTING_L2_CACHE_SIZE, 0)
        if self.reset is not None:
            self.reset()


def preparation(torch: Any, device: int, flush_l2: bool
                ) -> Tuple[Callable[[], None], Optional[Dict[str, Any]], _PersistingL2]:
    """The untimed step before every call: with ``flush_l2``, undo any persisting-L2 carve-out
    and overwrite twice the L2; without, only notice a carve-out. Returns the step, the result's
    ``cold_l2`` block (None without ``flush_l2``) and the carve-out watcher."""
    persisting = _PersistingL2()
    persisting.undo()  # what earlier code left is not the measured code's
    if not flush_l2:
        return persisting.check, None, persisting
    l2 = int(torch.cuda.get_device_properties(device).L2_cache_size)
    size = flush_buffer_bytes(l2)
    buffer = torch.empty(size // 4, dtype=torch.int32, device=device)

    def prepare() -> None:
        persisting()
        buffer.zero_()

    return prepare, {
        "flush_bytes": size,
        "l2_bytes": l2,
        "persisting_l2_reset": persisting.available,
    }, persisting


# --------------------------------------------------------------------------- receipt


def _versions(torch: Any, cupti_version: Optional[int]) -> Dict[str, Any]:
    return {
        "torch": getattr(torch, "__version__", None),
        "cuda_runtime": getattr(getattr(torch, "version", None), "cuda", None),
        "cupti": cupti_version,
        "python": platform.python_version(),
    }


def _open_gpu_state(torch: Any, device: int) -> Tuple[Optional[Any], Optional[str]]:
    try:
        from . import gpu_state
    except ImportError as exc:  # pragma: no cover - the module ships with the runtime
        return None, f"gpu_state: {exc}"
    try:
        uuid = str(torch.cuda.get_device_properties(device).uuid)
    except Exception:
        uuid = None
    try:
        if uuid:
            return gpu_state.open_device(uuid=uuid), None
        return gpu_state.open_device(index=device), None
    except gpu_state.NvmlUnavailable as exc:
        return None, str(exc)
    except Exception as exc:
        return None, f"{type(exc).__name__}: {exc}"


def throttled_calls(spans: Sequence[Optional[Tuple[int, int]]],
                    windows: Sequence[Tuple[int, int]]) -> List[bool]:
    """Per call: whether its span overlaps one of the throttled windows."""
    flags: List[bool] = []
    for span in spans:
        if span is None:
            flags.append(False)
            continue
        flags.append(any(span[0] < end and start < span[1] for start, end in windows))
    return flags


# --------------------------------------------------------------------------- measure


def measure(label: str, fn: Callable[..., Any], args: Sequence[Any], settings: Settings,
            keep_times: bool = False, cupti_library: Optional[str] = None,
            calibrate_clock: bool = True,
            before_call: Optional[Callable[[], None]] = None) -> Dict[str, Any]:
    """Time ``fn(*args)`` on the current CUDA device (module docstring); the result dict, with
    every timed call's time under ``times_ms`` when ``keep_times``. ``cupti_library``: a libcupti
    path instead of the search and ``calibrate_clock=False`` for its counter clock (tests).
    ``before_call`` runs before every call (warmup included), untimed and before the cold-L2
    step, as the timer's own work (``kcoral eval`` gives each call fresh copies of its inputs
    there)."""
    if not callable(fn):
        raise ExecutionError("runtime", f"{label}: fn must be callable")
    check_settings(label, settings)
    torch = cuda_torch(label)
    device = torch.cuda.current_device()

    def call() -> None:
        fn(*args)

    def sync() -> None:
        torch.cuda.synchronize(device)

    prepare, cold_l2, persisting = preparation(torch, device, settings.flush_l2)
    if before_call is not None:
        flush = prepare

        def prepare() -> None:
            before_call()
            flush()

    sync()
    for _ in range(settings.warmup):
        prepare()
        call()
    sync()

    trace = None
    trace_error: Optional[str] = None
    try:
        from .cupti_activity import ActivityTrace, ActivityUnavailable

        try:
            trace = ActivityTrace(library=cupti_library, calibrate=calibrate_clock)
            trace.start()
        except ActivityUnavailable as exc:
            trace, trace_error = None, str(exc)
    except ImportError as exc:  # pragma: no cover
        trace_error = str(exc)

    gpu, nvml_error = _open_gpu_state(torch, device)
    sampler = None
    clock = trace.timestamp if trace is not None else time.monotonic_ns
    if gpu is not None:
        from .gpu_state import Sampler

        sampler = Sampler(gpu, interval_s=settings.sample_interval_s, clock=clock)
        sampler.start()

    rounds: List[Measured] = []
    started = time.monotonic()
    reached: Optional[bool] = None
    try:
        while True:
            if trace is not None:
                got = measure_activity(call, settings.repeat, prepare, sync, trace)
            else:
                got = measure_events(call, settings.repeat, prepare, torch)
            rounds.append(got)
            if not settings.adaptive:
                break
            times = [t for r in rounds for t in r.times_ms]
            noise = relative_half_width(times)
            if noise is not None and noise <= settings.target_rel_ci:
                reached = True
                break
            if time.monotonic() - started >= settings.budget_s or len(times) >= MAX_ADAPTIVE_CALLS:
                reached = False
                break
    finally:
        persisting.check()  # after the last call
        persisting.undo()
        samples = sampler.stop() if sampler is not None else []
        cupti_version = trace.version() if trace is not None else None
        if trace is not None:
            trace.stop()
        identity: Dict[str, Any] = {}
        if gpu is not None:
            try:
                identity = gpu.identity()
            except Exception as exc:
                nvml_error = f"{type(exc).__name__}: {exc}"
            gpu.close()

    times = [t for r in rounds for t in r.times_ms]
    spans = [s for r in rounds for s in r.spans]
    first = rounds[0]
    activity = first.timing == "cupti_activity"
    escaped = sum(r.escaped_activities or 0 for r in rounds)
    without = sum(r.calls_without_activity for r in rounds)
    if activity:
        if without == len(times) and escaped == 0:
            raise ExecutionError(
                "runtime",
                f"{label}: the timed calls launched no GPU work (CUPTI saw no kernel, memcpy or"
                " memset from any of them); time a function that runs on the GPU",
            )
    windows: List[Tuple[int, int]] = []
    receipt_clocks: Optional[Dict[str, Any]] = None
    if gpu is not None:
        from . import gpu_state

        windows = gpu_state.throttled_windows(samples)
        receipt_clocks = gpu_state.summarize(samples)
    if not identity:
        props = torch.cuda.get_device_properties(device)
        identity = {"name": props.name, "uuid": str(getattr(props, "uuid", "")) or None}
    if sampler is not None and sampler.error and not nvml_error:
        nvml_error = f"sampler: {sampler.error}"
    flagged = throttled_calls(spans, windows)
    kept = [t for t, f in zip(times, flagged) if not f]
    discarded = 0
    if settings.discard_throttled and kept and len(kept) < len(times):
        discarded = len(times) - len(kept)
        stats_times = kept
    else:
        stats_times = times
    result: Dict[str, Any] = dict(summarize_times(stats_times))
    result.update({
        "warmup": settings.warmup,
        "repeat": len(times),
        "flush_l2": settings.flush_l2,
        "timing": first.timing,
        "activities_stable": all(r.activities_stable for r in rounds) if activity else None,
        "escaped_work": escaped > 0 if activity else None,
        "escaped_activities": escaped if activity else None,
        "calls_without_activity": without if activity else None,
        "threads_started": max(r.threads_started for r in rounds),
        "dropped_records": sum(r.dropped_records for r in rounds),
        "kernels": first.kernels,
        "throttled_calls": sum(flagged),
        "discarded_calls": discarded,
        "adaptive": None if not settings.adaptive else {
            "target_rel_ci": settings.target_rel_ci,
            "budget_s": settings.budget_s,
            "reached": bool(reached),
            "rounds": len(rounds),
        },
        "cold_l2": cold_l2,
        "persisting_l2_calls": persisting.seen if persisting.get_limit is not None else None,
        "receipt": {
            "gpu": identity,
            "versions": _versions(torch, cupti_version),
            "clocks": receipt_clocks,
            "nvml_error": nvml_error,
            "timing_fallback_reason": trace_error,
            "cupti_ticks_per_ns": (
                round(rounds[-1].ticks_per_ns, 6) if activity else None
            ),
            "measured_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "wall_s": round(time.monotonic() - started, 4),
        },
    })
    if keep_times:
        result["times_ms"] = times
    return result
