"""Large buffers on transparent huge pages, for data that is written whole right after it is made
and never in timed code: a ``bytes`` upload read from its blob file (``files.read_blob_bytes``)
and an eval bundle assembled from its tensors (``eval_bundle.BundleWriter.finish``).

A fresh worker faults such a buffer in a 4 KiB page at a time (on a VM ~17 µs a page: 0.8 s for
192 MiB); ``madvise(MADV_HUGEPAGE)`` on the buffer before it is written lets the kernel back it
with 2 MiB pages where its mode is ``madvise`` or ``always``. Only these buffers are advised, not
the process's allocator: the heap and every other allocation stay as glibc makes them, so timed
code runs as before (decisions/worker-huge-pages.md says why the allocator-wide tunable was
rejected). Anything that cannot be done (no libc, a Python without these C functions) falls back
to the plain buffer.

    new_bytes(size)      -> (bytes, writable view) | None   the caller fills every byte
    new_bytearray(size)  -> bytearray                       zero-filled, as bytearray(size)
"""

from __future__ import annotations

import ctypes
from typing import Any, Optional, Tuple

MIN_BYTES = 64 << 20
"""Smaller buffers are left alone. At this size glibc always maps a new zero-filled region (its
mmap threshold moves up to 32 MiB at most), so a buffer made without initialising it is zeros."""

_HUGE = 2 << 20
_MADV_HUGEPAGE = 14


def _object_functions(kind: str) -> Tuple[Any, Any]:
    """``<kind>_FromStringAndSize`` (a new object, unfilled with NULL) and ``<kind>_AsString``."""
    new = getattr(ctypes.pythonapi, f"{kind}_FromStringAndSize")
    new.argtypes = (ctypes.c_char_p, ctypes.c_ssize_t)
    new.restype = ctypes.py_object
    pointer = getattr(ctypes.pythonapi, f"{kind}_AsString")
    pointer.argtypes = (ctypes.py_object,)
    pointer.restype = ctypes.c_void_p
    return new, pointer


def _bind() -> Optional[Tuple[Any, Any, Any, Any, Any]]:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        madvise = libc.madvise
        madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        madvise.restype = ctypes.c_int
        new_bytes, bytes_ptr = _object_functions("PyBytes")
        new_array, array_ptr = _object_functions("PyByteArray")
        return madvise, new_bytes, bytes_ptr, new_array, array_ptr
    except (OSError, AttributeError):
        return None


_C = _bind()


def _advise(address: int, size: int) -> None:
    """Advise the whole 2 MiB pages inside ``[address, address + size)``; failure is harmless."""
    assert _C is not None
    start = (address + _HUGE - 1) & ~(_HUGE - 1)
    end = (address + size) & ~(_HUGE - 1)
    if end > start:
        _C[0](start, end - start, _MADV_HUGEPAGE)


def new_bytes(size: int) -> Optional[Tuple[bytes, memoryview]]:
    """A new ``bytes`` of ``size`` on huge pages and a writable view of its memory, or ``None``
    (too small, or not possible here). The caller must fill every byte before the object is
    used or seen by anything else: ``bytes`` are immutable once shared."""
    if _C is None or size < MIN_BYTES:
        return None
    data = _C[1](None, size)
    address = _C[2](data)
    _advise(address, size)
    view = memoryview((ctypes.c_char * size).from_address(address)).cast("B")
    return data, view


def new_bytearray(size: int) -> bytearray:
    """``bytearray(size)`` (zeros), on huge pages when it is large enough."""
    if _C is None or size < MIN_BYTES:
        return bytearray(size)
    array = _C[3](None, size)
    _advise(_C[4](array), size)
    return array
