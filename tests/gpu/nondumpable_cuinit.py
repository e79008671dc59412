"""GPU check: a process that is not dumpable initialises CUDA and runs a kernel.

A fresh worker runs its lease-free set-up (``cuInit``) before ``init`` while not dumpable
(runtime_py/kcoral_runtime/child.py); should a driver refuse that, the set-up runs again at
``init``, under the lease, and fresh workers get slower. This checks the driver API directly
(no torch), as the current user and, when ``setpriv`` and root allow it, as ``nobody`` (the
``/proc/self`` files of a process that is not dumpable belong to root).

    python3 tests/gpu/nondumpable_cuinit.py
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

CHECK = r"""
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
assert libc.prctl(4, 0, 0, 0, 0) == 0  # PR_SET_DUMPABLE 0
cuda = ctypes.CDLL("libcuda.so.1")
def call(name, *args):
    rc = getattr(cuda, name)(*args)
    assert rc == 0, f"{name} returned {rc}"
call("cuInit", 0)
device, context, pointer = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
call("cuDeviceGet", ctypes.byref(device), 0)
call("cuDevicePrimaryCtxRetain", ctypes.byref(context), device)
call("cuCtxSetCurrent", context)
call("cuMemAlloc_v2", ctypes.byref(pointer), ctypes.c_size_t(1 << 20))
call("cuMemsetD8_v2", pointer, ctypes.c_ubyte(1), ctypes.c_size_t(1 << 20))
call("cuCtxSynchronize")
call("cuMemFree_v2", pointer)
assert libc.prctl(3, 0, 0, 0, 0) == 0, "dumpable again"  # PR_GET_DUMPABLE
print("cuInit, a context, an allocation and a memset while not dumpable")
"""


def _run(argv: list[str], label: str) -> bool:
    done = subprocess.run(argv + [sys.executable, "-c", CHECK], capture_output=True, text=True,
                          timeout=120, cwd="/")
    ok = done.returncode == 0
    detail = (done.stdout if ok else done.stderr).strip().splitlines()[-1:] or [""]
    print(f"{'PASS' if ok else 'FAIL'} [{label}] {detail[0]}")
    return ok


def main() -> int:
    results = [_run([], f"uid {os.getuid()}")]
    if os.getuid() == 0 and shutil.which("setpriv"):
        results.append(_run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"],
                            "nobody"))
    print("RESULT:", "PASS" if all(results) else "FAIL")
    return 0 if all(results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
