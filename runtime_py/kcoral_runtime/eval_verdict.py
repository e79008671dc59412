"""The verdict of ``kcoral eval`` from what the judge established: correct, flags, speedup.

    facts (judge)                                   verdict
      correctness comparisons  --all match------->  correct
      candidate's own checks   --inputs changed-->  inputs_modified
                               --runs differ----->  nondeterministic (unless DETERMINISTIC = False)
                               --output moved---->  stream_escape
      timed outputs re-checked --mismatch-------->  timed_outputs_incorrect
      comparison of structure  --not plain------->  output_not_plain_tensor
      candidate timing         --escaped_work---->  timer_escape
      timing/reporting code    --patched--------->  timer_escape (eval_integrity)
                               --unstable-------->  activities_unstable
                               --persisting L2--->  persisting_l2
      either timing            --throttled calls->  throttled
      speedup > threshold      ------------------>  excessive_speedup
      median < physics floor   ------------------>  faster_than_physics
      reference bracket        --differs--------->  speedup_ci95 spans both speedups

Only the judge (a worker that never ran candidate code) calls this; the candidate's own
reports enter as evidence it could have forged only to its own detriment (a flag it hides is a
check it would have failed; correctness is decided on its outputs alone).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

FLAGS = (
    "inputs_modified", "nondeterministic", "timed_outputs_incorrect", "output_not_plain_tensor",
    "stream_escape", "timer_escape", "activities_unstable", "excessive_speedup",
    "faster_than_physics", "throttled", "persisting_l2",
)
DEFAULT_EXCESSIVE_SPEEDUP = 10.0


def speedup_of(reference: Dict[str, Any], candidate: Dict[str, Any]
               ) -> Tuple[Optional[float], Optional[List[float]]]:
    """``(speedup, [low, high])``: the reference's median over the candidate's, and the ratio's
    conservative 95 % interval from the two medians' intervals (None where one is missing)."""
    ref = reference.get("latency_ms_median")
    cand = candidate.get("latency_ms_median")
    if not ref or not cand:
        return None, None
    ratio = ref / cand
    ref_ci, cand_ci = reference.get("ci95_ms"), candidate.get("ci95_ms")
    if not ref_ci or not cand_ci or cand_ci[0] <= 0 or cand_ci[1] <= 0:
        return ratio, None
    return ratio, [ref_ci[0] / cand_ci[1], ref_ci[1] / cand_ci[0]]


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and value == value and 0 < value < float("inf")


def bracket_report(bracket: Any, reference: Dict[str, Any], candidate: Dict[str, Any],
                   interval: Optional[List[float]]) -> Tuple[Dict[str, Any], Optional[List[float]]]:
    """The reference bracket's part of the verdict and the speedup's interval it implies.

    ``bracket`` is what the candidate's worker reported for the reference timed there before the
    candidate loaded (eval_worker.time_reference_bracket): ``{"timing": ...}`` or
    ``{"error": ...}``. The speedup stays the judge's (its reference timing is the one no
    candidate code could touch); its interval becomes the smallest that holds the judge's
    interval and the interval of the speedup against the bracket: the same reference timed in
    two workers, seconds apart, differs by more than either timing's sampling noise (clocks
    under a power cap, memory placement), and the interval says so. The candidate could forge
    the bracket only to widen its own interval: no flag reads it."""
    if not isinstance(bracket, dict):
        return {"used": False, "reason": "no bracket timing came back"}, interval
    if "error" in bracket:
        error = bracket["error"] if isinstance(bracket["error"], dict) else {}
        return {"used": False, "reason": f"the reference failed in the candidate's worker: "
                                         f"{str(error.get('message', ''))[:300]}"}, interval
    timing = bracket.get("timing") if isinstance(bracket.get("timing"), dict) else {}
    median, ci = timing.get("latency_ms_median"), timing.get("ci95_ms")
    if not _positive(median) or not (isinstance(ci, list) and len(ci) == 2
                                     and all(_positive(v) for v in ci) and ci[0] <= ci[1]):
        return {"used": False, "reason": "the bracket timing is not a positive median with its "
                                         "interval"}, interval
    ref_median = reference.get("latency_ms_median")
    against, against_interval = speedup_of(timing, candidate)
    used = interval is not None and against_interval is not None
    report: Dict[str, Any] = {
        "used": used,
        "median_ms": median,
        "ci95_ms": ci,
        "samples": timing.get("samples"),
        "drift": (median / ref_median - 1) if _positive(ref_median) else None,
        "speedup": against,
        "speedup_ci95": against_interval,
        "speedup_ci95_sampling": interval,
    }
    if not used:
        return report, interval
    return report, [min(interval[0], against_interval[0]), max(interval[1], against_interval[1])]


