"""Timing a model for ``kcoral eval``: every call on fresh copies of rotating input sets.

    time_model(fn, sets, settings, device)
      |- Rotation.before(): untimed, before every call (warmup included)
      |     check the previous call: its input copies still equal the set they came from
      |       (else inputs_modified), its output equal to the first output of that set
      |       (else outputs_inconsistent; isclose instead of equal when nondeterminism is allowed)
      |     the next set (round robin over the timing sets), cloned while the previous copies
      |       are still alive, so two calls in a row never see the same addresses
      |- GPU: benchmarking.measure(..., before_call=Rotation.before) (all-stream CUPTI spans)
      |  CPU: a host timer (time.perf_counter_ns) around each call; timing "cpu"
      '- Rotation.finish(): the last call checked; each set's latest output kept for the judge

A cache keyed by input address or identity misses (new copies every call); one keyed by shape
returns the wrong set's output, which the per-set consistency check and the judge's re-check of
the last timed output of every set catch.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, List, Optional, Sequence

from .eval_compare import tolerance_for
from .timing_stats import summarize_times

# Bound at import, before any candidate code runs in the worker: a candidate that patches
# time.perf_counter_ns afterwards cannot change the CPU path's timings (the patch is still
# flagged by eval_integrity).
_host_clock_ns = time.perf_counter_ns


def clone_value(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, list):
        return [clone_value(v) for v in value]
    if isinstance(value, tuple):
        return tuple(clone_value(v) for v in value)
    return value


def same_value(a: Any, b: Any, tolerance: Optional[Dict[str, float]] = None,
               exact: bool = True) -> bool:
    """Whether two values (tensors, nested sequences, scalars) are equal: bit for bit (NaN
    equal to NaN) with ``exact``, else floating tensors within the dtype's tolerance
    (``eval_compare.tolerance_for`` with ``tolerance`` as the override)."""
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        if a.dtype != b.dtype or a.shape != b.shape or a.device != b.device:
            return False
        if exact or not a.dtype.is_floating_point:
            return bool(torch.equal(a, b)) or bool(
                a.dtype.is_floating_point and torch.equal(torch.isnan(a), torch.isnan(b))
                and torch.equal(torch.nan_to_num(a), torch.nan_to_num(b)))
        atol, rtol = tolerance_for(str(a.dtype).replace("torch.", ""), tolerance)
        wide = torch.float64 if a.dtype == torch.float64 else torch.float32
        return bool(torch.isclose(a.to(wide), b.to(wide), rtol=rtol, atol=atol,
                                  equal_nan=True).all())
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        return isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) \
            and len(a) == len(b) and all(same_value(x, y, tolerance, exact)
                                         for x, y in zip(a, b))
    try:
        return bool(a == b) or bool(a != a and b != b)
    except Exception:  # an object whose == is not a truth value
        return a is b


class Rotation:
    """The per-call state of a timed run (module docstring)."""

    def __init__(self, fn: Callable[..., Any], sets: Sequence[Sequence[Any]],
                 tolerance: Optional[Dict[str, float]] = None) -> None:
        if not sets:
            raise ValueError("timing needs at least one input set")
        self.fn = fn
        self.sets = [list(s) for s in sets]
        self.tolerance = tolerance
        self.index = -1
        self.args: Optional[List[Any]] = None
        self._previous: Optional[List[Any]] = None
        self.output: Any = None
        self.first: Dict[int, Any] = {}
        self.latest: Dict[int, Any] = {}
        self.calls = 0
        self.inputs_modified = 0
        self.outputs_inconsistent = 0

    def _check_previous(self) -> None:
        if self.args is None:
            return
        k = self.index % len(self.sets)
        if not same_value(self.args, self.sets[k]):
            self.inputs_modified += 1
        kept = clone_value(self.output)
        if k not in self.first:
            self.first[k] = kept
        elif not same_value(kept, self.first[k], self.tolerance, exact=False):
            self.outputs_inconsistent += 1
        self.latest[k] = kept
        self.output = None

    def before(self) -> None:
        self._check_previous()
        self.index += 1
        self._previous = self.args  # alive while the next copies are made
        self.args = [clone_value(v) for v in self.sets[self.index % len(self.sets)]]
        self._previous = None

    def call(self) -> None:
        self.calls += 1
        self.output = self.fn(*self.args)

    def finish(self) -> None:
        self._check_previous()
        self.args = None

    def report(self) -> Dict[str, int]:
        return {
            "calls": self.calls,
            "inputs_modified": self.inputs_modified,
            "outputs_inconsistent": self.outputs_inconsistent,
        }


def _cpu_times(rotation: Rotation, warmup: int, repeat: int) -> List[float]:
    times: List[float] = []
    for _ in range(warmup):
        rotation.before()
        rotation.call()
    for _ in range(repeat):
        rotation.before()
        t0 = _host_clock_ns()
        rotation.call()
        t1 = _host_clock_ns()
        times.append((t1 - t0) / 1e6)
    return times


def time_model(label: str, rotation: Rotation, settings: Dict[str, Any], device: str
               ) -> Dict[str, Any]:
    """The timing of ``rotation``'s calls: ``benchmarking.measure``'s result on a GPU, a host
    timer's summary (``timing: "cpu"``) on the CPU. ``settings``: warmup, repeat, adaptive,
    target_rel_ci, budget_s, flush_l2, discard_throttled (each optional)."""
    if device == "cpu":
        warmup = int(settings.get("warmup", 2))
        repeat = int(settings.get("repeat", 10))
        started = time.monotonic()
        times = _cpu_times(rotation, warmup, max(repeat, 1))
        rotation.finish()
        result: Dict[str, Any] = dict(summarize_times(times))
        result.update({
            "warmup": warmup, "repeat": len(times), "timing": "cpu", "flush_l2": False,
            "activities_stable": None, "escaped_work": None, "throttled_calls": 0,
            "persisting_l2_calls": None, "receipt": {"gpu": None, "wall_s": round(
                time.monotonic() - started, 4)},
        })
        return result
    from .benchmarking import Settings, measure

    known = {k: settings[k] for k in ("warmup", "repeat", "flush_l2", "adaptive", "target_rel_ci",
                                      "budget_s", "discard_throttled") if k in settings}
    result = measure(label, rotation.call, [], Settings(**known), before_call=rotation.before)
    rotation.finish()
    return result


__all__ = ["Rotation", "time_model", "clone_value", "same_value"]
