"""GPU check of the GPU gate (issue 41) with the real CUDA driver: every way into the GPU waits.

This process plays the server: it runs a real :class:`kcoral_runtime.gate.Gate` over a
:class:`kcoral_runtime.lease.Lease` whose channel it answers itself, starts each way in with the
gate's environment (``CUDA_INJECTION64_PATH``, ``LD_PRELOAD``, ``KCORAL_GATE``), and withholds
the grant: the process must be stopped at its first CUDA call (its ``started`` mark written, no
context of its pid in ``nvidia-smi``, its ``cuda_at`` mark absent after a 0.5 s wait), and its
first CUDA result must come after the grant. Then the lease must come back (``release``) only
once every process holding it has exited.

    python3 tests/gpu/gate_gpu.py            # from the project root, on the GPU machine

Ways in: torch (``import torch`` outside the lease, then a GEMM), ctypes ``cuInit``, a binary
that resolves the driver through ``cuGetProcAddress_v2`` only (fixtures/gate/driver_app.c), an
nvcc-compiled CUDA runtime binary (when nvcc is there), a Python thread, a grandchild process,
``fork`` after CUDA init, and ``ncu`` / ``compute-sanitizer`` when installed (a profiler holds
the lease from its start). Prints ``PASS name: ...`` or ``FAIL name: ...`` per way, and
``RESULT: n/m passed``; exit status 0 when all passed.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "runtime_py"))

from kcoral_runtime import gate_shim  # noqa: E402
from kcoral_runtime.gate import Gate  # noqa: E402
from kcoral_runtime.ipc import FrameDecoder, FrameSocket, encode  # noqa: E402
from kcoral_runtime.lease import Lease  # noqa: E402

FIXTURES = ROOT / "runtime_py" / "tests" / "fixtures" / "gate"
WAIT = 60.0

PRELUDE = """\
import ctypes, os, pathlib, subprocess, sys, threading, time
MARKS = pathlib.Path(os.environ["MARK_DIR"])
def mark(name):
    (MARKS / name).write_text(str(time.monotonic_ns()))
def cuda_driver():
    lib = ctypes.CDLL("libcuda.so.1")
    assert lib.cuInit(0) == 0
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    assert lib.cuDeviceGet(ctypes.byref(dev), 0) == 0
    assert lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
    assert lib.cuCtxSetCurrent(ctx) == 0
    ptr = ctypes.c_uint64()
    assert lib.cuMemAlloc_v2(ctypes.byref(ptr), 1 << 20) == 0
mark("started")
"""

CUDA_APP = r"""
#include <cstdio>
__global__ void fill(float *x) { x[threadIdx.x] = threadIdx.x; }
int main() {
  float *x;
  if (cudaMalloc(&x, 256 * sizeof(float)) != cudaSuccess) return 2;
  fill<<<1, 256>>>(x);
  if (cudaDeviceSynchronize() != cudaSuccess) return 3;
  std::printf("cuda app done\n");
  return 0;
}
"""


class Server:
    """The server's side of the lease: records frames, grants when told."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.frames: List[str] = []
        self.cond = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        decoder = FrameDecoder()
        while True:
            data = self.sock.recv(4096)
            if not data:
                return
            for payload in decoder.feed(data):
                with self.cond:
                    self.frames.append(json.loads(payload)["a"])
                    self.cond.notify_all()

    def wait_for(self, count: int, what: str, timeout: float = WAIT) -> bool:
        deadline = time.monotonic() + timeout
        with self.cond:
            while self.frames.count(what) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(left)
        return True

    def grant(self) -> int:
        at = time.monotonic_ns()
        self.sock.sendall(encode({"t": "lease", "a": "granted"}))
        return at


def compute_pids() -> Optional[List[int]]:
    if shutil.which("nvidia-smi") is None:
        return None
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
                         capture_output=True, text=True)
    return [int(x) for x in out.stdout.split() if x.strip().isdigit()]


