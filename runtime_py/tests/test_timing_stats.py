"""The median's confidence interval and the summary every benchmark result carries."""

import math
import random

import pytest

from kcoral_runtime.timing_stats import (
    median_ci,
    median_ci_ranks,
    relative_half_width,
    summarize_times,
)


def coverage(n: int, lo: int, hi: int) -> float:
    """P(x_(lo) <= median <= x_(hi)) for 0-based ranks: P(lo + 1 <= B <= hi), B ~ Bin(n, 1/2)."""
    return sum(math.comb(n, i) for i in range(lo + 1, hi + 1)) / 2**n


def test_no_interval_below_six_samples():
    for n in range(0, 6):
        assert median_ci_ranks(n) is None
    assert median_ci([1.0, 2.0, 3.0, 4.0, 5.0]) is None
    assert relative_half_width([1.0] * 5) is None


def test_six_samples_span_the_extremes():
    assert median_ci_ranks(6) == (0, 5)
    assert median_ci([6.0, 1.0, 3.0, 2.0, 5.0, 4.0]) == (1.0, 6.0)


@pytest.mark.parametrize("n", [6, 7, 10, 25, 100, 101, 500, 1000])
def test_exact_ranks_cover_at_least_95_percent_and_are_tightest(n):
    lo, hi = median_ci_ranks(n)
    assert lo + hi == n - 1, "symmetric ranks"
    assert coverage(n, lo, hi) >= 0.95
    if lo + 1 < hi - 1:
        assert coverage(n, lo + 1, hi - 1) < 0.95, "one rank tighter would drop below 95 %"


def test_known_ranks():
    # Textbook tables: n = 10 -> x(2)..x(9); n = 100 -> x(40)..x(61) (1-based).
    assert median_ci_ranks(10) == (1, 8)
    assert median_ci_ranks(100) == (39, 60)


def test_normal_approximation_beyond_the_exact_limit_is_close_to_exact():
    lo, hi = median_ci_ranks(4000)
    assert lo + hi in (3999, 4000)
    half = 1.96 * math.sqrt(4000) / 2
    assert abs((hi - lo) / 2 - half) <= 2


def test_interval_covers_the_true_median_about_95_percent_of_the_time():
    rng = random.Random(7)
    hits = 0
    trials = 2000
    for _ in range(trials):
        samples = [rng.lognormvariate(0.0, 0.5) for _ in range(40)]  # true median 1.0
        lo, hi = median_ci(samples)
        hits += lo <= 1.0 <= hi
    assert 0.93 <= hits / trials <= 0.99


def test_relative_half_width_shrinks_with_more_samples():
    rng = random.Random(3)
    few = [1.0 + rng.gauss(0, 0.01) for _ in range(20)]
    many = [1.0 + rng.gauss(0, 0.01) for _ in range(2000)]
    assert relative_half_width(many) < relative_half_width(few)
    assert relative_half_width(many) < 0.002


def test_relative_half_width_is_none_for_a_zero_median():
    assert relative_half_width([0.0] * 10) is None


def test_summarize_times_fields():
    summary = summarize_times([float(i) for i in range(1, 11)])
    assert summary["latency_ms_median"] == 5.5
    assert summary["latency_ms_mean"] == 5.5
    assert summary["latency_ms_min"] == 1.0
    assert summary["latency_ms_max"] == 10.0
    assert summary["ci95_ms"] == [2.0, 9.0]
    assert summary["ci95_rel_half_width"] == pytest.approx(3.5 / 5.5)
    assert summary["samples"] == 10
    assert summarize_times([2.0])["ci95_ms"] is None


def test_summarize_times_refuses_no_samples():
    with pytest.raises(ValueError):
        summarize_times([])
