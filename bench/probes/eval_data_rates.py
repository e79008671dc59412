"""The rates a verdict's data moves at on this machine: what its bundles' copies and hashes cost.

The step table of ``bench/eval_bench.ts`` says where a verdict's time goes; these are the floors
it is read against (docs/benchmarks.md, "Time to a verdict"): a SHA-256 on one core (hashlib), a
new file written and read back in ``/dev/shm`` and ``/tmp``, a joined copy against a copy into a
buffer on huge pages, ``torch.randn`` on the CPU, a pageable host-to-device copy and, in fresh
processes, ``import torch`` and the first CUDA call (the last two with a GPU only).

    python3 bench/probes/eval_data_rates.py [--mib 768]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import subprocess
import sys
import time
from typing import Callable

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "runtime_py"))
from kcoral_runtime.huge_pages import new_bytearray  # noqa: E402

MIB = 1 << 20
FIRST_CUDA_CALL = (
    "import time; s = time.perf_counter(); import torch; a = time.perf_counter(); "
    "torch.zeros(1, device='cuda'); torch.cuda.synchronize(); b = time.perf_counter(); "
    "print(f'import torch {(a - s) * 1e3:.0f} ms, first CUDA call {(b - a) * 1e3:.0f} ms')"
)


def timed(label: str, work: Callable[[], object], runs: int = 3) -> None:
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        work()
        samples.append((time.perf_counter() - started) * 1e3)
    print(f"{label}: median {statistics.median(samples):.0f} ms "
          f"(min {min(samples):.0f}, max {max(samples):.0f})", flush=True)


def write_file(path: str, data: bytes) -> None:
    if os.path.exists(path):
        os.unlink(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def copy_to_huge_pages(pieces: list) -> None:
    out = new_bytearray(sum(len(p) for p in pieces))
    position = 0
    for piece in pieces:
        out[position: position + len(piece)] = piece
        position += len(piece)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=768)
    mib = parser.parse_args().mib
    data = os.urandom(mib * MIB)
    timed(f"sha256 {mib} MiB (hashlib, one thread)", lambda: hashlib.sha256(data).hexdigest())
    for directory in ("/dev/shm", "/tmp"):
        path = f"{directory}/kcoral-eval-data-rates"
        timed(f"write {mib} MiB to a new file in {directory}", lambda: write_file(path, data))
        timed(f"read {mib} MiB back from {directory}",
              lambda: open(path, "rb", buffering=0).readall())
        os.unlink(path)
    pieces = [data[k * (mib * MIB // 8): (k + 1) * (mib * MIB // 8)] for k in range(8)]
    timed(f"join {mib} MiB of 8 pieces (b''.join)", lambda: b"".join(pieces))
    timed(f"copy {mib} MiB of 8 pieces into new_bytearray (huge pages)",
          lambda: copy_to_huge_pages(pieces))
    try:
        import torch
    except ImportError:
        return
    timed(f"torch.randn {mib} MiB on the CPU", lambda: torch.randn(mib * MIB // 4))
    if not torch.cuda.is_available():
        return
    host = torch.empty(mib * MIB // 4)
    timed(f"host to device {mib} MiB, pageable",
          lambda: (host.to("cuda"), torch.cuda.synchronize()))
    for _ in range(3):
        print(subprocess.run([sys.executable, "-c", FIRST_CUDA_CALL], capture_output=True,
                             text=True).stdout.strip(), flush=True)


if __name__ == "__main__":
    main()
