"""Cost of the per-request GPU-state receipt in the worker (kcoral_runtime.gpu_receipt), on CPU,
against the stand-in NVML (runtime_py/tests/fixtures/nvml/fake_nvml.c): what each request that
holds the lease pays (begin, the acquisition reading, the release reading, the receipt built:
two readings of five NVML calls per GPU), and what each worker pays once (NVML opened, the
GPUs' identity read), for 1 and 8 GPUs.

    python3 bench/gpu_receipt_cost.py [--rounds 9] [--requests 2000]
    python3 bench/gpu_receipt_cost.py --real   # on a GPU machine: the driver's NVML, GPU 0

Each round is a fresh process (the per-worker cost is a process's first); the table gives the
median, min and max over the rounds. The stand-in answers from memory: this is the Python and
ctypes side of the cost. The real NVML's calls are ioctls into the driver, dearer: ``--real``
measures them against the machine's own NVML on GPU 0 (one GPU; "8 GPUs" names GPU 0 eight
times, each reading a separate set of calls).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FAKE = ROOT / "runtime_py" / "tests" / "fixtures" / "nvml" / "fake_nvml.c"

CHILD = r"""
import json, os, sys, time
from kcoral_runtime.gpu_receipt import RequestReceipt
ids, requests = sys.argv[1].split(","), int(sys.argv[2])
t0 = time.perf_counter()
receipt = RequestReceipt(ids)
receipt.open()
opened = time.perf_counter() - t0
assert receipt.nvml_error is None, receipt.nvml_error
def cycle():
    receipt.begin(); receipt.acquired(); receipt.releasing(); return receipt.take()
for _ in range(200):
    cycle()
t0 = time.perf_counter()
for _ in range(requests):
    got = cycle()
per_request = (time.perf_counter() - t0) / requests
size = len(json.dumps(got, separators=(",", ":")))
print(json.dumps({"open_ms": opened * 1e3, "request_us": per_request * 1e6, "bytes": size}))
receipt.close()
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--real", action="store_true", help="the driver's NVML, GPU 0")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "PYTHONPATH": str(ROOT / "runtime_py")}
        if args.real:
            # "sim-<k>" names NVML index k, whichever library answers.
            configs = {"1 GPU": ["sim-0"], "8 GPUs": ["sim-0"] * 8}
        else:
            lib = Path(tmp) / "libbench_fake_nvml.so"
            subprocess.run(["cc", "-shared", "-fPIC", "-O2", str(FAKE), "-o", str(lib),
                            "-lpthread"], check=True)
            env["KCORAL_NVML_LIBRARY"] = str(lib)
            # The stand-in has two GPUs: 8 GPUs are its two, each named four times.
            configs = {"1 GPU": ["sim-0"], "8 GPUs": ["sim-0", "sim-1"] * 4}
        rows = {name: [] for name in configs}
        for _ in range(args.rounds):
            for name, ids in configs.items():  # alternating, process by process
                out = subprocess.run([sys.executable, "-c", CHILD, ",".join(ids),
                                      str(args.requests)], env=env, cwd=tmp, check=True,
                                     capture_output=True, text=True).stdout
                rows[name].append(json.loads(out))
    nvml = "the driver's NVML" if args.real else "stand-in NVML"
    print(f"GPU-state receipt in the worker, {nvml}, {args.rounds} processes x "
          f"{args.requests} requests (median [min-max])")
    print(f"{'GPUs':<8} {'per request, us':<28} {'per worker (open), ms':<28} receipt bytes")
    for name, samples in rows.items():
        def cell(key: str) -> str:
            values = [s[key] for s in samples]
            return (f"{statistics.median(values):.2f} "
                    f"[{min(values):.2f}-{max(values):.2f}]")
        print(f"{name:<8} {cell('request_us'):<28} {cell('open_ms'):<28} {samples[0]['bytes']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
