"""What other processes' CUDA context work does to a measurement on the same GPU (issue 21).

One measuring process times four kernels launch by launch with CUDA events (an L2 flush before
each launch, outside the timed region, as ``kcoral_runtime.builtins.benchmark`` does), while
``--seats`` other processes on the same GPU do one of:

  control    nothing
  create     create CUDA contexts and keep them (each process: spawn a child that creates its
             context, reports, and waits; no context is destroyed during the window)
  teardown   destroy contexts: children created before the window exit during it
  alloc      allocate and free a large block of device memory in a loop (contexts kept)
  cuinit     initialise the driver only (``cuInit`` through ctypes, no context) and keep the
             process
  torchinit  the same through ``torch.cuda.init()`` + ``device_count()``: exactly what a fresh
             worker does before it takes the lease (``GpuBackend.prepare``)

The cases are interleaved over ``--rounds`` rounds (control, create, teardown, alloc, control,
...), so drift affects all alike. Per case and kernel: median, p99 and max of the per-launch
times over all rounds, their ratio to the control, and the worst round's median (the round-level
outlier). Kernels: ``c = a + b`` at 4 MiB and 64 MiB, a 4096² bf16 GEMM (compute-bound) and a
1-element add (launch-bound).

    python3 bench/probes/context_churn.py [--seats 4] [--rounds 2] [--seconds 6] [--rate 1]
"""
import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time

import torch

CASES = ("control", "create", "teardown", "alloc", "cuinit", "torchinit")


def _hold_context(ready, release):
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    ready.set()
    release.wait()


def _hold_driver(ready, release):
    import ctypes

    assert ctypes.CDLL("libcuda.so.1").cuInit(0) == 0
    ready.set()
    release.wait()


def _hold_torch_driver(ready, release):
    torch.cuda.init()
    assert torch.cuda.device_count() > 0
    ready.set()
    release.wait()


def _create_loop(stop, rate, children, target=_hold_context):
    """Creates a context every 1/rate s (in a fresh child) and keeps it until told to stop."""
    ctx = mp.get_context("fork")  # this process never initialises CUDA: forking is safe
    release = ctx.Event()
    while not stop.is_set():
        ready = ctx.Event()
        p = ctx.Process(target=target, args=(ready, release), daemon=True)
        p.start()
        ready.wait(60)
        children.value += 1
        time.sleep(max(0.0, 1.0 / rate))
    release.set()


def _teardown_loop(stop, rate, count, ready_count, go):
    """Creates `count` contexts first, then lets one exit every 1/rate s once `go` is set."""
    ctx = mp.get_context("fork")  # this process never initialises CUDA: forking is safe
    held = []
    for _ in range(count):
        ready, release = ctx.Event(), ctx.Event()
        p = ctx.Process(target=_hold_context, args=(ready, release), daemon=True)
        p.start()
        ready.wait(60)
        held.append((p, release))
    ready_count.value += 1
    go.wait()
    for p, release in held:
        if stop.is_set():
            break
        release.set()
        p.join()
        time.sleep(1.0 / rate)
    for p, release in held:
        release.set()
        p.join()


def _alloc_loop(stop, gib):
    torch.zeros(1, device="cuda")
    n = int(gib * (1 << 30))
    while not stop.is_set():
        block = torch.empty(n, dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
        del block
        torch.cuda.empty_cache()
        time.sleep(0.05)


def _kernels():
    def add(mib):
        n = mib * (1 << 20) // 4
        a, b = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
        c = torch.empty_like(a)
        return lambda: torch.add(a, b, out=c)

    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    z = torch.empty_like(x)
    one_a, one_b = torch.ones(1, device="cuda"), torch.ones(1, device="cuda")
    one_c = torch.empty_like(one_a)
    return {
        "add 4 MiB": add(4),
        "add 64 MiB": add(64),
        "gemm 4096 bf16": lambda: torch.matmul(x, y, out=z),
        "tiny add": lambda: torch.add(one_a, one_b, out=one_c),
    }


def _time(fn, flush, seconds):
    """Per-launch microseconds for `seconds`: batches of 100 launches, each between events."""
    out = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(100)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(100)]
        for s, e in zip(starts, ends):
            flush.zero_()
            s.record()
            fn()
            e.record()
        torch.cuda.synchronize()
        out.extend(s.elapsed_time(e) * 1000.0 for s, e in zip(starts, ends))
    return out


