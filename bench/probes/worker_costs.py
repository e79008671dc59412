"""Costs of the worker's 64 MiB path with the runtime's own functions on the local GPU: staged
uploads, parallel reads into pinned memory, the DMA, the result's pinned copy, hash, write and
scan; plus the host (CPU, SHA extensions, THP, OpenSSL).

    python3 bench/probes/worker_costs.py   # from the repository root
"""
import sys, os, time, statistics, hashlib, threading, subprocess
import numpy as np, torch
sys.path.insert(0, "runtime_py")
from kcoral_runtime import devices, staging, values
N = 64 << 20
def t(name, f, n=7, setup=None):
    xs = []
    for _ in range(n):
        if setup: setup()
        t0 = time.perf_counter(); f(); xs.append((time.perf_counter() - t0) * 1000)
    print(f"{name}: median {statistics.median(xs):.2f} min {min(xs):.2f} max {max(xs):.2f} ms", flush=True)
print(subprocess.run("lscpu | grep -E 'Model name|^CPU\\(s\\)'; grep -o -m1 -w sha_ni /proc/cpuinfo; cat /sys/kernel/mm/transparent_hugepage/enabled; df -h /tmp /dev/shm | tail -2; python3 -c 'import ssl; print(ssl.OPENSSL_VERSION)'", shell=True, capture_output=True, text=True).stdout)
b = devices.GpuBackend({}); b.init(); b.reused = True
path = "/dev/shm/kc-probe-a"
with open(path, "wb") as f: f.write(os.urandom(N))
sync = torch.cuda.synchronize
t("load_tensor reused (pinned staging, cached after the first)", lambda: (b.load_tensor(path, "float32", [N // 4]), sync()))
fresh = []
def new_blob():
    fresh.append(f"/dev/shm/kc-probe-new-{len(fresh)}")
    with open(fresh[-1], "wb") as f: f.write(os.urandom(N))
t("load_tensor reused, a new blob each time (staging miss)", lambda: (b.load_tensor(fresh[-1], "float32", [N // 4]), sync()), setup=new_blob)
for p in fresh: os.unlink(p)
b.reused = False
t("load_tensor mmap path", lambda: (b.load_tensor(path, "float32", [N // 4]), sync()))
pin = torch.empty(N, dtype=torch.uint8, pin_memory=True)
dev = torch.empty(N, dtype=torch.uint8, device="cuda")
pv = memoryview(pin.numpy())
def read(threads):
    with open(path, "rb", buffering=0) as f:
        staging.read_parallel(f.fileno(), pv, threads=threads)
for k in (1, 2, 4, 8): t(f"read into pinned, {k} thread(s)", lambda k=k: read(k))
t("H2D pinned", lambda: (dev.copy_(pin, non_blocking=True), sync()))
x = torch.randn(N // 4, device="cuda")
t("_host_copy (D2H pinned)", lambda: values._host_copy(torch, x))
h = values._host_copy(torch, x); mv = memoryview(h.view(torch.uint8).numpy())
out = "/tmp/kc-probe-out"
rm = lambda: os.path.exists(out) and os.unlink(out)
t("write_part_parallel /tmp", lambda: values.write_part_parallel(out, mv, b"\r\n--kcoral-abc"), setup=rm)
out = "/dev/shm/kc-probe-out"
t("write_part_parallel /dev/shm", lambda: values.write_part_parallel(out, mv, b"\r\n--kcoral-abc"), setup=rm)
t("sha256 hashlib", lambda: hashlib.sha256(mv).hexdigest())
t("memmem scan", lambda: values._contains(mv, b"\r\n--kcoral-abc"))
def wr():
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600); values._write_all(fd, mv); os.close(fd)
t("write new file /dev/shm", wr, setup=rm)
