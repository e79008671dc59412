"""Is a kernel slower in a process whose CUDA context is new? (issue 21, kernel-time fidelity)

The fidelity bench compares fresh workers with long-lived local processes. This probe takes the
server out: a parent that imported torch (as the zygote does, no CUDA yet) forks processes that
time one kernel with ``kcoral_runtime.builtins.launch_times`` (100 warmup + 1000 timed launches,
L2 flushed before each), alternating, per kernel:

  warm       one long-lived process, measuring again each time (the local harness)
  new        a newly forked process: context, tensors, one measurement, exit (a fresh worker)
  new+wait   the same, sleeping ``--wait`` s between its context and its measurement
  new+warm   the same, with ``--long-warmup`` more launches before its measurement
  new+cuinit the same, while ``--siblings`` other new processes call ``cuInit`` (raw, through
             ctypes) during its measurement, as the next fresh worker does at fork

Per variant and kernel: the median over processes of each measurement's median and p99, and the
range of the medians.

    PYTHONPATH=runtime_py python3 bench/probes/fresh_context_kernels.py \\
        [--processes 12] [--kernels tiny,add4] [--wait 0.5] [--long-warmup 20000] [--siblings 1]
"""

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from fidelity_kernels import kernel, median_and_p99  # noqa: E402  (bench/fidelity_kernels.py)


def _measure(name, extra_warmup=0):
    return median_and_p99(kernel(name, placed=False), extra_warmup)


def _new_process(conn, name, wait, extra_warmup, ready=None, go=None):
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    if ready is not None:
        ready.set()
        go.wait()
    if wait:
        time.sleep(wait)
    conn.send(_measure(name, extra_warmup))
    conn.close()


def _warm_process(conn):
    torch.zeros(1, device="cuda")
    while True:
        name = conn.recv()
        if name is None:
            return
        conn.send(_measure(name))


def _cuinit():
    import ctypes

    assert ctypes.CDLL("libcuda.so.1").cuInit(0) == 0


def _fork_once(name, wait=0.0, extra_warmup=0, siblings=0):
    fork = mp.get_context("fork")
    parent, child = mp.Pipe()
    ready, go = fork.Event(), fork.Event()
    proc = fork.Process(
        target=_new_process, args=(child, name, wait, extra_warmup, ready, go)
    )
    proc.start()
    ready.wait()
    others = [fork.Process(target=_cuinit) for _ in range(siblings)]
    for other in others:
        other.start()
    go.set()
    result = parent.recv()
    proc.join()
    for other in others:
        other.join()
    return result


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--processes", type=int, default=12)
    parser.add_argument("--kernels", default="tiny,add4")
    parser.add_argument("--wait", type=float, default=0.5)
    parser.add_argument("--long-warmup", type=int, default=20000)
    parser.add_argument("--siblings", type=int, default=1)
    args = parser.parse_args()

    parent, child = mp.Pipe()
    warm = mp.get_context("fork").Process(target=_warm_process, args=(child,))
    warm.start()
    variants = {
        "warm": lambda k: (parent.send(k), parent.recv())[1],
        "new": lambda k: _fork_once(k),
        f"new+wait {args.wait:g} s": lambda k: _fork_once(k, wait=args.wait),
        f"new+warm {args.long_warmup}": lambda k: _fork_once(k, extra_warmup=args.long_warmup),
        f"new+cuinit ×{args.siblings}": lambda k: _fork_once(k, siblings=args.siblings),
    }
    print("| kernel | variant | median µs | p99 µs | range of medians µs | median / warm |")
    print("|---|---|---|---|---|---|")
    for kernel in args.kernels.split(","):
        results = {name: [] for name in variants}
        for name, measure in variants.items():
            measure(kernel)  # warm-up round, not counted
        for _ in range(args.processes):
            for name, measure in variants.items():
                results[name].append(measure(kernel))
        base = statistics.median(m for m, _ in results["warm"])
        for name, values in results.items():
            medians = [m for m, _ in values]
            p99 = statistics.median(p for _, p in values)
            median = statistics.median(medians)
            print(
                f"| {kernel} | {name} | {median:.2f} | {p99:.2f} | "
                f"{min(medians):.2f}–{max(medians):.2f} | {median / base:.3f} |",
                flush=True,
            )
    parent.send(None)
    warm.join()


if __name__ == "__main__":
    main()
