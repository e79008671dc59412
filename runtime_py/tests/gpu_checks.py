"""GPU-only checks for cabi / builtins / cuda_guard (issue 7). Not collected by pytest.

Run on a CUDA machine (the H200) from the repository root:

    python3 runtime_py/tests/gpu_checks.py [--arch sm_90a]

Prints one PASS/FAIL line per check and a summary; exits 1 if any check failed.
"""

from __future__ import annotations

import argparse
import ctypes
import linecache
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple

RUNTIME_DIR = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(RUNTIME_DIR))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from kcoral_runtime import builtins, cabi, cuda_guard  # noqa: E402
from kcoral_runtime.cuda_guard import CudaGuard  # noqa: E402
from kcoral_runtime.errors import ExecutionError, GPUAccessViolation  # noqa: E402

DOC = RUNTIME_DIR.parent / "docs" / "c-abi.md"
FIXTURES = RUNTIME_DIR / "tests" / "fixtures" / "cabi"
RESULTS: List[Tuple[str, bool, str]] = []
STATE: Dict[str, Any] = {}


def check(name: str) -> Callable[[Callable[[], str]], Callable[[], str]]:
    def wrap(fn: Callable[[], str]) -> Callable[[], str]:
        def run() -> str:
            start = time.perf_counter()
            try:
                detail = fn() or ""
                ok = True
            except Exception as exc:
                ok = False
                detail = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
            took = time.perf_counter() - start
            RESULTS.append((name, ok, detail))
            print(f"{'PASS' if ok else 'FAIL'}  {name}  ({took:.2f}s)  {detail.splitlines()[0] if detail else ''}",
                  flush=True)
            if not ok:
                print(detail, flush=True)
            return detail

        run.__name__ = fn.__name__
        CHECKS.append(run)
        return run

    return wrap


CHECKS: List[Callable[[], str]] = []


def uploaded(source: str, digest: str) -> Dict[str, Any]:
    filename = f"<uploaded:{digest}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace: Dict[str, Any] = {}
    exec(compile(source, filename, "exec"), namespace)
    return namespace


def doc_block(language: str, prefix: str) -> str:
    for match in re.finditer(r"```" + language + r"\n(.*?)```", DOC.read_text(), re.S):
        if match.group(1).startswith(prefix):
            return match.group(1)
    raise AssertionError(f"no ```{language} block starting {prefix!r} in {DOC}")


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise AssertionError(message)


# --------------------------------------------------------------------------- environment


@check("environment: CUDA device visible")
def env() -> str:
    expect(torch.cuda.is_available(), "torch.cuda.is_available() is False")
    props = torch.cuda.get_device_properties(0)
    major, minor = torch.cuda.get_device_capability(0)
    if STATE.get("arch") is None:
        STATE["arch"] = f"sm_{major}{minor}a" if major >= 9 else f"sm_{major}{minor}"
    torch.ones(1, device="cuda").add_(1)
    torch.cuda.synchronize()
    return (f"{props.name}, cc {major}.{minor}, L2 {props.L2_cache_size >> 20} MiB, torch {torch.__version__},"
            f" python {sys.version.split()[0]}, arch {STATE['arch']}, nvcc {builtins.find_nvcc()}")


# --------------------------------------------------------------------------- compile + C ABI


@check("compile_cuda: docs/c-abi.md add_one example for the device arch")
def compile_add_one() -> str:
    start = time.perf_counter()
    blob = builtins.compile_cuda(doc_block("cuda", "// add_one.cu"), arch=STATE["arch"], name="add_one")
    took = time.perf_counter() - start
    expect(blob[:4] == b"\x7fELF", "not an ELF file")
    directory = tempfile.mkdtemp(prefix="kcoral-gpu-check-")
    path = os.path.join(directory, "libadd_one.so")
    with open(path, "wb") as f:
        f.write(blob)
    STATE["lib"] = cabi.load_library(path)
    os.unlink(path)  # as the worker does: the mapping outlives the file
    os.rmdir(directory)
    return f"{len(blob)} bytes in {took:.1f}s; loaded and unlinked"


@check("C ABI: add_one on 1M float32 CUDA tensors")
def run_add_one() -> str:
    add_one = STATE["lib"].get_function("add_one")
    n = 1 << 20
    x = torch.randn(n, device="cuda")
    y = torch.empty_like(x)
    expect(add_one(x, y) is None, "non-None result")
    torch.cuda.synchronize()
    expect(torch.equal(y, x + 1), "y != x + 1")
    x2 = torch.arange(12, dtype=torch.float32, device="cuda").reshape(3, 4)
    y2 = torch.zeros_like(x2)
    add_one(x2, y2)
    expect(torch.equal(y2, x2 + 1), "2-D y != x + 1")
    STATE["x"], STATE["y"] = x, y
    return "y == x + 1 exactly (1-D 1M and 2-D)"


