"""4 MiB kernel time under load on the local GPU: after a matmul burst, beside 16 CPU-spinning
processes, and with every timed launch queued behind a GPU spin (no launch gaps).

    python3 bench/probes/fidelity_load.py   # from the repository root
"""
import os, sys, time, subprocess, statistics, multiprocessing as mp
import torch
sys.path.insert(0, "runtime_py")
from kcoral_runtime.builtins import benchmark
n = (4 << 20) // 4
a = torch.randn(n, device="cuda"); b = torch.randn(n, device="cuda"); c = torch.empty_like(a)
x = torch.randn(4096, 4096, device="cuda")
def burst():
    y = x
    for _ in range(20):
        y = y @ y; y = y / y.norm()
    torch.cuda.synchronize()
def meas(pre=None, rounds=8):
    out = []
    for _ in range(rounds):
        if pre: pre()
        out.append(benchmark(lambda: torch.add(a, b, out=c), warmup=100, repeat=1000)["latency_ms_median"] * 1000)
    return f"median {statistics.median(out):.3f} min {min(out):.3f} max {max(out):.3f}"
def blocking_variant(rounds=8):
    # Same events, but the GPU is held by a spin kernel while the CPU enqueues everything.
    flush = torch.empty(int(2 * torch.cuda.get_device_properties(0).L2_cache_size) // 4, dtype=torch.int32, device="cuda")
    out = []
    for _ in range(rounds):
        s = [torch.cuda.Event(enable_timing=True) for _ in range(300)]; e = [torch.cuda.Event(enable_timing=True) for _ in range(300)]
        torch.cuda.synchronize(); torch.cuda._sleep(50_000_000)
        for i in range(300):
            flush.zero_(); s[i].record(); torch.add(a, b, out=c); e[i].record()
        torch.cuda.synchronize()
        out.append(statistics.median(s[i].elapsed_time(e[i]) for i in range(300)) * 1000)
    return f"median {statistics.median(out):.3f} min {min(out):.3f} max {max(out):.3f}"
def spin(stop):
    while not stop.is_set(): pass
print("idle                 ", meas(), flush=True)
print("blocking-kernel idle ", blocking_variant(), flush=True)
print("after matmul burst   ", meas(burst), flush=True)
print("idle again           ", meas(), flush=True)
stop = mp.Event(); ps = [mp.Process(target=spin, args=(stop,)) for _ in range(16)]
[p.start() for p in ps]; time.sleep(0.5)
print("16 CPU spinners      ", meas(), flush=True)
print("blocking-kernel+spin ", blocking_variant(), flush=True)
stop.set(); [p.join() for p in ps]
print("idle at end          ", meas(), flush=True)
