"""Comparing a candidate's outputs with the reference's: per-dtype tolerances, NaN/Inf aware.

    compare_values(expected, actual_description, actual_value, tolerance)
      |- structure: tensor vs tuple/list, lengths           -> mismatch "structure"
      |- per tensor: not a plain torch.Tensor              -> "not_plain" (flag output_not_plain_tensor)
      |              dtype, shape, device type differ      -> mismatch (correct: false)
      '- values: |actual - expected| <= atol + rtol * |expected| element-wise (torch.isclose),
                 a NaN matches only a NaN, an infinity only the same infinity

Default tolerances are KernelBench's (its ``get_tolerance_for_precision``, used there as both
atol and rtol): 1e-4 for float32, 1e-2 for float16 and bfloat16. KernelBench states none for the
other dtypes; ours: float64 1e-7 (torch.testing's float64 default), the float8 types 1.25e-1
(an eighth: e4m3 keeps 3 mantissa bits), integers and bool exact. A problem's ``TOLERANCE``
dict, then the caller's override, replace them.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

DEFAULT_TOLERANCES: Dict[str, Tuple[float, float]] = {
    "float32": (1e-4, 1e-4),
    "float16": (1e-2, 1e-2),
    "bfloat16": (1e-2, 1e-2),
    "float64": (1e-7, 1e-7),
    "float8_e4m3fn": (1.25e-1, 1.25e-1),
    "float8_e5m2": (1.25e-1, 1.25e-1),
}
_FLOATS = set(DEFAULT_TOLERANCES)


def tolerance_for(dtype: str, override: Optional[Dict[str, float]] = None) -> Tuple[float, float]:
    """``(atol, rtol)`` for ``dtype``: the override's keys over the default (exact for ints)."""
    atol, rtol = DEFAULT_TOLERANCES.get(dtype, (0.0, 0.0))
    if override and dtype in _FLOATS:
        atol = float(override.get("atol", atol))
        rtol = float(override.get("rtol", rtol))
    return atol, rtol


# Elements per pass on the CPU: each pass's temporaries are a few MiB, which the allocator
# hands back for the next pass, where whole-tensor temporaries are fresh memory every time
# (a page fault per 4 KiB). A GPU compares in one pass.
_CPU_CHUNK = 1 << 20


def compare_tensors(expected: Any, actual: Any, atol: float, rtol: float) -> Dict[str, Any]:
    """Element-wise comparison of two tensors of the same dtype and shape (any device).

    Returns ``match`` and the evidence: ``mismatched`` elements, ``max_abs_diff`` and
    ``max_rel_diff`` over elements both finite, ``nan_expected``/``nan_actual`` counts and
    ``first_mismatch`` (a flat index). Neither tensor is written to."""
    import torch

    dtype = str(expected.dtype).replace("torch.", "")
    floats = dtype in _FLOATS
    wide = torch.float64 if dtype == "float64" else torch.float32
    e_flat = expected.reshape(-1)
    a_flat = actual.to(expected.device).reshape(-1)
    count = e_flat.numel()
    step = count if expected.device.type != "cpu" else _CPU_CHUNK
    mismatched = 0
    first: Optional[int] = None
    max_abs = max_rel = 0.0
    nan_expected = nan_actual = 0
    for start in range(0, count, max(step, 1)):
        e = e_flat[start: start + step]
        a = a_flat[start: start + step]
        if floats:
            e = e.to(wide)
            a = a.to(wide)
            close = torch.isclose(a, e, rtol=rtol, atol=atol, equal_nan=True)
            # |a - e| where both are finite, else 0; then relative to |e| where |e| > 0, else 0.
            nonfinite = torch.isfinite(e)
            nonfinite.logical_and_(torch.isfinite(a)).logical_not_()
            diff = torch.sub(a, e)
            diff.abs_().masked_fill_(nonfinite, 0)
            max_abs = max(max_abs, float(diff.max()))
            magnitude = e.abs()
            unscaled = (magnitude > 0).logical_not_()
            diff.div_(magnitude.clamp_min_(torch.finfo(wide).tiny)).masked_fill_(unscaled, 0)
            max_rel = max(max_rel, float(diff.max()))
            nan_expected += int(torch.isnan(e).sum())
            nan_actual += int(torch.isnan(a).sum())
            del nonfinite, diff, magnitude, unscaled
        else:
            close = a == e
        bad = close.logical_not_()
        found = int(bad.sum())
        if found and first is None:
            first = start + int(bad.nonzero()[0].item())
        mismatched += found
        del close, bad
    result: Dict[str, Any] = {}
    if floats:
        result = {"max_abs_diff": max_abs, "max_rel_diff": max_rel,
                  "nan_expected": nan_expected, "nan_actual": nan_actual}
    result.update({
        "dtype": dtype,
        "match": mismatched == 0,
        "mismatched": mismatched,
        "elements": count,
        "atol": atol,
        "rtol": rtol,
    })
    if first is not None:
        result["first_mismatch"] = first
    return result


