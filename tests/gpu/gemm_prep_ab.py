"""Does a preparation step of `benchmark` change an honest kernel's time? (run on a GPU machine)

    PYTHONPATH=runtime_py:runtime_py/kcoral_runtime/compat python3 tests/gpu/gemm_prep_ab.py

A 4096² bf16 GEMM timed by `benchmark` as it is, and with the persisting-L2 undo (cuCtxSetLimit +
cuCtxResetPersistingL2Cache before every call) switched off, alternating, five rounds of 200 calls
each; prints the medians of each round and the ratio of the medians of rounds.
"""

import statistics

import torch

from kcoral_runtime import benchmarking
from kcoral_runtime.builtins import benchmark

n = 4096
a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)


def gemm() -> None:
    torch.matmul(a, b, out=c)


undo = benchmarking._PersistingL2.undo
rounds = {"as is": [], "no persisting-L2 undo": []}
for _ in range(5):
    for name in rounds:
        benchmarking._PersistingL2.undo = undo if name == "as is" else (lambda self: None)
        rounds[name].append(benchmark(gemm, warmup=20, repeat=200)["latency_ms_median"])
benchmarking._PersistingL2.undo = undo
print(f"device: {torch.cuda.get_device_name(0)}")
for name, values in rounds.items():
    print(f"| {name} | " + " | ".join(f"{v:.5f}" for v in values) + f" | median {statistics.median(values):.5f} ms |")
ratio = statistics.median(rounds["as is"]) / statistics.median(rounds["no persisting-L2 undo"])
print(f"RESULT persisting_undo_ratio {ratio:.4f}")
