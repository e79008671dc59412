"""What the Python probes share: the median time of a call, in µs."""

import statistics
import time


def median_us(fn, n=400):
    """The median of ``n`` timed calls of ``fn`` (µs, one decimal)."""
    times = []
    for _ in range(n):
        start = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - start)
    return round(statistics.median(times) / 1000, 1)
