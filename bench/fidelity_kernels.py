"""The kernels the fidelity bench and its probes time, and one measurement of them.

Uploaded as a module by ``bench/fidelity_bench.ts`` (to its local processes and to the servers)
and imported by ``bench/probes/fresh_context_kernels.py``, so every side times the same code.
Names: ``add4`` / ``add64`` (``c = a + b`` at 4 / 64 MiB, memory-bound), ``gemm`` (a 4096² bf16
GEMM, compute-bound), ``tiny`` (a 1-element add, launch-bound, over 32 addresses in turn).
"""

import itertools
import os
import statistics
import time

import torch

from kcoral_runtime.builtins import launch_times


# Where a kernel's tensors lie in physical memory moves its time by a few % on the H200 (a 4 MiB
# add: 7.6-8.1 µs from one new process to the next; bench/probes/address_layout.py), and reused
# workers that take turns on the GPU reuse the pages the last one freed, so all of them read one
# placement. Each measurement first takes a random 0-63 MiB, so every side's median is over many
# placements, not one.
_PLACEMENT_STEP = 1024 * 1024
_PLACEMENTS = 64


def kernel(name, placed=True):
    """A callable that launches kernel ``name`` on tensors made for it, after a random offset
    (``placed=False``: none, for probes that study placement itself)."""
    if not placed:
        return _kernel(name)
    offset = int.from_bytes(os.urandom(2), "little") % _PLACEMENTS  # not `random`: forks share it
    shift = torch.empty(offset * _PLACEMENT_STEP + 1, dtype=torch.uint8, device="cuda")
    fn = _kernel(name)
    fn.placement = shift  # held as long as the kernel is launched
    return fn


def _kernel(name):
    if name.startswith("add"):
        n = int(name[3:]) * 1024 * 1024 // 4
        a = torch.randn(n, device="cuda")
        b = torch.randn(n, device="cuda")
        c = torch.empty_like(a)
        return lambda: torch.add(a, b, out=c)
    if name == "gemm":
        a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
        c = torch.empty_like(a)
        return lambda: torch.mm(a, b, out=c)
    if name == "tiny":
        # A 1-element add's time differs by a few % from one 4 KiB page to the next on the
        # H200 (bench/probes/tiny_kernel_layout.py): launches take 32 elements in 32 pages in
        # turn, so a measurement does not hang on one address.
        pages = torch.zeros(33 * 1024, device="cuda")
        elements = itertools.cycle([pages[k * 1024 + 128 : k * 1024 + 129] for k in range(32)])
        return lambda: next(elements).add_(1)
    raise ValueError(name)


WARMUP = 100
REPEAT = 1000


def median_and_p99(fn, extra_warmup=0):
    """(median, p99) in µs of ``REPEAT`` timed launches of ``fn`` after ``WARMUP`` (+
    ``extra_warmup``)."""
    if extra_warmup:
        launch_times(fn, warmup=extra_warmup, repeat=1)
    times = sorted(t * 1000.0 for t in launch_times(fn, warmup=WARMUP, repeat=REPEAT))
    return statistics.median(times), times[REPEAT - REPEAT // 100 - 1]


def measure(name, rounds, placed=True):
    """``rounds`` measurements of kernel ``name``, each ``[median, p99, wall]`` in µs; ``wall``
    is the measurement's wall time per launch (warmup included): above the GPU's time per
    iteration, the host, not the GPU, set the pace. ``placed``: as for :func:`kernel`."""
    fn = kernel(name, placed)
    out = []
    for _ in range(rounds):
        start = time.perf_counter()
        median, p99 = median_and_p99(fn)
        out.append([median, p99, (time.perf_counter() - start) / (WARMUP + REPEAT) * 1e6])
    return out
