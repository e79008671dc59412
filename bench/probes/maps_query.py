"""The sandbox's mapped-file check two ways, in-process, with torch imported (``cuda``: and a
CUDA context made): reading ``/proc/self/maps`` as text (what ``hygiene.mapped_under`` does)
against a ``PROCMAP_QUERY`` ioctl walk (Linux 6.11+) over the file-backed mappings, asking for a
mapping's name only where the verdict needs it. Both must find the same files; medians of 400
calls, in µs, three rounds.

  text_read               open, read and (only if the workspace path occurs) parse the text
  walk_dev_or_new_inode   names for mappings on the workspace's device, or whose (device, inode)
                          the idle baseline walk did not see
  walk_new_inode_only     names only for (device, inode) pairs not in the baseline
  getppid_ns              one trivial syscall, for scale

    python3 bench/probes/maps_query.py [cuda]
"""
import ctypes
import errno
import fcntl
import json
import mmap
import os
import struct
import sys
import tempfile

import torch

from _timing import median_us  # bench/probes/_timing.py

if "cuda" in sys.argv[1:]:
    torch.ones(1, device="cuda").add_(1)
    torch.cuda.synchronize()
else:
    torch.ones(1 << 18).mul_(2)

PROCMAP_QUERY = 0xC0686611  # _IOWR('f', 17, struct procmap_query): 104 bytes
COVERING_OR_NEXT_VMA, FILE_BACKED_VMA = 0x10, 0x20
work = tempfile.mkdtemp()
dev = os.stat(work).st_dev
DEV = (os.major(dev), os.minor(dev))


def text_read(root):
    with open("/proc/self/maps", "rb") as maps:
        data = maps.read()
    found = set()
    if root.encode() in data:
        for line in data.decode(errors="replace").splitlines():
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].startswith(root + "/"):
                found.add(fields[5])
    return found


name = bytearray(4096)
name_addr = ctypes.addressof((ctypes.c_char * len(name)).from_buffer(name))
query = bytearray(104)


def walk(root, baseline, by_device=True, every_name=False):
    """(files under root, the (major, minor, inode) of every file-backed mapping)."""
    fd = os.open("/proc/self/maps", os.O_RDONLY | os.O_CLOEXEC)
    found, seen, addr = set(), set(), 0
    pack, unpack, ioctl = struct.pack_into, struct.unpack_from, fcntl.ioctl
    try:
        while True:
            pack("=3Q", query, 0, 104, COVERING_OR_NEXT_VMA | FILE_BACKED_VMA, addr)
            pack("=IIQQ", query, 80, 0, 0, 0, 0)  # no name, no build id
            try:
                ioctl(fd, PROCMAP_QUERY, query, True)
            except OSError as exc:
                if exc.errno == errno.ENOENT:  # no mapping at or after addr
                    break
                raise
            end, inode, major, minor = unpack("=Q24xQII", query, 32)
            key = (major, minor, inode)
            seen.add(key)
            if every_name or (by_device and (major, minor) == DEV) or key not in baseline:
                pack("=IIQ", query, 80, len(name), 0, name_addr)
                ioctl(fd, PROCMAP_QUERY, query, True)
                size = unpack("=I", query, 80)[0]
                path = bytes(name[:max(size - 1, 0)]).decode(errors="replace")
                if path.startswith(root + "/"):
                    found.add(path)
            addr = end
    finally:
        os.close(fd)
    return found, seen


_, baseline = walk(work, set(), every_name=True)
assert text_read(work) == walk(work, baseline)[0] == set()
path = os.path.join(work, "mapped.bin")
with open(path, "wb") as f:
    f.write(bytes(4096))
with open(path, "r+b") as f:
    mapped = mmap.mmap(f.fileno(), 4096)
for by_device in (True, False):
    assert text_read(work) == walk(work, baseline, by_device)[0] == {path}
mapped.close()
report = {
    "kernel": os.uname().release,
    "maps_lines": len(open("/proc/self/maps").read().splitlines()),
    "file_inodes": len(baseline),
    "workspace_device": DEV,
}
for round_ in range(3):
    report[f"round {round_}"] = {
        "text_read": median_us(lambda: text_read(work)),
        "walk_dev_or_new_inode": median_us(lambda: walk(work, baseline)),
        "walk_new_inode_only": median_us(lambda: walk(work, baseline, False)),
        "getppid_ns": round(median_us(os.getppid, 2000) * 1000),
    }
print(json.dumps(report))
