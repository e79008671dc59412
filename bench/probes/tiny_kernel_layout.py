"""Does a launch-bound kernel's time depend on what the process allocated before it? (GPU only.)

The fidelity bench's 1-element add read 3.90 µs in its long-lived local processes (which timed
the other kernels first) and 4.62 µs in fresh workers (a new process, the add first);
``tiny_kernel_worker.ts`` read 4.5 µs for the add in a new local process, and 3.87 µs for another
1-element tensor once 64 MiB were allocated. Each scenario here runs in a new local process,
``--runs`` times, and prints the median of 1000 timed launches (``launch_times``) with the
addresses of the tensor and of the L2-flush buffer it was measured with:

* ``first``: the add first, as in a fresh worker;
* ``after_kernels``: the add after the bench's other kernels (4 and 64 MiB add, GEMM), as in
  the bench's long-lived local processes;
* ``after_free_64``: 64 MiB allocated and freed before the add's tensor;
* ``big_held``: the add's tensor first, then 64 MiB held during the measurement;
* ``flush_held``: a 120 MiB buffer held (the flush buffer then lands elsewhere);
* ``offsets`` (printed apart): 1-element views at offsets 0, 512, ... 3584 bytes into the
  first small block, into one allocated after 64 MiB, and into a 4 MiB block: does the time
  follow the address?
* ``history`` (printed apart): the bench's ``tiny`` kernel measured as the fidelity bench's
  long-lived local harness does (after the other kernels), then after
  ``torch.cuda.empty_cache()`` (as a reused worker starts each request), and once more.

``offsets`` and ``history`` run in a process that has first made the add's tensor and measured it
twice, as every scenario does.

    python3 bench/probes/tiny_kernel_layout.py [--runs 3]
"""

import json
import os
import statistics
import subprocess
import sys

SCENARIO = r"""
import json, sys, torch
sys.path.insert(0, "bench")
import fidelity_kernels

scenario = sys.argv[1]
held = []
if scenario == "after_kernels":
    for name in ("add4", "add64", "gemm"):
        fidelity_kernels.measure(name, 1, placed=False)
if scenario == "after_free_64":
    torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
x = torch.zeros(1, device="cuda")
if scenario == "big_held":
    held.append(torch.empty(64 << 20, dtype=torch.uint8, device="cuda"))
if scenario == "flush_held":
    held.append(torch.empty(120 << 20, dtype=torch.uint8, device="cuda"))
out = [round(fidelity_kernels.median_and_p99(lambda: x.add_(1))[0], 3) for _ in range(2)]
if scenario == "history":
    rows = []
    fidelity_kernels.measure("tiny", 1, placed=False)
    rows.append(("new_process", fidelity_kernels.measure("tiny", 1, placed=False)[0][0]))
    for name in ("add4", "add64", "gemm"):
        fidelity_kernels.measure(name, 2, placed=False)
    rows.append(("after_kernels", fidelity_kernels.measure("tiny", 1, placed=False)[0][0]))
    rows.append(("again", fidelity_kernels.measure("tiny", 1, placed=False)[0][0]))
    torch.cuda.empty_cache()
    rows.append(("after_empty_cache", fidelity_kernels.measure("tiny", 1, placed=False)[0][0]))
    torch.cuda.empty_cache()
    rows.append(("after_empty_cache_2", fidelity_kernels.measure("tiny", 1, placed=False)[0][0]))
    print(json.dumps([(label, round(us, 3)) for label, us in rows]))
    raise SystemExit
if scenario == "offsets":
    rows = {}
    first = torch.zeros(1024, device="cuda")
    held.append(torch.empty(64 << 20, dtype=torch.uint8, device="cuda"))
    later = torch.zeros(1024, device="cuda")
    large = torch.zeros(1 << 20, device="cuda")
    for label, base in (("first", first), ("later", later), ("large", large)):
        row = []
        for k in range(8):
            v = base[k * 128 : k * 128 + 1]
            row.append(round(fidelity_kernels.median_and_p99(lambda: v.add_(1))[0], 3))
        rows[label + "@" + hex(base.data_ptr())] = row
    print(json.dumps(rows))
    raise SystemExit
segments = [(hex(s["address"]), s["total_size"] >> 20) for s in torch.cuda.memory_snapshot()]
print(json.dumps({"median_us": out, "x": hex(x.data_ptr()), "segments_mib": segments}))
"""


def _run(scenario: str) -> str:
    """Runs one scenario in a new local process; returns its JSON line."""
    return subprocess.run(
        [sys.executable, "-c", SCENARIO, scenario], check=True, capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": "runtime_py"},
    ).stdout.strip()


def main() -> None:
    runs = int(sys.argv[sys.argv.index("--runs") + 1]) if "--runs" in sys.argv else 3
    names = ["first", "after_kernels", "after_free_64", "big_held", "flush_held"]
    results = {name: [] for name in names}
    for _ in range(runs):
        for name in names:
            line = _run(name)
            print(name, line, flush=True)
            results[name].append(json.loads(line)["median_us"][1])
    for _ in range(3):
        print("history", _run("history"), flush=True)
    for _ in range(2):
        print("offsets", _run("offsets"), flush=True)
    if runs:
        print("\nscenario         median of runs (µs, second measurement)")
        for name in names:
            print(f"{name:16} {statistics.median(results[name]):7.3f}  {results[name]}")


if __name__ == "__main__":
    main()
