"""GPU-only check of kcoral_runtime.gpu_state against the real NVML. Not collected by pytest.

Run on a CUDA machine (H100/H200) from the repository root:

    python3 runtime_py/tests/gpu_state_gpu_check.py [--seconds 2] [--interval 0.002]

Opens CUDA device 0 through NVML by the UUID torch gives, prints ``identity()``, samples at the
default interval during a busy bf16 matmul loop, prints ``summarize()`` and the throttled
windows, then the wall cost of one ``sample()`` (median over 1,000 calls, in µs). Exits 1 if the
GPU's UUID does not match torch's, the sampler thread failed or took almost no readings, or, on
an H100/H200, an essential field is ``None`` (name, uuid, driver_version, SM clock, memory clock,
temperature, power); the last line says PASS or FAIL and why.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, List

RUNTIME_DIR = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(RUNTIME_DIR))

import torch  # noqa: E402

from kcoral_runtime import gpu_state  # noqa: E402


def busy_matmuls(seconds: float) -> int:
    """bf16 8192² matmuls for about ``seconds``; returns how many ran."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    count = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(8):
            a @ b
        count += 8
        torch.cuda.synchronize()  # keeps the queue short so the loop ends on time
    return count


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="length of the matmul loop")
    parser.add_argument("--interval", type=float, default=0.002, help="sampler interval (s)")
    args = parser.parse_args()

    failures: List[str] = []
    if not torch.cuda.is_available():
        print("gpu_state_gpu_check: FAIL  torch sees no CUDA device")
        return 1
    torch_uuid = str(torch.cuda.get_device_properties(0).uuid)
    print(f"torch device 0: {torch.cuda.get_device_name(0)}  uuid {torch_uuid}")

    try:
        device = gpu_state.open_device(uuid=torch_uuid)
    except gpu_state.NvmlUnavailable as exc:
        print(f"gpu_state_gpu_check: FAIL  NvmlUnavailable: {exc}")
        return 1
    try:
        identity = device.identity()
        print("identity:", json.dumps(identity, indent=2))
        if identity["uuid"] != gpu_state.normalize_uuid(torch_uuid):
            failures.append(f"NVML uuid {identity['uuid']} is not torch's {torch_uuid}")

        idle = device.sample()
        print("idle reading:", idle)

        sampler = gpu_state.Sampler(device, interval_s=args.interval)
        sampler.start()
        try:
            matmuls = busy_matmuls(args.seconds)
        finally:
            samples = sampler.stop()
        span_s = (samples[-1].t_ns - samples[0].t_ns) / 1e9
        summary = gpu_state.summarize(samples)
        print(f"matmul loop: {matmuls} matmuls in {args.seconds} s; {len(samples)} readings over "
              f"{span_s:.3f} s ({len(samples) / span_s if span_s else 0:.0f}/s, asked "
              f"{1 / args.interval:.0f}/s); thinned {sampler.thinned}; error {sampler.error}")
        print("summarize:", json.dumps(summary, indent=2))
        windows = gpu_state.throttled_windows(samples)
        print(f"throttled windows: {len(windows)}",
              [(start - samples[0].t_ns, end - samples[0].t_ns) for start, end in windows][:20])
        if sampler.error is not None:
            failures.append(f"sampler thread failed: {sampler.error}")
        expected = args.seconds / args.interval
        if len(samples) < expected / 10:
            failures.append(f"only {len(samples)} readings in {args.seconds} s "
                            f"(asked about {expected:.0f})")

        costs_ns: List[int] = []
        for _ in range(1000):
            start = time.perf_counter_ns()
            device.sample()
            costs_ns.append(time.perf_counter_ns() - start)
        costs_ns.sort()
        print(f"sample() wall cost over 1000 calls: median {statistics.median(costs_ns) / 1000:.1f}"
              f" µs, p90 {costs_ns[899] / 1000:.1f} µs, max {costs_ns[-1] / 1000:.1f} µs")

        name = identity["name"] or ""
        essential: dict[str, Any] = {
            "name": identity["name"],
            "uuid": identity["uuid"],
            "driver_version": identity["driver_version"],
            "sm_clock_mhz": summary["sm_clock_mhz"],
            "mem_clock_mhz": summary["mem_clock_mhz"],
            "temperature_c": summary["temperature_c"],
            "power_w": summary["power_w"],
        }
        missing = [field for field, value in essential.items() if value is None]
        if "H100" in name or "H200" in name:
            if missing:
                failures.append(f"essential fields None on {name}: {', '.join(missing)}")
        elif missing:
            print(f"note: {name} is not an H100/H200; None here (not failed): {missing}")
    finally:
        device.close()

    if failures:
        print("gpu_state_gpu_check: FAIL  " + "; ".join(failures))
        return 1
    print("gpu_state_gpu_check: PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
