"""Unit tests of upload staging: parallel reads and the page-locked blob cache (CPU buffers stand
in for pinned memory here; the GPU machine runs the same code with pinned torch tensors)."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any, List, Tuple

import numpy as np
import pytest

from kcoral_runtime import staging
from kcoral_runtime.staging import PinnedBlobCache, read_parallel


def _blob(path: Path, nbytes: int, seed: int) -> bytes:
    data = np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8).tobytes()
    path.write_bytes(data)
    return data


def _read_file(path: Path, nbytes: int, threads: int) -> bytes:
    out = bytearray(nbytes)
    fd = os.open(path, os.O_RDONLY)
    try:
        read_parallel(fd, memoryview(out), threads=threads)
    finally:
        os.close(fd)
    return bytes(out)


def _numpy_allocate(nbytes: int) -> Tuple[Any, memoryview]:
    array = np.empty(nbytes, dtype=np.uint8)
    return array, memoryview(array)


@pytest.mark.parametrize("nbytes", [0, 1, 4095, (8 << 20) + 12345, 40 << 20])
def test_read_parallel_reads_every_byte(tmp_path: Path, nbytes: int) -> None:
    data = _blob(tmp_path / "b", nbytes, nbytes)
    assert _read_file(tmp_path / "b", nbytes, threads=3) == data


def test_read_parallel_uses_threads_for_large_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = _blob(tmp_path / "b", 32 << 20, 1)
    seen: List[str] = []
    real = os.preadv

    def recording(fd: int, buffers: Any, offset: int) -> int:
        seen.append(threading.current_thread().name)
        return real(fd, buffers, offset)

    monkeypatch.setattr(staging.os, "preadv", recording)
    assert _read_file(tmp_path / "b", len(data), threads=4) == data
    assert seen.count("kcoral-blob-read") >= 3


def test_read_parallel_short_file_is_an_error(tmp_path: Path) -> None:
    _blob(tmp_path / "b", 100, 2)
    fd = os.open(tmp_path / "b", os.O_RDONLY)
    try:
        with pytest.raises(ValueError, match="shorter"):
            read_parallel(fd, memoryview(bytearray(200)))
    finally:
        os.close(fd)


def test_cache_serves_the_same_blob_without_reading(tmp_path: Path) -> None:
    data = _blob(tmp_path / "a", 1 << 20, 3)
    cache = PinnedBlobCache(_numpy_allocate, limit_bytes=4 << 20)
    first = cache.stage(str(tmp_path / "a"), len(data))
    second = cache.stage(str(tmp_path / "a"), len(data))
    assert second is first and first.tobytes() == data
    assert (cache.reads, cache.hits, cache.cached_bytes) == (1, 1, len(data))


def test_cache_reads_a_replaced_file_again(tmp_path: Path) -> None:
    path = tmp_path / "a"
    _blob(path, 4096, 4)
    cache = PinnedBlobCache(_numpy_allocate)
    cache.stage(str(path), 4096)
    replacement = tmp_path / "a.new"
    fresh = _blob(replacement, 4096, 5)
    os.replace(replacement, path)  # same name, another inode
    assert cache.stage(str(path), 4096).tobytes() == fresh
    assert cache.reads == 2


def test_cache_evicts_least_recently_used(tmp_path: Path) -> None:
    blobs = {name: _blob(tmp_path / name, 1 << 20, i) for i, name in enumerate("abc")}
    cache = PinnedBlobCache(_numpy_allocate, limit_bytes=2 << 20)
    cache.stage(str(tmp_path / "a"), 1 << 20)
    cache.stage(str(tmp_path / "b"), 1 << 20)
    cache.stage(str(tmp_path / "a"), 1 << 20)  # a is now the most recent
    cache.stage(str(tmp_path / "c"), 1 << 20)  # evicts b
    assert cache.cached_bytes == 2 << 20
    reads = cache.reads
    assert cache.stage(str(tmp_path / "a"), 1 << 20).tobytes() == blobs["a"]
    assert cache.reads == reads
    assert cache.stage(str(tmp_path / "b"), 1 << 20).tobytes() == blobs["b"]
    assert cache.reads == reads + 1


def test_cache_does_not_keep_blobs_over_its_limit(tmp_path: Path) -> None:
    data = _blob(tmp_path / "big", 3 << 20, 6)
    cache = PinnedBlobCache(_numpy_allocate, limit_bytes=2 << 20)
    assert cache.stage(str(tmp_path / "big"), len(data)).tobytes() == data
    assert cache.cached_bytes == 0
    cache.stage(str(tmp_path / "big"), len(data))
    assert cache.reads == 2


def test_cache_checks_the_size(tmp_path: Path) -> None:
    _blob(tmp_path / "a", 100, 7)
    cache = PinnedBlobCache(_numpy_allocate)
    with pytest.raises(ValueError, match="holds 100 bytes"):
        cache.stage(str(tmp_path / "a"), 64)
    assert cache.cached_bytes == 0


def test_cache_makes_room_before_allocating(tmp_path: Path) -> None:
    for i, name in enumerate("abc"):
        _blob(tmp_path / name, 1 << 20, 10 + i)
    cached_at_allocation: List[int] = []
    cache: PinnedBlobCache

    def allocate(nbytes: int) -> Tuple[Any, memoryview]:
        cached_at_allocation.append(cache.cached_bytes)
        return _numpy_allocate(nbytes)

    cache = PinnedBlobCache(allocate, limit_bytes=2 << 20)
    for name in "abc":
        cache.stage(str(tmp_path / name), 1 << 20)
    # The third blob is allocated only after the first was dropped.
    assert cached_at_allocation == [0, 1 << 20, 1 << 20]
