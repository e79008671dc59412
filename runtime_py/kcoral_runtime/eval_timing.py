"""Timing a model for ``kcoral eval``: every call on fresh copies of rotating input sets.

    time_model(fn, sets, settings, device)
      |- Rotation.before(): untimed, before every call (warmup included)
      |     check the previous call: its input copies still equal the set they came from
      |       (else inputs_modified), its output, captured (eval_bundle.capture_value), equal to
      |       the first output of that set (else outputs_inconsistent; isclose instead of equal
      |       when nondeterminism is allowed)
      |     the next set: the timing sets in a new random order every round, never the same set
      |       twice in a row
      |     its copy written into one of SLOTS places (CPU_SLOTS on the CPU) chosen at random,
      |       never the previous call's, so two calls in a row never see the same addresses
      |- GPU: benchmarking.measure(..., before_call=Rotation.before) (all-stream CUPTI spans)
      |  CPU: a host timer (time.perf_counter_ns) around each call; timing "cpu"
      '- Rotation.finish(): the last call checked; each set's latest output kept for the judge

Which set sits at which address is random, whatever the number of sets: a cache keyed by input
address, storage or identity answers with whatever set was last at that place, and the per-set
consistency check and the judge's re-check of each set's last timed output catch the wrong
answers (a fresh allocation per call is not enough: the allocator alternates two blocks while the
previous copies are alive, and with two sets round robin each block always holds the same set,
at any offset inside it). The places are allocated once, as ``empty_like`` of the inputs: the
allocator's alignment, and with it the kernels' speed, is what a fresh clone gets. A cache keyed
by shape returns another set's output and is caught the same way; one keyed by the call count
meets a different order every round (with three or more sets).
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .eval_bundle import Captured, capture_value
from .eval_compare import tolerance_for
from .timing_stats import summarize_times

# Bound at import, before any candidate code runs in the worker: a candidate that patches
# time.perf_counter_ns afterwards cannot change the CPU path's timings (the patch is still
# flagged by eval_integrity).
_host_clock_ns = time.perf_counter_ns

# Places a call's input copies can land in: the previous call's is never chosen. On a GPU
# twelve: where a process's few places land moves a memory-bound kernel's median by up to ~5 %,
# and twelve average that out; on the CPU three, because twelve places' worth of memory made the
# CPU timings of an allocating reference several times slower than an in-place candidate's
# (decisions/eval-rotation-places.md).
SLOTS = 12
CPU_SLOTS = 3


def random_below(n: int) -> int:
    """A uniform integer in ``[0, n)`` from the OS's random source (nothing a candidate could
    seed; ``os.urandom`` is watched by eval_integrity)."""
    return int.from_bytes(os.urandom(8), "little") % n


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
    """Whether two values (tensors, nested sequences and dicts, scalars) are equal: bit for bit (NaN
    equal to NaN) with ``exact``, else floating tensors within the dtype's tolerance
    (``eval_compare.tolerance_for`` with ``tolerance`` as the override)."""
    import torch

    a = a.data if isinstance(a, Captured) else a
    b = b.data if isinstance(b, Captured) else b
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
    if isinstance(a, dict) or isinstance(b, dict):
        return isinstance(a, dict) and isinstance(b, dict) and list(a) == list(b) \
            and all(same_value(a[k], b[k], tolerance, exact) for k in a)
    try:
        return bool(a == b) or bool(a != a and b != b)
    except Exception:  # an object whose == is not a truth value
        return a is b


def _on_cuda(value: Any) -> bool:
    """Whether any tensor in ``value`` (nested lists and tuples) sits on a CUDA device."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.is_cuda
    if isinstance(value, (list, tuple)):
        return any(_on_cuda(v) for v in value)
    return False


class Rotation:
    """The per-call state of a timed run (module docstring)."""

    def __init__(self, fn: Callable[..., Any], sets: Sequence[Sequence[Any]],
                 tolerance: Optional[Dict[str, float]] = None) -> None:
        if not sets:
            raise ValueError("timing needs at least one input set")
        self.fn = fn
        self.sets = [list(s) for s in sets]
        self.slots = SLOTS if _on_cuda(self.sets) else CPU_SLOTS
        self.tolerance = tolerance
        self.set_index = -1  # the set of the current call
        self.slot = -1  # the place of the current call's copies
        self._order: List[int] = []  # the rest of this round's sets
        # (slot, tensor number) -> (the layout it was made for, its tensor)
        self._places: Dict[Tuple[int, int], Tuple[Any, Any]] = {}
        self.args: Optional[List[Any]] = None
        self.output: Any = None
        self.first: Dict[int, Any] = {}
        self.latest: Dict[int, Any] = {}
        self.calls = 0
        self.inputs_modified = 0
        self.outputs_inconsistent = 0

    def _check_previous(self) -> None:
        if self.args is None:
            return
        k = self.set_index
        if not same_value(self.args, self.sets[k]):
            self.inputs_modified += 1
        kept = capture_value(self.output)
        if k not in self.first:
            self.first[k] = kept
        elif not same_value(kept, self.first[k], self.tolerance, exact=False):
            self.outputs_inconsistent += 1
        self.latest[k] = kept
        self.output = None

    def _next_set(self) -> int:
        if not self._order:
            order = list(range(len(self.sets)))
            for i in range(len(order) - 1, 0, -1):  # Fisher-Yates
                j = random_below(i + 1)
                order[i], order[j] = order[j], order[i]
            if len(order) > 1 and order[0] == self.set_index:
                order[0], order[1] = order[1], order[0]
            self._order = order
        return self._order.pop(0)

    def _next_slot(self) -> int:
        others = [s for s in range(self.slots) if s != self.slot]
        return others[random_below(len(others))]

    def _place(self, value: Any, numbers: List[int]) -> Any:
        """A copy of ``value`` whose tensors sit in this call's slot (a fresh clone for a tensor
        a place cannot stand in for: a subclass or one that requires grad). ``numbers`` grows by
        one per tensor placed: the tensor's number within the set."""
        import torch

        if isinstance(value, torch.Tensor):
            if type(value) is not torch.Tensor or value.requires_grad:
                return value.clone()
            key = (self.slot, len(numbers))
            numbers.append(0)
            made_for, place = self._places.get(key, (None, None))
            layout = (value.shape, value.stride(), value.dtype, value.device)
            if made_for != layout:
                place = torch.empty_like(value)
                self._places[key] = (layout, place)
            place.copy_(value)
            return place.view(place.shape)  # a new tensor object every call, same memory
        if isinstance(value, list):
            return [self._place(v, numbers) for v in value]
        if isinstance(value, tuple):
            return tuple(self._place(v, numbers) for v in value)
        return value

    def before(self) -> None:
        self._check_previous()
        self.set_index = self._next_set()
        self.slot = self._next_slot()
        self.args = self._place(self.sets[self.set_index], [])

    def call(self) -> None:
        self.calls += 1
        self.output = self.fn(*self.args)

    def finish(self) -> None:
        self._check_previous()
        self.args = None
        self._places.clear()

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


__all__ = ["Rotation", "SLOTS", "CPU_SLOTS", "time_model", "clone_value", "same_value",
           "random_below"]