def check(name: str, command: List[str], env: Dict[str, str], marks: Path, server: Server,
          lease: Lease, expect_marks: bool = True, outlived: bool = False) -> Optional[str]:
    """Runs one way in; returns None when it passed, else what went wrong."""
    for mark in marks.iterdir():
        mark.unlink()
    acquires = server.frames.count("acquire")
    releases = server.frames.count("release")
    proc = subprocess.Popen(command, env=env, cwd=marks.parent)
    try:
        if not server.wait_for(acquires + 1, "acquire"):
            return "no acquire: the process never asked for the lease"
        if expect_marks and not (marks / "started").exists():
            return "the lease was asked for before the process started its own code"
        pids = compute_pids()
        time.sleep(0.5)  # room for a broken gate to let the process through
        if (marks / "cuda_at").exists():
            return "the process reached CUDA before the grant"
        if pids is not None and proc.pid in pids:
            return f"nvidia-smi lists a context of pid {proc.pid} before the grant"
        granted = server.grant()
        rc = proc.wait(timeout=300)
        if rc != 0:
            return f"exit status {rc}"
        if outlived and server.frames.count("release") != releases:
            return "the lease came back while the process's fork still ran"
        if expect_marks:
            cuda_at = int((marks / "cuda_at").read_text())
            if cuda_at <= granted:
                return "the first CUDA result came before the grant"
        if not server.wait_for(releases + 1, "release"):
            return "the lease did not come back after the process exited"
        if lease.processes != 0:
            return f"{lease.processes} holds left"
        return None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="kcoral-gate-gpu-"))
    marks = work / "marks"
    marks.mkdir()
    shim = gate_shim.build(str(work / "shim"))
    cc = gate_shim.c_compiler() or "cc"
    subprocess.run([cc, str(FIXTURES / "driver_app.c"), "-o", str(work / "driver_app"), "-ldl"],
                   check=True)
    ours, theirs = socket.socketpair()
    lease = Lease(FrameSocket(ours), None)
    server = Server(theirs)
    gate = Gate(lease, shim)
    gate.begin_request()
    env = {**os.environ, **gate.environment(), "MARK_DIR": str(marks)}
    py = sys.executable
    mark_after = "mark('cuda_at')\n"
    cases: Dict[str, List[str]] = {
        "torch": [py, "-c", PRELUDE + "import torch\n"
                  "a = torch.randn(2048, 2048, device='cuda')\n"
                  "b = a @ a\ntorch.cuda.synchronize()\n" + mark_after],
        "ctypes_cuInit": [py, "-c", PRELUDE + "cuda_driver()\n" + mark_after],
        "python_thread": [py, "-c", PRELUDE + "t = threading.Thread(target=cuda_driver)\n"
                          "t.start()\nt.join()\n" + mark_after],
        "grandchild": [py, "-c", PRELUDE + "subprocess.run([sys.executable, '-c', "
                       "'import ctypes; assert ctypes.CDLL(\"libcuda.so.1\").cuInit(0) == 0'],"
                       " check=True)\n" + mark_after],
        "cuGetProcAddress_binary": [py, "-c", PRELUDE + "subprocess.run(["
                                    f"{str(work / 'driver_app')!r}], check=True)\n" + mark_after],
        "fork_after_init": [py, "-c", PRELUDE + "import torch\n"
                            "torch.ones(1, device='cuda'); torch.cuda.synchronize()\n"
                            + mark_after + "if os.fork() == 0:\n"
                            "    time.sleep(1.0)\n    os._exit(0)\n"],
    }
    nvcc = shutil.which("nvcc")
    if nvcc:
        (work / "app.cu").write_text(CUDA_APP)
        subprocess.run([nvcc, str(work / "app.cu"), "-o", str(work / "cuda_app")], check=True)
        cases["cudart_binary"] = [py, "-c", PRELUDE + "subprocess.run(["
                                  f"{str(work / 'cuda_app')!r}], check=True)\n" + mark_after]
    profilers = {}
    for tool, args in (("ncu", ["--target-processes", "all"]), ("compute-sanitizer", [])):
        path = shutil.which(tool)
        if path:
            profilers[tool] = [path, *args, py, "-c",
                               "import torch; torch.ones(1, device='cuda'); "
                               "torch.cuda.synchronize()"]
    passed = 0
    total = 0
    for name, command in cases.items():
        total += 1
        problem = check(name, command, env, marks, server, lease,
                        outlived=name == "fork_after_init")
        print(f"{'FAIL' if problem else 'PASS'} {name}: {problem or 'waited for the grant'}")
        passed += problem is None
    for name, command in profilers.items():
        total += 1
        problem = check(name, command, env, marks, server, lease, expect_marks=False)
        print(f"{'FAIL' if problem else 'PASS'} {name} (lease from the profiler's start): "
              f"{problem or 'waited for the grant'}")
        passed += problem is None
    print(f"RESULT: {passed}/{total} passed")
    shutil.rmtree(work, ignore_errors=True)
    return 0 if passed == total else 1


if __name__ == "__main__":
    sys.exit(main())
