"""huge_pages.py: large upload reads and bundles on transparent huge pages, same bytes."""

from __future__ import annotations

import ctypes
import hashlib
import os
from pathlib import Path

import pytest

from kcoral_runtime import files, huge_pages
from kcoral_runtime.eval_bundle import Bundle, BundleWriter


def _thp_possible() -> bool:
    try:
        mode = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return False
    return "[never]" not in mode


def _huge_kib_at(address: int) -> int:
    """AnonHugePages of the mapping that holds ``address`` (/proc/self/smaps)."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and ":" not in head:
            start, end = (int(x, 16) for x in head.split("-"))
            inside = start <= address < end
        elif inside and line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    return 0


def test_read_blob_bytes_large_and_small(tmp_path: Path) -> None:
    for size in (0, 4096, huge_pages.MIN_BYTES - 1, huge_pages.MIN_BYTES + 12345):
        path = tmp_path / f"blob-{size}"
        data = (os.urandom(1 << 16) * (size // (1 << 16) + 1))[:size]
        path.write_bytes(data)
        read = files.read_blob_bytes(str(path))
        assert type(read) is bytes and len(read) == size
        assert hashlib.sha256(read).digest() == hashlib.sha256(data).digest()
        assert hash(read) == hash(bytes(data))


def test_read_blob_bytes_refuses_a_blob_that_shrinks(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "blob"
    path.write_bytes(b"\1" * huge_pages.MIN_BYTES)
    real_fstat = os.fstat

    class _Bigger:
        def __init__(self, st: os.stat_result) -> None:
            self.st_size = st.st_size + 10

    monkeypatch.setattr(files.os, "fstat", lambda fd: _Bigger(real_fstat(fd)))
    with pytest.raises(OSError, match="shorter than"):
        files.read_blob_bytes(str(path))


def test_new_bytearray_is_zeros_and_large_ones_get_huge_pages() -> None:
    small = huge_pages.new_bytearray(1000)
    assert small == bytearray(1000)
    large = huge_pages.new_bytearray(huge_pages.MIN_BYTES)
    assert len(large) == huge_pages.MIN_BYTES and not any(large[::4093])
    large[:] = b"\x07" * len(large)  # touch every page
    if _thp_possible():
        # The advised whole 2 MiB pages: a mapping of their own, from the first aligned address.
        middle = ctypes.addressof(ctypes.c_char.from_buffer(large)) + len(large) // 2
        assert _huge_kib_at(middle) > 0


def test_a_large_bundle_round_trips() -> None:
    import torch

    writer = BundleWriter()
    tensors = [torch.arange(17 << 20, dtype=torch.float32), torch.ones(3, dtype=torch.int64)]
    header = {"values": [writer.describe_value(t) for t in tensors]}
    out = writer.finish(header)
    assert type(out) is bytearray and len(out) > huge_pages.MIN_BYTES
    bundle = Bundle(bytes(out))
    for described, tensor in zip(header["values"], tensors):
        assert torch.equal(bundle.value(described), tensor)
