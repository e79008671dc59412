"""Did the candidate patch the machinery that times it and reports for it? (``kcoral eval``)

    snapshot()   before the candidate's file is imported: the identity of every function and
                 class (and each function's code object) of the timing and reporting modules,
                 and of the clocks, synchronizes and hashes they call
    changed(s)   after its last call: the names whose object or code differs

The candidate's worker times it and writes its outputs, so code that replaces
``benchmarking.measure``, ``time.perf_counter``, ``torch.cuda.Event`` or the bundle writer could
report any time. Such a replacement, or one of a function's code in place, is found here and
flags ``timer_escape``. Correctness needs no such check: the outputs are judged by a worker that
never ran the candidate. Code that rewrites the interpreter's memory through ctypes can evade
this check; it can still only misreport its own timing, never the expected outputs (they do not
exist while it runs).
"""

from __future__ import annotations

import importlib
from typing import Any, Dict, List, Optional, Tuple

WATCHED_MODULES = (
    "kcoral_runtime.eval_worker",
    "kcoral_runtime.eval_timing",
    "kcoral_runtime.eval_bundle",
    "kcoral_runtime.eval_integrity",
    "kcoral_runtime.benchmarking",
    "kcoral_runtime.timer",
    "kcoral_runtime.cupti_activity",
    "kcoral_runtime.timing_stats",
)
WATCHED_ATTRIBUTES = (
    ("time", ("perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns", "sleep")),
    ("hashlib", ("sha256",)),
    ("json", ("dumps",)),
    ("os", ("urandom",)),
    ("torch", ("equal", "isclose", "allclose", "empty", "empty_like", "Tensor", "no_grad")),
    ("torch.cuda", ("synchronize", "Event", "Stream", "current_stream", "current_device")),
)
# Methods of classes the rotation and the bundle writer call (module, class, methods).
WATCHED_METHODS = (
    ("torch", "Tensor", ("clone", "to", "copy_", "detach", "as_subclass", "contiguous",
                         "reshape", "view", "numpy", "numel", "fill_")),
)

# name -> (the object, its code object): held, so that neither can be freed and its address
# reused by a replacement.
Snapshot = Dict[str, Tuple[Any, Any]]


def _record(out: Snapshot, name: str, obj: Any) -> None:
    out[name] = (obj, getattr(obj, "__code__", None))


def _module(name: str) -> Optional[Any]:
    try:
        return importlib.import_module(name)
    except Exception:
        return None


def snapshot() -> Snapshot:
    """The identities to compare later (module docstring)."""
    out: Snapshot = {}
    for name in WATCHED_MODULES:
        module = _module(name)
        if module is None:
            continue
        for attr, obj in list(vars(module).items()):
            if getattr(obj, "__module__", None) != name:
                continue
            if isinstance(obj, type):
                _record(out, f"{name}.{attr}", obj)
                for member, value in list(vars(obj).items()):
                    if callable(value) or isinstance(value, (staticmethod, classmethod, property)):
                        _record(out, f"{name}.{attr}.{member}", value)
            elif callable(obj):
                _record(out, f"{name}.{attr}", obj)
    for name, attrs in WATCHED_ATTRIBUTES:
        module = _module(name)
        if module is None:
            continue
        for attr in attrs:
            if hasattr(module, attr):
                _record(out, f"{name}.{attr}", getattr(module, attr))
    for name, cls_name, methods in WATCHED_METHODS:
        module = _module(name)
        cls = getattr(module, cls_name, None) if module is not None else None
        for method in methods:
            if cls is not None and hasattr(cls, method):
                _record(out, f"{name}.{cls_name}.{method}", getattr(cls, method))
    return out


def changed(before: Snapshot) -> List[str]:
    """Names whose object or code is not what ``before`` recorded (or that are gone)."""
    after = snapshot()
    gone = (None, None)
    return sorted(
        name for name, (obj, code) in before.items()
        if after.get(name, gone)[0] is not obj or after.get(name, gone)[1] is not code
    )


__all__ = ["snapshot", "changed", "WATCHED_MODULES", "WATCHED_ATTRIBUTES", "WATCHED_METHODS"]