def build_verdict(
    *,
    device: str,
    correctness: List[Dict[str, Any]],
    timed: List[Dict[str, Any]],
    candidate_checks: List[Dict[str, Any]],
    timed_calls: Dict[str, int],
    patched: Optional[List[str]] = None,
    reference_timing: Optional[Dict[str, Any]],
    candidate_timing: Optional[Dict[str, Any]],
    deterministic: bool,
    excessive_speedup: float = DEFAULT_EXCESSIVE_SPEEDUP,
    physics: Optional[Dict[str, Any]] = None,
    tolerance: Optional[Dict[str, Any]] = None,
    error: Optional[Dict[str, Any]] = None,
    bracket: Any = None,
) -> Dict[str, Any]:
    """The verdict object (module docstring). ``correctness``/``timed``: the comparison reports
    of ``eval_compare.compare_values``; ``candidate_checks``: per correctness set the candidate's
    ``inputs_unchanged``, ``repeat_identical`` and ``stream_consistent``; ``bracket``: the
    candidate worker's report of the reference bracket (``bracket_report``), None without one."""
    flags: List[str] = []

    def flag(name: str, raised: bool) -> None:
        if raised and name not in flags:
            flags.append(name)

    correct = error is None and bool(correctness) and all(r["match"] for r in correctness)
    flag("inputs_modified",
         any(c.get("inputs_unchanged") is False for c in candidate_checks)
         or timed_calls.get("inputs_modified", 0) > 0)
    flag("nondeterministic", deterministic and any(
        c.get("repeat_identical") is False for c in candidate_checks))
    flag("timed_outputs_incorrect",
         any(not r["match"] for r in timed) or timed_calls.get("outputs_inconsistent", 0) > 0)
    flag("output_not_plain_tensor", any(r.get("not_plain") for r in correctness + timed))
    flag("stream_escape", any(c.get("stream_consistent") is False for c in candidate_checks))
    cand = candidate_timing or {}
    ref = reference_timing or {}
    flag("timer_escape", cand.get("escaped_work") is True or bool(patched))
    flag("activities_unstable", cand.get("activities_stable") is False)
    flag("throttled", (cand.get("throttled_calls") or 0) > 0 or (ref.get("throttled_calls") or 0) > 0)
    speedup, interval = speedup_of(ref, cand)
    flag("excessive_speedup", speedup is not None and speedup > excessive_speedup)
    floor = (physics or {}).get("floor_ms")
    median = cand.get("latency_ms_median")
    flag("faster_than_physics", floor is not None and median is not None and median < floor)
    flag("persisting_l2", (cand.get("persisting_l2_calls") or 0) > 0)
    flags.sort(key=FLAGS.index)

    reasons = [r["reason"] for r in correctness if not r["match"] and "reason" in r]
    checks: Dict[str, Any] = {
        "correctness": {
            "sets": len(correctness),
            "matched": sum(1 for r in correctness if r["match"]),
            "reasons": reasons,
            "max_abs_diff": _worst(correctness, "max_abs_diff"),
            "max_rel_diff": _worst(correctness, "max_rel_diff"),
            "tolerance": tolerance,
        },
        "timed_outputs": {
            "rechecked": len(timed),
            "matched": sum(1 for r in timed if r["match"]),
            "reasons": [r["reason"] for r in timed if not r["match"] and "reason" in r],
            "inconsistent_calls": timed_calls.get("outputs_inconsistent", 0),
            "calls": timed_calls.get("calls", 0),
        },
        "inputs": {
            "unchanged_sets": sum(1 for c in candidate_checks if c.get("inputs_unchanged")),
            "modified_timed_calls": timed_calls.get("inputs_modified", 0),
        },
        "determinism": {
            "required": deterministic,
            "identical_sets": sum(1 for c in candidate_checks if c.get("repeat_identical")),
        },
        "stream": {
            "checked": device == "cuda",
            "consistent_sets": sum(1 for c in candidate_checks if c.get("stream_consistent")),
        },
        "integrity": {"patched": list(patched or [])},
        "excessive_speedup_threshold": excessive_speedup,
        "physics": physics,
    }
    bracketed: Optional[Dict[str, Any]] = None
    if bracket is not None and speedup is not None:
        bracketed, interval = bracket_report(bracket, ref, cand, interval)
    verdict: Dict[str, Any] = {
        "correct": correct,
        "flags": flags,
        "device": device,
        "speedup": speedup,
        "speedup_ci95": interval,
        "reference": reference_timing,
        "candidate": candidate_timing,
        "receipt": (cand.get("receipt") if cand else None),
        "checks": checks,
    }
    if bracketed is not None:
        verdict["reference_bracket"] = bracketed
    if error is not None:
        verdict["error"] = error
    return verdict


def _worst(reports: List[Dict[str, Any]], key: str) -> Optional[float]:
    values = [t[key] for r in reports for t in r.get("tensors", []) if key in t]
    return max(values) if values else None


__all__ = ["FLAGS", "DEFAULT_EXCESSIVE_SPEEDUP", "speedup_of", "bracket_report", "build_verdict"]
