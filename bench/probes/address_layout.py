"""Does a kernel's time follow where the process's memory lies? (GPU only.)

Workers are forked from one zygote, so they share its address-space layout, and the CUDA
driver's reservations (made after the fork, at ``cuInit``) land at the same addresses in every
worker; each new local process draws its own layout (ASLR). This probe times the same kernel
(``bench/fidelity_kernels.py``) in new processes, one after another, in three modes:

- ``aslr``: as started (a new random layout each);
- ``fixed``: ``setarch -R`` (address randomization off: every process the same layout);
- ``fixed+hole``: ``setarch -R``, then an inaccessible mapping of a random size (0-1 GiB in 4 KiB
  pages) before CUDA starts, so CUDA's reservations land elsewhere in each process.

Per mode: each process's median (of ``--rounds`` measurements) and the address of its first
tensor, sorted. If ``fixed`` is tight and the other two spread, the layout is what moves the time.

    python3 bench/probes/address_layout.py [--kernel add4] [--processes 10] [--rounds 3]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_BENCH = os.path.dirname(_HERE)
_RUNTIME = os.path.join(os.path.dirname(_BENCH), "runtime_py")

_CHILD = r"""
import json, mmap, random, sys
sys.path[:0] = [BENCH, RUNTIME]
hole = None
if HOLE:
    hole = mmap.mmap(-1, random.randrange(0, 1 << 18) * 4096 + 4096,
                     flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, prot=0)
import torch
import fidelity_kernels as fk
a = torch.empty(1, device="cuda")
medians = [m for m, _, _ in fk.measure(KERNEL, ROUNDS, placed=False)]
print(json.dumps({"median": sorted(medians)[len(medians) // 2], "address": a.data_ptr()}))
"""


def run(mode: str, kernel: str, rounds: int) -> dict:
    code = (
        _CHILD.replace("BENCH", repr(_BENCH))
        .replace("RUNTIME", repr(_RUNTIME))
        .replace("HOLE", str(mode == "fixed+hole"))
        .replace("KERNEL", repr(kernel))
        .replace("ROUNDS", str(rounds))
    )
    command = [sys.executable, "-c", code]
    if mode != "aslr":
        command = ["setarch", os.uname().machine, "-R"] + command
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kernel", default="add4")
    parser.add_argument("--processes", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    modes = ["aslr", "fixed", "fixed+hole"]
    results: dict = {mode: [] for mode in modes}
    for _ in range(args.processes):  # modes interleaved: drift falls on all alike
        for mode in modes:
            results[mode].append(run(mode, args.kernel, args.rounds))
    print(f"{args.kernel}: per-process medians (µs), {args.processes} processes a mode")
    for mode in modes:
        values = sorted(r["median"] for r in results[mode])
        print(
            f"{mode:11} median {statistics.median(values):.3f}, spread {values[0]:.3f}-"
            f"{values[-1]:.3f}: " + " ".join(f"{v:.2f}" for v in values)
        )
    for mode in modes:
        pairs = sorted((r["median"], r["address"]) for r in results[mode])
        print(f"{mode:11} " + " ".join(f"{m:.2f}@{a:#x}" for m, a in pairs))


if __name__ == "__main__":
    main()
