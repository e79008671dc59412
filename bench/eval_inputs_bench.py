"""The inputs step of ``kcoral eval`` (``eval_worker.generate_inputs``) with its sets made one after
another in one process (``input_processes`` 1, the anchor) and side by side in forked processes
(the default: one per usable CPU), alternating in each round, on a problem's full sizes.

    python3 bench/eval_inputs_bench.py [--reference evals/problems/gemm_fp32/reference.py]
        [--rounds 5] [--sets 6]

Each measurement is a fresh process (torch imported, the reference loaded, then the step timed
alone, as a fresh worker runs it); the table gives median, min and max of the step's time per
mode over the rounds and the ratio of the medians. ``KCORAL_EVAL_SCALE=full`` is set, so the
sizes are the GPU's (the 4096² GEMM: six sets of 128 MiB) without a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, os, sys, time
from kcoral_runtime import eval_worker
source = open(sys.argv[1]).read()
request = json.loads(sys.argv[2])
eval_worker.load_source(source, "warm")  # torch and the problem's imports, outside the timing
t0 = time.perf_counter()
eval_worker.generate_inputs(source, json.dumps(request))
print(json.dumps(round((time.perf_counter() - t0) * 1e3, 1)))
"""


def once(reference: str, sets: int, processes: int | None) -> float:
    half = sets // 2
    request = {"correctness_seeds": [str(11 + k) for k in range(sets - half)],
               "timing_seeds": [str(97 + k) for k in range(half)], "init_seed": 42}
    if processes is not None:
        request["input_processes"] = processes
    env = dict(os.environ, PYTHONPATH=str(ROOT / "runtime_py"), KCORAL_EVAL_SCALE="full")
    with tempfile.TemporaryDirectory() as folder:
        out = subprocess.run([sys.executable, "-c", CHILD, reference, json.dumps(request)],
                             cwd=folder, env=env, check=True, capture_output=True, text=True)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reference", default=str(ROOT / "evals/problems/gemm_fp32/reference.py"))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sets", type=int, default=6)
    args = parser.parse_args()
    modes = {"one process (anchor)": 1, "forked sets": None}
    times: dict = {name: [] for name in modes}
    for _ in range(args.rounds):
        for name, processes in modes.items():
            times[name].append(once(args.reference, args.sets, processes))
    cpus = len(os.sched_getaffinity(0))
    print(f"inputs step, {Path(args.reference).parent.name}, {args.sets} sets, {cpus} usable "
          f"CPUs, {args.rounds} rounds (ms)\n")
    print("| mode | median | min | max |")
    print("|---|---|---|---|")
    for name, xs in times.items():
        print(f"| {name} | {statistics.median(xs):.1f} | {min(xs):.1f} | {max(xs):.1f} |")
    anchor = statistics.median(times["one process (anchor)"])
    forked = statistics.median(times["forked sets"])
    print(f"\nRESULT forked / one process: {forked / anchor:.3f} (medians)")
    print(json.dumps(times))


if __name__ == "__main__":
    main()
