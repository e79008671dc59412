"""Host cost per timed call of the activity timer (kcoral_runtime.timer), on CPU, against the
stand-in libcupti: the timing loop, the records' collection and parsing, and the attribution,
for one or more runtime trees in one run (A/B), alternating process by process.

    python3 bench/timer_host_cost.py                                   # this checkout
    python3 bench/timer_host_cost.py --tree before=/tmp/old/runtime_py --tree after=runtime_py

Each process times 3,000 calls (one stand-in flush memset and one stand-in kernel each, as
benchmark's loop does) and prints microseconds per call; the table gives median, min and max
over --rounds processes per tree and the ratio of medians to the first tree. On a GPU the
records come from the real CUPTI and tests/gpu/timing_gpu.py states the cost there.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CALLS = 3000

CHILD = r"""
import ctypes, sys, time
from kcoral_runtime import timer
from kcoral_runtime.cupti_activity import KIND, ActivityTrace
path = sys.argv[1]
lib = ctypes.CDLL(path)
lib.fake_activity_launch.argtypes = [ctypes.c_int, ctypes.c_uint32, ctypes.c_int, ctypes.c_char_p,
                                     ctypes.c_uint32, ctypes.c_uint64, ctypes.c_uint64,
                                     ctypes.c_uint64]
trace = ActivityTrace(library=path)
trace.start()
call = lambda: lib.fake_activity_launch(KIND["RUNTIME"], 1, KIND["CONCURRENT_KERNEL"], b"k", 7,
                                        20, 1000, 0)
flush = lambda: lib.fake_activity_launch(KIND["RUNTIME"], 1, KIND["MEMSET"], None, 0, 10, 50000,
                                         1 << 26)
timer.measure_activity(call, 200, flush, lambda: None, trace, grace_s=0)
t0 = time.perf_counter()
timer.measure_activity(call, int(sys.argv[2]), flush, lambda: None, trace, grace_s=0)
print((time.perf_counter() - t0) / int(sys.argv[2]) * 1e6)
trace.stop()
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", action="append", default=[],
                        help="NAME=PATH of a runtime_py folder (default: this checkout's)")
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    trees = [t.split("=", 1) for t in args.tree] or [["checkout", str(ROOT / "runtime_py")]]
    sys.path.insert(0, str(ROOT / "runtime_py" / "tests"))
    from _doubles import build_fake_cupti

    with tempfile.TemporaryDirectory() as tmp:
        library = build_fake_cupti(Path(tmp) / "libbench_fake_cupti.so")
        samples = {name: [] for name, _ in trees}
        for _ in range(args.rounds):
            for name, path in trees:
                env = dict(os.environ, PYTHONPATH=path)
                out = subprocess.run([sys.executable, "-c", CHILD, library, str(CALLS)], env=env,
                                     capture_output=True, text=True, check=True)
                samples[name].append(float(out.stdout.strip()))
    first = statistics.median(samples[trees[0][0]])
    print(f"| tree | µs per timed call, median | min | max | ratio to {trees[0][0]} |")
    print("|---|---|---|---|---|")
    for name, _ in trees:
        values = samples[name]
        med = statistics.median(values)
        print(f"| {name} | {med:.1f} | {min(values):.1f} | {max(values):.1f} | {med / first:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
