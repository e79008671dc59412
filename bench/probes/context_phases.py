"""Where a fresh worker's context creation and teardown time goes (issue 21, item 4).

A parent that imported torch and the runtime as the zygote does (no CUDA) forks one child at a
time; each child times the steps of ``GpuBackend.init`` and the rest of a child's ``init``
(engine, snapshot, ``gc.collect``) with ``time.perf_counter``, then exits the way a variant says;
the parent times the exit from its "go" to ``waitpid`` (the driver frees a context as the
process's device files close, inside the exit). Variants of the environment run alternately,
so drift affects all alike.

Creation variants (environment of the child):
  default        as the worker runs today
  eager          CUDA_MODULE_LOADING=EAGER (to see what lazy loading already saves)
  driver-only    ctypes ``cuInit`` + ``cuDevicePrimaryCtxRetain`` + ``cuCtxSetCurrent`` +
                 ``cuMemAlloc`` of 2 MiB, no torch: the floor for a context

Teardown variants (the child holds the context and one tensor, as after a trivial request):
  exit           ``os._exit(0)`` (what the worker does)
  empty-exit     ``torch.cuda.empty_cache()`` then ``os._exit(0)``
  reset-exit     ``cuDevicePrimaryCtxReset`` then ``os._exit(0)``
  sigkill        the parent sends SIGKILL

    python3 bench/probes/context_phases.py [--rounds 8]    # from the repository root
"""
import argparse
import ctypes
import gc
import os
import signal
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "runtime_py"))

from kcoral_runtime import devices  # noqa: E402

devices.import_heavy("gpu")
from kcoral_runtime import engine as _engine  # noqa: E402,F401
import torch  # noqa: E402

gc.collect()
gc.freeze()

CREATE = ("default", "eager", "driver-only")
TEARDOWN = ("exit", "empty-exit", "reset-exit", "sigkill")


def _cuda():
    lib = ctypes.CDLL("libcuda.so.1")
    return lib


def _child_create(variant, wfd):
    marks = []
    t0 = time.perf_counter()

    def mark(name):
        marks.append((name, (time.perf_counter() - t0) * 1000))

    if variant == "driver-only":
        cu = _cuda()
        mark("dlopen libcuda")
        assert cu.cuInit(0) == 0
        mark("cuInit")
        dev = ctypes.c_int()
        assert cu.cuDeviceGet(ctypes.byref(dev), 0) == 0
        ctx = ctypes.c_void_p()
        assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
        mark("cuDevicePrimaryCtxRetain")
        assert cu.cuCtxSetCurrent(ctx) == 0
        ptr = ctypes.c_uint64()
        assert cu.cuMemAlloc_v2(ctypes.byref(ptr), 2 << 20) == 0
        assert cu.cuCtxSynchronize() == 0
        mark("cuMemAlloc + sync")
    else:
        torch.cuda.init()
        mark("torch.cuda.init")
        count = torch.cuda.device_count()
        mark("device_count")
        for index in range(count):
            torch.empty(1, device=f"cuda:{index}")
        mark("first tensor (context)")
        for index in range(count):
            torch.cuda.synchronize(index)
        mark("synchronize")
        torch.cuda.get_device_capability(0)
        [torch.cuda.get_device_properties(i).uuid for i in range(count)]
        mark("capability + properties")
        devices._CudaErrors.load(torch)
        mark("cudart errors (maps scan)")
        backend = devices.GpuBackend({})
        backend.init()  # everything is initialised already: the rest of the real init
        mark("GpuBackend.init again (warm)")
        from kcoral_runtime.engine import Engine
        from kcoral_runtime.lease import NoLease
        eng = Engine(backend, NoLease(), lambda i: None)
        eng.snapshot_state()
        mark("engine + snapshot")
        gc.collect()
        gc.freeze()
        mark("gc.collect + freeze")
    os.write(wfd, (repr(marks) + "\n").encode())
    os._exit(0)


def _child_teardown(variant, rfd, wfd):
    x = torch.ones(1024, device="cuda")
    torch.cuda.synchronize()
    del x
    os.write(wfd, b"r")
    os.read(rfd, 1)
    if variant == "empty-exit":
        torch.cuda.empty_cache()
    elif variant == "reset-exit":
        cu = _cuda()
        dev = ctypes.c_int()
        cu.cuDeviceGet(ctypes.byref(dev), 0)
        cu.cuDevicePrimaryCtxReset(dev)
    elif variant == "sigkill":
        time.sleep(60)
    os._exit(0)


def _create_once(variant, env):
    r, w = os.pipe()
    start = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.environ.update(env)
        try:
            _child_create(variant, w)
        finally:
            os._exit(1)
    os.close(w)
    data = b""
    while True:
        chunk = os.read(r, 65536)
        if not chunk:
            break
        data += chunk
    total = (time.perf_counter() - start) * 1000
    os.close(r)
    os.waitpid(pid, 0)
    marks = eval(data.decode()) if data else []
    return marks, total


def _teardown_once(variant):
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(w1)
        os.close(r2)
        try:
            _child_teardown(variant, r1, w2)
        finally:
            os._exit(1)
    os.close(r1)
    os.close(w2)
    assert os.read(r2, 1) == b"r"
    time.sleep(0.2)
    start = time.perf_counter()
    if variant == "sigkill":
        os.kill(pid, signal.SIGKILL)
    else:
        os.write(w1, b"g")
    os.waitpid(pid, 0)
    ms = (time.perf_counter() - start) * 1000
    os.close(w1)
    os.close(r2)
    return ms


def _fmt(xs):
    return f"{statistics.median(xs):8.1f} {min(xs):8.1f} {max(xs):8.1f}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    envs = {"default": {}, "eager": {"CUDA_MODULE_LOADING": "EAGER"}, "driver-only": {}}
    steps = {v: {} for v in CREATE}
    totals = {v: [] for v in CREATE}
    teardowns = {v: [] for v in TEARDOWN}
    _create_once("default", {})  # warm the page cache and the driver
    for _ in range(args.rounds):
        for variant in CREATE:
            marks, total = _create_once(variant, envs[variant])
            totals[variant].append(total)
            previous = 0.0
            for name, at in marks:
                steps[variant].setdefault(name, []).append(at - previous)
                previous = at
        for variant in TEARDOWN:
            teardowns[variant].append(_teardown_once(variant))
    print(f"# torch {torch.__version__}, {args.rounds} rounds, ms (median, min, max)")
    print("\n| creation variant | step | median | min | max |\n|---|---|---|---|---|")
    for variant in CREATE:
        for name, xs in steps[variant].items():
            m, lo, hi = _fmt(xs).split()
            print(f"| {variant} | {name} | {m} | {lo} | {hi} |")
        m, lo, hi = _fmt(totals[variant]).split()
        print(f"| {variant} | **fork → done (parent)** | {m} | {lo} | {hi} |")
    print("\n| teardown variant | go → reaped | min | max |\n|---|---|---|---|")
    for variant in TEARDOWN:
        m, lo, hi = _fmt(teardowns[variant]).split()
        print(f"| {variant} | {m} | {lo} | {hi} |")


if __name__ == "__main__":
    main()
