"""A worker's cost of returning a large kept value, in two trees side by side: the runtime of
each tree (``TREE/runtime_py``) encodes the same ``values.Chunks`` of ``--mib`` MiB (8 pieces)
as a kept return into a results directory in ``/dev/shm``, as ``kcoral eval``'s steps return
their bundles. The trees take turns, one call each per round, each in a process of its own that
made its pieces before the first call; prints median, min and max per tree and the ratio.

    python3 bench/probes/kept_write_ab.py TREE_A TREE_B [--mib 896] [--rounds 7]

The premise check of decisions/kept-digests-on-server.md: a tree whose worker hashes what it keeps
against one that leaves the hash to the server.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys

CHILD = r"""
import os, shutil, sys, tempfile, time
sys.path.insert(0, sys.argv[1] + "/runtime_py")
from kcoral_runtime import values
mib = int(sys.argv[2])
piece = os.urandom(1 << 20) * (mib // 8)
pieces = [memoryview(bytes(piece)) for _ in range(8)]
base = "/dev/shm" if os.path.isdir("/dev/shm") else None
for line in sys.stdin:
    d = tempfile.mkdtemp(dir=base, prefix="kcoral-kept-ab-")
    try:
        res = values.Results(d, None, values.KeepPolicy(min_bytes=1, max_bytes=1 << 40))
        s = time.perf_counter()
        res.return_value("bundle", values.Chunks(pieces))
        res.text()
        print((time.perf_counter() - s) * 1e3, flush=True)
    finally:
        shutil.rmtree(d)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs=2)
    parser.add_argument("--mib", type=int, default=896)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    if args.mib < 8 or args.rounds < 1:
        parser.error("--mib must be at least 8 and --rounds at least 1")
    children = [
        subprocess.Popen([sys.executable, "-c", CHILD, tree, str(args.mib)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for tree in args.trees
    ]
    times: list[list[float]] = [[], []]
    for _ in range(args.rounds + 1):  # the first round is not counted
        for k, child in enumerate(children):
            assert child.stdin is not None and child.stdout is not None
            child.stdin.write("go\n")
            child.stdin.flush()
            times[k].append(float(child.stdout.readline()))
    for child in children:
        assert child.stdin is not None
        child.stdin.close()
        child.wait()
    print(f"| tree | {args.mib} MiB kept, ms: median | min | max |")
    print("|---|---|---|---|")
    for tree, samples in zip(args.trees, times):
        counted = samples[1:]
        print(f"| {tree} | {statistics.median(counted):.0f} | {min(counted):.0f} | "
              f"{max(counted):.0f} |")
    a, b = (statistics.median(samples[1:]) for samples in times)
    lower = sum(y < x for x, y in zip(times[0][1:], times[1][1:]))
    print(f"B / A: {b / a:.2f}; B lower in {lower} of {args.rounds} rounds")


if __name__ == "__main__":
    main()
