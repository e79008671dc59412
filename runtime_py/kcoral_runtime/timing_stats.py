"""Summaries of per-call times: the median with a distribution-free 95 % confidence interval.

The interval is the one every order-statistics textbook gives for a median: with ``n`` sorted
samples, the ranks ``j`` and ``k`` (1-based) are the widest pair with
``P(j <= B <= k - 1) >= 0.95`` for ``B ~ Binomial(n, 1/2)``; it assumes only independent samples
from one distribution, not a normal one (kernel times are skewed: a few slow outliers). Exact
binomial sums up to ``n = 1000``, the normal approximation beyond. Below 6 samples no pair
reaches 95 % and the interval is ``None``.

``relative_half_width`` is ``(hi - lo) / 2 / median``: the "noise" that adaptive timing drives
below a target (0.5 % by default, as NVIDIA's nvbench does with its own noise measure).
"""

from __future__ import annotations

import math
import statistics
from typing import Dict, List, Optional, Sequence, Tuple

__all__ = ["median_ci_ranks", "median_ci", "relative_half_width", "summarize_times"]

_EXACT_LIMIT = 1000
_Z95 = 1.959963984540054


def median_ci_ranks(n: int, confidence: float = 0.95) -> Optional[Tuple[int, int]]:
    """0-based indices ``(lo, hi)`` into the sorted samples bounding the median's interval."""
    if n < 1:
        return None
    alpha = 1.0 - confidence
    if n <= _EXACT_LIMIT:
        # Largest j with P(B < j) <= alpha / 2; the interval is [x_(j), x_(n-j+1)] (1-based).
        # comb(n, i) kept exact and updated in place: math.comb(n, i) from scratch for every i
        # cost ~11 ms at n = 1000, more than a thousand timed calls' own host work.
        total = 2.0**n
        cumulative = 0.0
        comb = 1
        j = 0
        for i in range(n + 1):
            cumulative += comb / total
            if cumulative > alpha / 2:
                break
            j = i + 1
            comb = comb * (n - i) // (i + 1)
        if j < 1:
            return None
        return j - 1, n - j
    half = _Z95 * math.sqrt(n) / 2
    lo = max(int(math.floor(n / 2 - half)), 1)
    hi = min(int(math.ceil(n / 2 + half + 1)), n)
    return lo - 1, hi - 1


def median_ci(values: Sequence[float], confidence: float = 0.95) -> Optional[Tuple[float, float]]:
    """The median's confidence interval, or None below 6 samples."""
    ranks = median_ci_ranks(len(values), confidence)
    if ranks is None:
        return None
    ordered = sorted(values)
    return float(ordered[ranks[0]]), float(ordered[ranks[1]])


def relative_half_width(values: Sequence[float]) -> Optional[float]:
    """Half the interval's width over the median; None without an interval or a positive median."""
    interval = median_ci(values)
    if interval is None:
        return None
    median = statistics.median(values)
    if median <= 0:
        return None
    return (interval[1] - interval[0]) / 2 / median


def summarize_times(times_ms: Sequence[float]) -> Dict[str, object]:
    """``latency_ms_{median,mean,min,max}``, ``ci95_ms`` ([lo, hi] or None), ``ci95_rel_half_width``,
    ``samples``."""
    values: List[float] = [float(t) for t in times_ms]
    if not values:
        raise ValueError("no measurements")
    interval = median_ci(values)
    return {
        "latency_ms_median": float(statistics.median(values)),
        "latency_ms_mean": float(statistics.fmean(values)),
        "latency_ms_min": min(values),
        "latency_ms_max": max(values),
        "ci95_ms": None if interval is None else [interval[0], interval[1]],
        "ci95_rel_half_width": relative_half_width(values),
        "samples": len(values),
    }