@check("C ABI: add_one_on_stream on a non-default torch stream")
def run_add_one_stream() -> str:
    fn = STATE["lib"].get_function("add_one_on_stream")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        x = torch.randn(1 << 20, device="cuda")
        y = torch.empty_like(x)
        fn(x, y, torch.cuda.current_stream().cuda_stream)
        z = y * 2  # ordered after the kernel on the same stream
    stream.synchronize()
    expect(torch.equal(z, (x + 1) * 2), "stream ordering broken")
    return "ok"


@check("C ABI: runtime errors from the CUDA library (kcoral_last_error)")
def add_one_errors() -> str:
    add_one = STATE["lib"].get_function("add_one")
    try:
        add_one(torch.zeros(4, device="cuda"), torch.zeros(5, device="cuda"))
        raise AssertionError("no error for mismatched shapes")
    except ExecutionError as exc:
        expect(exc.kind == "runtime" and exc.message == "add_one: x and y must have the same shape", exc.message)
    try:
        add_one(torch.zeros(4), torch.zeros(4, device="cuda"))
        raise AssertionError("no error for a CPU tensor")
    except ExecutionError as exc:
        expect(exc.message == "add_one: x must be a CUDA tensor (device_type 1)", exc.message)
    try:
        STATE["lib"].get_function("nope")
        raise AssertionError("no error for a missing symbol")
    except ExecutionError as exc:
        expect(exc.kind == "compile", exc.kind)
    return "shape mismatch, CPU tensor and missing symbol reported"


@check("C ABI: CUDA tensor described as kDLCUDA by a host-only library")
def describe_cuda_tensor() -> str:
    out_dir = tempfile.mkdtemp(prefix="kcoral-gpu-check-")
    lib_path = os.path.join(out_dir, "libinspect.so")
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    expect(cc is not None, "no C compiler")
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-std=c11", f"-I{FIXTURES}", str(FIXTURES / "inspect.c"),
                    "-o", lib_path], check=True)
    lib = cabi.load_library(lib_path)
    t = torch.zeros(4, 6, device="cuda", dtype=torch.bfloat16)[1:, ::2]
    out = torch.zeros(40, dtype=torch.int64)
    lib.get_function("describe")(t, out)
    o = out.tolist()
    expect(o[0] == cabi.KDL_CUDA and o[1] == t.device.index, f"device {o[:2]}")
    expect((o[3], o[4], o[5]) == (cabi.KDL_BFLOAT, 16, 1), f"dtype {o[3:6]}")
    expect(o[7] & ((1 << 64) - 1) == t.data_ptr() and o[6] == 0, "data/byte_offset")
    expect(o[8:10] == [3, 3] and o[10:12] == [6, 2], f"shape/strides {o[8:12]}")
    return "device (2, 0), bf16, view data pointer and strides as torch"


# --------------------------------------------------------------------------- benchmark


@check("benchmark: add_one kernel latency")
def bench_add_one() -> str:
    add_one = STATE["lib"].get_function("add_one")
    x, y = STATE["x"], STATE["y"]
    cold = builtins.benchmark(add_one, x, y)
    warm = builtins.benchmark(add_one, x, y, warmup=10, repeat=200, flush_l2=False)
    for r in (cold, warm):
        expect(set(r) == {"latency_ms_median", "latency_ms_mean", "latency_ms_min", "latency_ms_max",
                          "warmup", "repeat", "flush_l2"}, f"keys {sorted(r)}")
        expect(0 < r["latency_ms_min"] <= r["latency_ms_median"] <= r["latency_ms_max"], str(r))
        expect(r["latency_ms_median"] < 5.0, f"implausible latency {r}")
    expect(cold["repeat"] == 100 and cold["warmup"] == 25 and cold["flush_l2"] is True, str(cold))
    STATE["add_one_bench"] = cold
    return (f"cold L2 median {cold['latency_ms_median'] * 1000:.1f} us (min {cold['latency_ms_min'] * 1000:.1f});"
            f" warm L2 median {warm['latency_ms_median'] * 1000:.1f} us")


