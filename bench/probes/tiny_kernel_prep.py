"""Is the 1-element add's gap between ``benchmark`` and the profiler harness the preparation
before each call, or the measurement? (GPU only.)

``tests/gpu/timing_gpu.py`` compares ``launch_times`` with a torch.profiler (Kineto) harness. The
two differ in what runs before each call, not only in who reads CUPTI: the timer resets
persisting-L2 lines and the persisting limit (two driver calls) and zeroes a buffer of
``max(2 x L2, 64 MiB)`` made once per ``benchmark``; the harness zeroes twice the L2 plus 64 MiB,
a buffer made anew per harness call, and resets nothing. This probe crosses the two: each
measurement with each preparation, in one process on one tensor, rounds alternating:

* ``timer/timer``: ``launch_times`` as it is;
* ``timer/harness``: the timer's measurement (``measure_activity`` on its own trace) with the
  harness's preparation;
* ``kineto/harness``: the harness as it is;
* ``kineto/timer``: the harness's measurement with the timer's preparation (reset + its buffer);
* ``kineto/harness+reset``: the harness's buffer with the timer's persisting-L2 reset.

The rows tell which of the two halves moves a launch-bound kernel. A 4 MiB add is the control.

    PYTHONPATH=runtime_py python3 bench/probes/tiny_kernel_prep.py [--rounds 5] [--calls 200]
"""

import statistics
import sys

import torch

from kcoral_runtime.benchmarking import _PersistingL2, flush_buffer_bytes
from kcoral_runtime.builtins import launch_times
from kcoral_runtime.cupti_activity import ActivityTrace
from kcoral_runtime.timer import measure_activity


def _arg(name: str, default: int) -> int:
    return int(sys.argv[sys.argv.index(name) + 1]) if name in sys.argv else default


L2 = int(torch.cuda.get_device_properties(0).L2_cache_size)
PERSISTING = _PersistingL2()
NAMES: set = set()  # every device event name the profiler saw (does the L2 reset show?)


def harness_buffer() -> torch.Tensor:
    return torch.empty((2 * L2 + (64 << 20)) // 4, dtype=torch.int32, device="cuda")


TIMER_BUFFER = torch.empty(flush_buffer_bytes(L2) // 4, dtype=torch.int32, device="cuda")


def timer_prepare() -> None:
    PERSISTING()
    TIMER_BUFFER.zero_()


def kineto(fn, calls: int, prepare) -> list:
    """Per-call spans (ms) read by torch.profiler, as timing_gpu.py's harness groups them."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            prepare()
            torch.cuda.synchronize()
            fn()
            torch.cuda.synchronize()
    events = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                    key=lambda e: e.time_range.start)
    NAMES.update(e.name[:60] for e in events)
    groups, current = [], []
    for e in events:  # a call's events: after one flush (a fill of >= 64 MiB), before the next
        if "fill" in e.name.lower() and e.time_range.elapsed_us() > 5:
            if current:
                groups.append(current)
            current = []
        else:
            current.append(e)
    if current:
        groups.append(current)
    return [(max(e.time_range.end for e in g) - min(e.time_range.start for e in g)) / 1e3
            for g in groups if g]


def timer_with(fn, calls: int, prepare) -> list:
    trace = ActivityTrace(calibrate=True)
    trace.start()
    try:
        measured = measure_activity(fn, calls, prepare, torch.cuda.synchronize, trace)
    finally:
        trace.stop()
    return measured.times_ms


def p99(values: list) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def main() -> None:
    rounds, calls = _arg("--rounds", 5), _arg("--calls", 200)
    one = torch.zeros(1, device="cuda")
    a, b = torch.randn(1 << 20, device="cuda"), torch.randn(1 << 20, device="cuda")
    c = torch.empty(1 << 20, device="cuda")
    kernels = {"add_1_element": lambda: one.add_(1),
               "add_4MiB": lambda: torch.add(a, b, out=c)}
    for name, fn in kernels.items():
        rows = {k: [] for k in ("timer/timer", "timer/harness", "kineto/harness",
                                "kineto/timer", "kineto/harness+reset")}
        for _ in range(rounds):
            hb = harness_buffer()
            rows["timer/timer"] += launch_times(fn, warmup=10, repeat=calls)
            rows["timer/harness"] += timer_with(fn, calls, lambda: hb.zero_())
            rows["kineto/harness"] += kineto(fn, calls, lambda: hb.zero_())
            rows["kineto/timer"] += kineto(fn, calls, timer_prepare)

            def reset_then_harness() -> None:
                PERSISTING()
                hb.zero_()

            rows["kineto/harness+reset"] += kineto(fn, calls, reset_then_harness)
            del hb
        anchor = statistics.median(rows["kineto/harness"])
        print(f"\n{name} ({torch.cuda.get_device_name(0)}; {rounds} rounds x {calls} calls;"
              f" ratio to kineto/harness)")
        print("| measurement/preparation | calls | median µs | p99 µs | min µs | max µs | ratio |")
        print("|---|---|---|---|---|---|---|")
        for label, values in rows.items():
            med = statistics.median(values)
            print(f"| {label} | {len(values)} | {med * 1e3:.3f} | {p99(values) * 1e3:.3f} |"
                  f" {min(values) * 1e3:.3f} | {max(values) * 1e3:.3f} | {med / anchor:.4f} |",
                  flush=True)
    print("\ndevice events seen by the profiler:", sorted(NAMES))


if __name__ == "__main__":
    main()