def _p(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seats", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=6.0, help="per kernel, case and round")
    parser.add_argument("--rate", type=float, default=1.0, help="contexts per second per seat")
    parser.add_argument("--alloc-gib", type=float, default=4.0)
    parser.add_argument("--cases", default=",".join(CASES),
                        help="comma-separated, from: " + ", ".join(CASES))
    args = parser.parse_args()
    cases = [c for c in args.cases.split(",") if c]
    if "control" not in cases or any(c not in CASES for c in cases):
        parser.error(f"--cases needs control and only {', '.join(CASES)}")
    ctx = mp.get_context("spawn")
    kernels = _kernels()
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    flush = torch.empty(max(2 * l2, 64 << 20) // 4, dtype=torch.int32, device="cuda")
    samples = {(c, k): [] for c in cases for k in kernels}
    round_medians = {(c, k): [] for c in cases for k in kernels}
    for fn in kernels.values():
        _time(fn, flush, 0.5)  # warm-up
    print(f"# {torch.cuda.get_device_name(0)}, torch {torch.__version__}, {args.seats} seats, "
          f"{args.rounds} rounds x {args.seconds:.0f} s per kernel and case, "
          f"{args.rate}/s contexts per seat", flush=True)
    for rnd in range(args.rounds):
        for case in cases:
            stop = ctx.Event()
            procs = []
            counters = []
            if case == "create":
                for _ in range(args.seats):
                    counter = ctx.Value("i", 0)
                    counters.append(counter)
                    procs.append(ctx.Process(target=_create_loop, args=(stop, args.rate, counter)))
            elif case in ("cuinit", "torchinit"):
                hold = _hold_driver if case == "cuinit" else _hold_torch_driver
                for _ in range(args.seats):
                    counter = ctx.Value("i", 0)
                    counters.append(counter)
                    procs.append(ctx.Process(
                        target=_create_loop, args=(stop, args.rate, counter, hold)))
            elif case == "teardown":
                per_seat = int(args.rate * args.seconds * len(kernels)) + 2
                ready, go = ctx.Value("i", 0), ctx.Event()
                for _ in range(args.seats):
                    procs.append(ctx.Process(
                        target=_teardown_loop, args=(stop, args.rate, per_seat, ready, go)))
            elif case == "alloc":
                for _ in range(args.seats):
                    procs.append(ctx.Process(target=_alloc_loop, args=(stop, args.alloc_gib)))
            for p in procs:
                p.start()
            if case == "teardown":
                while ready.value < args.seats:
                    time.sleep(0.1)
                go.set()
            elif case in ("create", "alloc", "cuinit", "torchinit"):
                time.sleep(2.0)  # the loops are running
            for name, fn in kernels.items():
                times = _time(fn, flush, args.seconds)
                samples[(case, name)].extend(times)
                round_medians[(case, name)].append(statistics.median(times))
            stop.set()
            for p in procs:
                p.join(120)
                if p.is_alive():
                    p.kill()
            extra = ""
            if counters:
                made = "contexts created" if case == "create" else "drivers initialised"
                extra = f", {sum(c.value for c in counters)} {made}"
            print(f"round {rnd + 1} {case} done{extra}", flush=True)
            time.sleep(1.0)
    print()
    print("| kernel | case | launches | median µs | p99 µs | max µs | median / control | "
          "p99 / control | round medians µs |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in kernels:
        base = samples[("control", name)]
        bm, bp = statistics.median(base), _p(base, 0.99)
        for case in cases:
            s = samples[(case, name)]
            m, p99 = statistics.median(s), _p(s, 0.99)
            rounds = " ".join(f"{x:.2f}" for x in round_medians[(case, name)])
            print(f"| {name} | {case} | {len(s)} | {m:.2f} | {p99:.2f} | {max(s):.1f} | "
                  f"{m / bm:.3f} | {p99 / bp:.3f} | {rounds} |")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