@check("benchmark: 64 MiB torch add has plausible HBM bandwidth")
def bench_torch_add() -> str:
    n = (64 << 20) // 4
    a = torch.randn(n, device="cuda")
    b = torch.randn(n, device="cuda")
    c = torch.empty_like(a)
    r = builtins.benchmark(lambda: torch.add(a, b, out=c))
    moved = 3 * (64 << 20)
    tbps = moved / (r["latency_ms_median"] * 1e-3) / 1e12
    expect(1.0 < tbps < 5.5, f"bandwidth {tbps:.2f} TB/s outside 1.0..5.5 (H200 peak 4.8): {r}")
    return f"median {r['latency_ms_median'] * 1000:.1f} us -> {tbps:.2f} TB/s (3 x 64 MiB moved)"


# --------------------------------------------------------------------------- the guard


@check("cuda_guard: real CUPTI loads and subscribes; start/stop cost")
def guard_cost() -> str:
    candidates = cuda_guard.cupti_candidates()
    guard = CudaGuard()
    t0 = time.perf_counter()
    guard.start()
    first = time.perf_counter() - t0
    violation = guard.stop()
    expect(violation is None, f"empty window reported {violation}")
    cycles = 50
    t0 = time.perf_counter()
    for _ in range(cycles):
        guard.start()
        guard.stop()
    per = (time.perf_counter() - t0) / cycles
    chosen = cuda_guard._chosen.path if cuda_guard._chosen is not None else "?"
    expect(per < 0.05, f"start+stop takes {per * 1000:.1f} ms")
    return (f"libcupti {chosen} (candidates: {candidates[:4]}); first start {first * 1000:.1f} ms;"
            f" start+stop {per * 1000:.2f} ms")


@check("cuda_guard: torch.cuda.synchronize() in uploaded code is a violation")
def guard_sync() -> str:
    ns = uploaded("import torch\n\ndef compile_it():\n    x = 1 + 1\n    torch.cuda.synchronize()\n    return x\n",
                  "gpucheck0000001")
    guard = CudaGuard()
    before = time.monotonic_ns()
    with guard:
        result = ns["compile_it"]()
    after = time.monotonic_ns()
    v = guard.violation
    expect(result == 2, "the function did not complete")
    expect(v is not None, "no violation recorded")
    expect(v.cuda_call.startswith("cu"), v.cuda_call)
    expect(v.location == "<uploaded:gpucheck0000001>:5 in compile_it", v.location)
    expect(before <= v.detected_at_ns <= after, "detected_at_ns outside the window")
    expect("torch.cuda.synchronize()" in v.traceback, v.traceback[-2000:])
    return f"cuda_call={v.cuda_call} location={v.location} calls={v.call_count}"


@check("cuda_guard: CPU-only work (torch CPU, numpy) is not a violation")
def guard_clean() -> str:
    guard = CudaGuard()
    with guard:
        a = torch.randn(256, 256)
        (a @ a).sum().item()
        np.linalg.svd(np.random.rand(64, 64))
        builtins.compile_cuda('extern "C" int zero(void) { return 0; }\n', arch=STATE["arch"])
    expect(guard.violation is None, f"false positive: {guard.violation}")
    return "no violation (including an nvcc compile)"


@check("cuda_guard: direct driver API call (cuCtxSynchronize via ctypes)")
def guard_driver() -> str:
    libcuda = ctypes.CDLL("libcuda.so.1")
    ns = uploaded("def sync(cuda):\n    return cuda.cuCtxSynchronize()\n", "gpucheck0000002")
    guard = CudaGuard()
    with guard:
        code = ns["sync"](libcuda)
    v = guard.violation
    expect(v is not None and v.cuda_call == "cuCtxSynchronize", f"{v}")
    expect(v.location == "<uploaded:gpucheck0000002>:2 in sync", v.location)
    return f"cuda_call={v.cuda_call} (returned {code})"


@check("cuda_guard: CUDA call from a Python thread")
def guard_thread() -> str:
    ns = uploaded("import torch\n\ndef work():\n    torch.empty(16, device='cuda')\n", "gpucheck0000003")
    guard = CudaGuard()
    with guard:
        t = threading.Thread(target=ns["work"], name="uploaded-thread")
        t.start()
        t.join()
    v = guard.violation
    # A cached allocation may need no CUDA call at all; a fresh stream/device query does.
    if v is None:
        return "no CUDA API entry (allocation served from torch's cache)"
    expect(v.location.startswith("<uploaded:gpucheck0000003>:4"), v.location)
    expect("uploaded-thread" in v.traceback, "thread name missing")
    return f"cuda_call={v.cuda_call} location={v.location}"


