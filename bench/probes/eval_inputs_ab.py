"""``kcoral eval``'s step 1 in a worker's place, in two trees side by side: each tree's runtime
(``TREE/runtime_py``) runs ``generate_inputs`` for a problem of two ``--n`` x ``--n`` float32
inputs (3 correctness, 3 timing and the bracket set, made in forked processes as in a server's
worker) with ``header_digest``, then returns the bundle as a kept value into a results directory
in ``/dev/shm``, as the engine does. The trees take turns, one step each per round, each in a
fresh process (as each step gets a fresh worker); prints per tree the medians (min–max) of the
two parts and their sum, and the rounds in which B was lower.

    python3 bench/probes/eval_inputs_ab.py TREE_A TREE_B [--n 2048] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

CHILD = r"""
import json, os, shutil, sys, tempfile, time
sys.path.insert(0, sys.argv[1] + "/runtime_py")
from kcoral_runtime import eval_worker, values
n = int(sys.argv[2])
reference = f'''
import torch
import torch.nn as nn
class Model(nn.Module):
    def forward(self, x, y):
        return x + y
def get_inputs():
    return [torch.randn({n}, {n}), torch.randn({n}, {n})]
def get_init_inputs():
    return []
'''
secret = json.dumps({"correctness_seeds": ["1", "2", "3"], "timing_seeds": ["4", "5", "6"],
                     "init_seed": 42, "bracket_seed": "7", "header_digest": True})
base = "/dev/shm" if os.path.isdir("/dev/shm") else None
d = tempfile.mkdtemp(dir=base, prefix="kcoral-inputs-ab-")
try:
    s = time.perf_counter()
    out = eval_worker.generate_inputs(reference, secret)
    made = time.perf_counter()
    res = values.Results(d, None, values.KeepPolicy(min_bytes=1 << 20, max_bytes=1 << 40))
    res.return_value("out", out)
    res.text()
    kept = time.perf_counter()
    print(json.dumps({"generate": (made - s) * 1e3, "keep": (kept - made) * 1e3}))
finally:
    shutil.rmtree(d)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs=2)
    parser.add_argument("--n", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if args.n < 1 or args.rounds < 1:
        parser.error("--n and --rounds must be at least 1")
    samples: list[list[dict[str, float]]] = [[], []]
    for round_ in range(args.rounds + 1):  # the first round is not counted
        for k, tree in enumerate(args.trees):
            # In a directory of its own, as a worker's workspace: the step writes the
            # reference's source next to it (eval_worker.load_source).
            with tempfile.TemporaryDirectory(prefix="kcoral-inputs-ab-") as workspace:
                done = subprocess.run([sys.executable, "-c", CHILD, os.path.abspath(tree), str(args.n)],
                                      check=True, capture_output=True, text=True, cwd=workspace)
            if round_ > 0:
                samples[k].append(json.loads(done.stdout.strip().splitlines()[-1]))
    print("| tree | generate_inputs (ms) | kept write (ms) | sum (ms) |")
    print("|---|---|---|---|")
    sums = []
    for tree, runs in zip(args.trees, samples):
        cells = []
        for part in ("generate", "keep"):
            xs = [run[part] for run in runs]
            cells.append(f"{statistics.median(xs):.0f} ({min(xs):.0f}–{max(xs):.0f})")
        total = [run["generate"] + run["keep"] for run in runs]
        sums.append(total)
        cells.append(f"{statistics.median(total):.0f} ({min(total):.0f}–{max(total):.0f})")
        print(f"| {tree} | " + " | ".join(cells) + " |")
    lower = sum(b < a for a, b in zip(*sums))
    print(f"B lower in {lower} of {args.rounds} rounds (sum)")


if __name__ == "__main__":
    main()
