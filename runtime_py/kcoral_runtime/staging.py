"""Host staging of tensor uploads on reused GPU workers.

A tensor upload reads its blob file (page cache, ``/dev/shm``) into page-locked memory and then
copies it to the device in one DMA. On the H200 host one thread reads 64 MiB in ~17 ms, eight
threads in ~3.4 ms, and the DMA itself takes ~1.2 ms; so the file is read by several threads at
once (``read_parallel``), and a reused worker keeps the staged bytes of the blobs it uploaded last
(``PinnedBlobCache``): the next request with the same inputs — a kernel being tuned against fixed
data — uploads them straight from page-locked memory.

The cache key is the blob file's identity (path, inode, size, modification time), not its name
alone, so a file replaced under the same name is read again. The cache keeps host copies only;
device memory is never held between requests.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from typing import Any, Callable, List, Optional, Tuple

# Below this a single read is as fast as several.
PARALLEL_READ_MIN_BYTES = 8 << 20
# Bytes per reading thread, and the most threads one read uses.
_BYTES_PER_THREAD = 8 << 20
_MAX_THREADS = 8

# Page-locked bytes one reused worker keeps for recently uploaded blobs.
PINNED_BLOB_CACHE_BYTES = 256 << 20

_Key = Tuple[str, int, int, int]


def _read_range(fd: int, view: memoryview, offset: int) -> None:
    got = 0
    while got < len(view):
        n = os.preadv(fd, [view[got:]], offset + got)
        if n == 0:
            raise ValueError("the blob is shorter than its size")
        got += n


def read_parallel(fd: int, view: memoryview, threads: Optional[int] = None) -> None:
    """Fills ``view`` with the first ``len(view)`` bytes of the open file ``fd``, with several
    threads for large reads (``os.preadv`` releases the GIL)."""
    nbytes = len(view)
    if threads is None:
        threads = min(_MAX_THREADS, os.cpu_count() or 1, max(1, nbytes // _BYTES_PER_THREAD))
    if threads <= 1 or nbytes < PARALLEL_READ_MIN_BYTES:
        _read_range(fd, view, 0)
        return
    step = -(-nbytes // threads) + 4095 & ~4095  # page-aligned slices
    errors: List[BaseException] = []

    def _slice(start: int) -> None:
        try:
            _read_range(fd, view[start : min(nbytes, start + step)], start)
        except BaseException as exc:  # re-raised on the calling thread
            errors.append(exc)

    workers = [
        threading.Thread(target=_slice, args=(start,), name="kcoral-blob-read")
        for start in range(step, nbytes, step)
    ]
    for worker in workers:
        worker.start()
    _slice(0)
    for worker in workers:
        worker.join()
    if errors:
        raise errors[0]


def checked_blob_size(fd: int, nbytes: int) -> os.stat_result:
    """``fstat`` of an open blob file that must hold exactly ``nbytes`` (else ``ValueError``)."""
    info = os.fstat(fd)
    if info.st_size != nbytes:
        raise ValueError(f"the blob holds {info.st_size} bytes, the dtype and shape need {nbytes}")
    return info


def read_blob(path: str, view: memoryview) -> None:
    """Fills ``view`` with the blob file at ``path``, which must be exactly as long."""
    with open(path, "rb", buffering=0) as f:
        checked_blob_size(f.fileno(), len(view))
        read_parallel(f.fileno(), view)


class PinnedBlobCache:
    """Staged (page-locked) bytes of recently uploaded blob files, least recently used first out.

    ``allocate(nbytes)`` returns a new buffer object and a writable byte ``memoryview`` of it (on
    a GPU worker: a pinned ``torch.uint8`` tensor and its numpy view)."""

    def __init__(
        self,
        allocate: Callable[[int], Tuple[Any, memoryview]],
        limit_bytes: int = PINNED_BLOB_CACHE_BYTES,
    ) -> None:
        self._allocate = allocate
        self._limit = limit_bytes
        self._entries: "OrderedDict[_Key, Tuple[Any, int]]" = OrderedDict()  # buffer, size
        self._bytes = 0
        self.hits = 0
        self.reads = 0

    @property
    def cached_bytes(self) -> int:
        return self._bytes

    def stage(self, path: str, nbytes: int) -> Any:
        """The buffer holding the blob file at ``path`` (exactly ``nbytes`` long, else
        ``ValueError``). The caller only reads it: it may be handed out again later."""
        with open(path, "rb", buffering=0) as f:
            info = checked_blob_size(f.fileno(), nbytes)
            key: _Key = (path, info.st_ino, info.st_size, info.st_mtime_ns)
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
                self.hits += 1
                return entry[0]
            keep = nbytes <= self._limit
            if keep:
                # Room first: the evicted buffers go back to the allocator before this one is
                # taken, so it can hand one of them out again (a new pinned block costs far
                # more than the read).
                while self._bytes + nbytes > self._limit:
                    _, (_, size) = self._entries.popitem(last=False)
                    self._bytes -= size
            buffer, view = self._allocate(nbytes)
            read_parallel(f.fileno(), view)
            self.reads += 1
        if keep:
            self._entries[key] = (buffer, nbytes)
            self._bytes += nbytes
        return buffer

    def clear(self) -> None:
        """Drops every staged blob (their memory goes back to the allocator)."""
        self._entries.clear()
        self._bytes = 0