@check("cuda_guard: cpu_only_guard raises GPUAccessViolation (kind gpu_access)")
def guard_cpu_only() -> str:
    ns = uploaded("import torch\n\ndef bad():\n    torch.cuda.synchronize()\n", "gpucheck0000004")
    try:
        with cuda_guard.cpu_only_guard():
            ns["bad"]()
        raise AssertionError("no GPUAccessViolation")
    except GPUAccessViolation as exc:
        expect(exc.kind == "gpu_access", exc.kind)
        expect(exc.location == "<uploaded:gpucheck0000004>:4 in bad", exc.location)
        message = exc.message
    with cuda_guard.cpu_only_guard():
        sum(range(10))
    return message


@check("cuda_guard: CUDA works normally after the guard")
def after_guard() -> str:
    x = torch.randn(1 << 20, device="cuda")
    y = torch.empty_like(x)
    STATE["lib"].get_function("add_one")(x, y)
    torch.cuda.synchronize()
    expect(torch.equal(y, x + 1), "add_one after the guard")
    expect(cuda_guard._active is None, "a guard is still active")
    return "ok"


# --------------------------------------------------------------------------- worker wiring


@check("worker: GpuBackend.init reports the arch and seeds KCORAL_CUDA_ARCH")
def backend_arch() -> str:
    from kcoral_runtime import devices

    saved = os.environ.pop("KCORAL_CUDA_ARCH", None)
    try:
        backend = devices.GpuBackend({})
        target, uuids = backend.init()
        device_arch = devices.arch_of(*torch.cuda.get_device_capability(0))[0]
        expect(target == {"arch": device_arch}, f"target {target} vs device arch {device_arch}")
        expect(os.environ.get("KCORAL_CUDA_ARCH") == target["arch"], "KCORAL_CUDA_ARCH not seeded")
        expect(all(u.startswith(("GPU-", "MIG-")) for u in uuids), f"uuids {uuids}")
        STATE["backend"] = backend
        return f"target {target}, {len(uuids)} device(s), KCORAL_CUDA_ARCH={os.environ['KCORAL_CUDA_ARCH']}"
    finally:
        if saved is not None:
            os.environ["KCORAL_CUDA_ARCH"] = saved


@check("worker: run_cpu_only does not blame freeing an earlier CUDA tensor (GC before the guard)")
def backend_gc_before_guard() -> str:
    from kcoral_runtime import devices

    backend = STATE.get("backend") or devices.GpuBackend({})
    side = torch.cuda.Stream()

    class Holder:
        pass

    holder = Holder()
    holder.self = holder  # a reference cycle: only the cyclic collector frees it
    holder.tensor = torch.empty(1 << 22, device="cuda")
    with torch.cuda.stream(side):
        holder.tensor.add_(1)
    holder.tensor.record_stream(side)  # its free records a CUDA event (a CUDA API entry)
    del holder
    devices.set_cpu_only_guard(cuda_guard.cpu_only_guard)
    try:
        result = backend.run_cpu_only(lambda a, b: a + b, [2, 3])
    finally:
        devices.set_cpu_only_guard(None)
    expect(result == 5, f"result {result}")
    ns = uploaded("import torch\n\ndef bad():\n    torch.cuda.synchronize()\n", "gpucheck0000005")
    devices.set_cpu_only_guard(cuda_guard.cpu_only_guard)
    try:
        backend.run_cpu_only(ns["bad"], [])
        raise AssertionError("no GPUAccessViolation through GpuBackend.run_cpu_only")
    except GPUAccessViolation as exc:
        expect(exc.cuda_call.startswith(("cuda", "cu")), exc.cuda_call)
        return f"clean run passed; torch.cuda.synchronize() -> {exc.cuda_call} at {exc.location}"
    finally:
        devices.set_cpu_only_guard(None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--arch", default=None, help="nvcc arch (default: from the device)")
    args = parser.parse_args()
    STATE["arch"] = args.arch
    for run in CHECKS:
        run()
    failed = [name for name, ok, _ in RESULTS if not ok]
    print()
    print("=" * 72)
    print(f"gpu_checks: {len(RESULTS) - len(failed)} passed, {len(failed)} failed")
    for name, ok, detail in RESULTS:
        print(f"  {'PASS' if ok else 'FAIL'}  {name}: {detail.splitlines()[0] if detail else ''}")
    print("RESULT:", "PASS" if not failed else "FAIL")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