def compare_values(expected: Any, actual_desc: Dict[str, Any], actual: Any,
                   tolerance: Optional[Dict[str, float]] = None) -> Dict[str, Any]:
    """Compare a reference output (a value) with a candidate output (its bundle description
    and the decoded value). Returns ``{"match", "not_plain", "reason"?, "tensors": [...]}``."""
    report: Dict[str, Any] = {"match": True, "not_plain": False, "tensors": []}
    _compare(expected, actual_desc, actual, tolerance, report, "output")
    return report


def _fail(report: Dict[str, Any], reason: str) -> None:
    report["match"] = False
    report.setdefault("reason", reason)


def _compare(expected: Any, desc: Dict[str, Any], actual: Any,
             tolerance: Optional[Dict[str, float]], report: Dict[str, Any], where: str) -> None:
    import torch

    kind = desc.get("t")
    if isinstance(expected, torch.Tensor):
        if kind != "tensor":
            if kind == "other":
                report["not_plain"] = True
            _fail(report, f"{where}: expected a tensor, got {_described(desc)}")
            return
        if not desc.get("plain", True) and type(expected) is torch.Tensor:
            report["not_plain"] = True
        edtype = str(expected.dtype).replace("torch.", "")
        if desc["dtype"] != edtype:
            _fail(report, f"{where}: dtype {desc['dtype']}, expected {edtype}")
            return
        if list(desc["shape"]) != list(expected.shape):
            _fail(report, f"{where}: shape {desc['shape']}, expected {list(expected.shape)}")
            return
        if desc.get("device") is not None and desc["device"] != expected.device.type:
            _fail(report, f"{where}: on {desc['device']}, expected on {expected.device.type}")
            return
        if not isinstance(actual, torch.Tensor) or actual.dtype != expected.dtype \
                or tuple(actual.shape) != tuple(expected.shape):
            # The bundle's data disagrees with its own description of the output.
            _fail(report, f"{where}: the output's data is not the {edtype} tensor of shape "
                          f"{list(expected.shape)} its description names")
            return
        atol, rtol = tolerance_for(edtype, tolerance)
        got = compare_tensors(expected, actual, atol, rtol)
        got["where"] = where
        report["tensors"].append(got)
        if not got["match"]:
            _fail(report, f"{where}: {got['mismatched']} of {got['elements']} elements differ "
                          f"beyond atol={atol:g}, rtol={rtol:g}")
        return
    if isinstance(expected, (list, tuple)):
        if kind not in ("list", "tuple") or len(desc["items"]) != len(expected):
            _fail(report, f"{where}: expected a sequence of {len(expected)}, got "
                          f"{_described(desc)}")
            return
        for k, (e, d, a) in enumerate(zip(expected, desc["items"], actual)):
            _compare(e, d, a, tolerance, report, f"{where}[{k}]")
        return
    if kind != "scalar":
        _fail(report, f"{where}: expected {type(expected).__name__}, got {_described(desc)}")
        return
    if isinstance(expected, float) and isinstance(actual, (int, float)) \
            and not isinstance(actual, bool):
        atol, rtol = tolerance_for("float32", tolerance)
        if not abs(actual - expected) <= atol + rtol * abs(expected) \
                and not (expected != expected and actual != actual):
            _fail(report, f"{where}: {actual!r}, expected {expected!r}")
        return
    if actual != expected or type(actual) is not type(expected):
        _fail(report, f"{where}: {actual!r}, expected {expected!r}")


def _described(desc: Dict[str, Any]) -> str:
    """What a candidate's output is, in words, from its bundle description: ``None``, ``int
    3``, ``a list of 2``, ``a tensor of shape [4] (float32)``, ``dict``..."""
    kind = desc.get("t")
    if kind == "tensor":
        return f"a {desc.get('type') or 'tensor'} of shape {desc.get('shape')} " \
               f"({desc.get('dtype')})"
    if kind in ("list", "tuple"):
        return f"a {kind} of {len(desc.get('items') or [])}"
    if kind == "scalar":
        if "float" in desc:
            return f"float {desc['float']}"
        value = desc.get("v")
        return "None" if value is None else f"{type(value).__name__} {value!r:.40}"
    return str(desc.get("type") or kind)


def summarize(reports: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Worst figures over several comparisons (for the verdict's checks)."""
    tensors = [t for r in reports for t in r["tensors"]]
    return {
        "compared": len(reports),
        "matched": sum(1 for r in reports if r["match"]),
        "max_abs_diff": max((t.get("max_abs_diff", 0.0) for t in tensors), default=0.0),
        "max_rel_diff": max((t.get("max_rel_diff", 0.0) for t in tensors), default=0.0),
        "mismatched_elements": sum(t["mismatched"] for t in tensors),
    }


__all__ = ["DEFAULT_TOLERANCES", "tolerance_for", "compare_tensors", "compare_values",
           "summarize"]
