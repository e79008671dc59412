"""Worker time of a reused worker's trivial request, in-process, with the runtime's own Engine:
``execute()`` (until the outcome exists: the time before the answer) and, after it,
``finish_request()`` (the reset left for after the reply) and ``idle()`` (the next request's
sandbox snapshot, where the runtime has it). The request is sent as the server sends it
(``reply_before_reset``); 400 requests, the first 50 dropped, medians in µs.

    python3 bench/probes/sandbox_worker_time.py [gpu] [none] [capture] [phases]   # from the repo root

``gpu``: a CUDA context (GpuBackend), else simulated GPUs (torch on the CPU); ``none``: without
the sandbox checks; ``capture``: with the output captured as a client's default 1 MiB limit asks
(else no capture); ``phases``: also the median of each piece of the hygiene on its own (µs), in
this process as a worker has it. Run it in two trees to compare them (each imports its own
runtime_py).
"""
import gc
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, "runtime_py")
import torch  # noqa: E402,F401  (as a worker has it)
from kcoral_runtime import engine as engine_module  # noqa: E402
from kcoral_runtime.devices import GpuBackend, SimBackend  # noqa: E402
from kcoral_runtime.engine import Engine  # noqa: E402
from kcoral_runtime.leak_checks import warm_thread_pools  # noqa: E402
from kcoral_runtime.lease import NoLease  # noqa: E402
from _timing import median_us  # noqa: E402  (bench/probes/_timing.py)

engine_module.kill_leftover_processes = lambda: False  # this process's children are not leftovers
backend = GpuBackend({}) if "gpu" in sys.argv[1:] else SimBackend({}, 1)
backend.init()
backend.reused = True
sandbox = "none" not in sys.argv[1:]
OUTPUT_LIMIT = (1 << 20) if "capture" in sys.argv[1:] else 0
eng = Engine(backend, NoLease(), lambda i: None)
eng.snapshot_state()
warm_thread_pools(backend.torch)
gc.collect()
gc.freeze()  # as a child does after init
program = json.dumps({"instructions": [
    {"op": "upload", "kind": "module", "id": "m", "source": "def f(x):\n    return x + 1\n"},
    {"op": "get_function", "id": "g", "module": {"$ref": "m"}, "name": "f"},
    {"op": "run", "id": "r", "fn": {"$ref": "g"}, "args": [41]},
    {"op": "return", "key": "y", "value": {"$ref": "r"}},
]})
root = tempfile.mkdtemp()
before, after_reply, idle = [], [], []
for i in range(400):
    work, results = os.path.join(root, f"w{i}"), os.path.join(root, f"r{i}")
    os.mkdir(work)
    os.mkdir(results)
    req = {"program": program, "blobs": {}, "workspace": work, "results": results,
           "output_limit_bytes": OUTPUT_LIMIT, "max_return_bytes": 1 << 20, "sandbox": sandbox,
           "reply_before_reset": True}
    t0 = time.perf_counter_ns()
    outcome, retire, detail = eng.execute(req, False)
    t1 = time.perf_counter_ns()
    assert outcome["status"] == "COMPLETED" and retire is None, (outcome, retire, detail)
    if eng.reset_pending:
        assert eng.finish_request() == (None, None)
    t2 = time.perf_counter_ns()
    eng.lease.request_done()
    if hasattr(eng, "idle"):
        eng.idle()
    t3 = time.perf_counter_ns()
    if i >= 50:
        before.append(t1 - t0)
        after_reply.append(t2 - t1)
        idle.append(t3 - t2)


def med(xs):
    return round(statistics.median(xs) / 1000)


print(json.dumps({
    "sandbox": sandbox, "backend": backend.mode, "before_outcome_us": med(before),
    "reset_after_reply_us": med(after_reply), "idle_snapshot_us": med(idle),
    "total_us": med([a + b + c for a, b, c in zip(before, after_reply, idle)]),
    "maps_lines": len(open("/proc/self/maps").read().splitlines()),
}))


def phases():
    """Each piece of the hygiene alone, as a worker pays it (medians, µs)."""
    import importlib
    import threading

    from kcoral_runtime import leak_checks

    state = leak_checks.SandboxState()
    ws = os.path.join(root, "phases")
    os.mkdir(ws)

    def fds():
        for fd in os.listdir("/proc/self/fd"):
            try:
                os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                pass

    posix, process = eng.state.posix, eng.state
    return {
        "restore_signals": median_us(lambda: posix.restore_signals([])),
        "restore_posix": median_us(lambda: posix.restore([])),
        "restore_environ": median_us(lambda: process._restore_environ([])),
        "restore_torch": median_us(lambda: process._restore_torch([])),
        "gc_collect": median_us(gc.collect, 100),
        "invalidate_caches": median_us(importlib.invalidate_caches),
        "python_threads": median_us(threading.enumerate),
        "native_threads": median_us(leak_checks._native_threads),
        "fd_links": median_us(fds),  # every target read, as the check did until 2026-12-02
        "fd_check": median_us(lambda: leak_checks.workspace_descriptors(ws)),
        "maps": median_us(lambda: leak_checks.mapped_under(ws, (ws,))),
        "map_files": median_us(leak_checks.file_mapping_ranges),
        "clean_and_check": median_us(lambda: state.clean_and_check(ws)),
        "snapshot": median_us(leak_checks.SandboxState),
        "empty_cache": median_us(backend.empty_cache),
        # What the lease's release asked before emptying the cache, until 2026-12-02.
        "reserved_above_allocated": median_us(
            lambda: torch.cuda.memory_reserved(0) > torch.cuda.memory_allocated(0)
        ) if backend.mode == "gpu" else None,
        "synchronize": median_us(backend.synchronize),
        "fds": len(os.listdir("/proc/self/fd")),
        "threads": len(os.listdir("/proc/self/task")),
        "modules": len(sys.modules),
    }


if "phases" in sys.argv[1:]:
    print(json.dumps({"phases_us": phases()}))
