"""Does where a timed call's input copies sit move its time? (GPU only.)

``kcoral eval`` times each call on a copy of one timing set placed in one of ``eval_timing.SLOTS``
places allocated once per timing run. The same code timed in two workers differed by up to 3 %
on an H100 for memory-bound problems, beyond both timings' sampling noise. If a place's address
moves a kernel's time, a run's median depends on where its few places landed (new in every
process), and more places average that out. Per problem, in one process, ``--runs`` timing runs,
each after a pad of random size shifts the allocator, alternating ``--slots`` counts:

* per run: the median over all calls and each place's own median (``benchmarking.measure`` with
  ``keep_times``; the place of every call recorded by the rotation);
* per slot count: the spread of the runs' medians (max / min − 1) and their standard deviation.

    PYTHONPATH=runtime_py KCORAL_EVAL_SCALE=full python3 bench/probes/eval_placement.py \
        [--problems layernorm,linear_bias_gelu_bf16] [--runs 6] [--slots 3,12]
"""

import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _timing import problem_on_gpu  # noqa: E402  (bench/probes/_timing.py)

from kcoral_runtime import eval_timing
from kcoral_runtime.benchmarking import Settings, measure
from kcoral_runtime.eval_timing import Rotation


def _arg(name: str, default: str) -> str:
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default



def one_run(model, sets, slots: int):
    """(median over calls, {place: its median}) of one timing run with ``slots`` places."""
    eval_timing.SLOTS = slots
    pad = torch.empty(int.from_bytes(os.urandom(2), "little") % 512 << 20, dtype=torch.uint8,
                      device="cuda")
    rotation = Rotation(model, sets)
    places = []

    def before() -> None:
        rotation.before()
        places.append(rotation.slot)

    result = measure("placement", rotation.call, [], Settings(warmup=10, repeat=120),
                     keep_times=True, before_call=before)
    rotation.finish()
    del pad
    times = result["times_ms"]
    timed_places = places[-len(times):]
    by_place = {}
    for place, ms in zip(timed_places, times):
        by_place.setdefault(place, []).append(ms)
    return statistics.median(times), {p: statistics.median(v) for p, v in sorted(by_place.items())}


def main() -> None:
    problems = _arg("--problems", "layernorm,linear_bias_gelu_bf16").split(",")
    runs = int(_arg("--runs", "6"))
    counts = [int(c) for c in _arg("--slots", "3,12").split(",")]
    print(f"{torch.cuda.get_device_name(0)}; {runs} runs per slot count, alternating")
    for name in problems:
        _, model, sets = problem_on_gpu(name)
        medians = {c: [] for c in counts}
        with torch.no_grad():
            for r in range(runs):
                for c in counts:
                    median, by_place = one_run(model, sets, c)
                    medians[c].append(median)
                    spread = max(by_place.values()) / min(by_place.values()) - 1
                    print(f"{name} run {r} slots {c}: median {median * 1e3:.2f} µs; places"
                          f" {len(by_place)}, their medians spread {spread * 100:.2f} %"
                          f" ({', '.join(f'{v * 1e3:.1f}' for v in by_place.values())})",
                          flush=True)
        print(f"\n| {name} | slots | runs | median of medians µs | min | max | spread % | sd % |")
        print("|---|---|---|---|---|---|---|---|")
        for c in counts:
            m = medians[c]
            mid = statistics.median(m)
            print(f"| {name} | {c} | {len(m)} | {mid * 1e3:.2f} | {min(m) * 1e3:.2f} |"
                  f" {max(m) * 1e3:.2f} | {(max(m) / min(m) - 1) * 100:.2f} |"
                  f" {statistics.pstdev(m) / mid * 100:.2f} |\n", flush=True)


if __name__ == "__main__":
    main()
