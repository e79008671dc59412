"""Result encoding (spec protocol §3.2): the results JSON text and its binary part files.

Binary parts are written to ``<results>/part-<k>`` while their SHA-256 is computed and while
they are scanned for the response boundary delimiter ``\\r\\n--<boundary>``, so no part is ever
held twice in memory or read back (except in the practically impossible case of a boundary
collision, where every part file is re-scanned for a new boundary). A large in-memory value
(a returned tensor) is hashed, written and scanned at the same time on three threads (hashlib,
``os.write`` and libc ``memmem`` all run without the GIL), so its cost is the SHA-256 alone.
Kept values (``KeepPolicy``) are written unhashed: the server hashes them as it copies them into
its cache and writes the digest over the placeholder their node carries (``KeptPart``).
"""

from __future__ import annotations

import hashlib
import json
import math
import mmap
import os
import secrets
import sys
import threading
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

from .errors import ExecutionError

DTYPE_ITEM_SIZES: Dict[str, int] = {
    "bool": 1,
    "uint8": 1,
    "int8": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "int16": 2,
    "float16": 2,
    "bfloat16": 2,
    "int32": 4,
    "float32": 4,
    "int64": 8,
    "float64": 8,
}

CHUNK = 1 << 20
_PART_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)


def new_boundary() -> str:
    return "kcoral-" + secrets.token_hex(16)


def delimiter(boundary: str) -> bytes:
    return b"\r\n--" + boundary.encode("ascii")


@dataclass
class Part:
    path: str
    size: int
    sha256: str
    collides: bool  # the delimiter of the boundary current when it was written occurs in it

    def wire(self) -> Dict[str, Any]:
        return {"path": self.path, "size": self.size, "sha256": self.sha256}


KEPT_PLACEHOLDER_PREFIX = "kcoral-kept-"


@dataclass
class KeptPart:
    """A value the server keeps: written unhashed, its ``kept`` node naming ``placeholder``
    where the SHA-256 goes. The server hashes the bytes as it copies them into its cache (it
    must: the worker is not trusted) and writes its digest over the placeholder, so the value is
    hashed once, not in the worker too."""

    path: str
    size: int
    placeholder: str

    def wire(self) -> Dict[str, Any]:
        return {"path": self.path, "size": self.size, "placeholder": self.placeholder}


def new_kept_placeholder() -> str:
    """A string the server replaces with a kept value's digest: it occurs once in the results."""
    return KEPT_PLACEHOLDER_PREFIX + secrets.token_hex(16)


PARALLEL_MIN_BYTES = 4 << 20


def _load_memmem() -> Optional[Callable[[int, int, bytes, int], Optional[int]]]:
    import ctypes

    try:
        fn = ctypes.CDLL(None).memmem
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_void_p
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t]
    return fn


_memmem = _load_memmem()


def _buffer_address(data: memoryview) -> Optional[int]:
    """The address of a contiguous byte view (read-only views too), or None without numpy."""
    try:
        import numpy
    except ImportError:
        return None
    return int(numpy.frombuffer(data, dtype=numpy.uint8).ctypes.data)


def _contains(data: memoryview, needle: bytes) -> bool:
    address = _buffer_address(data) if _memmem is not None else None
    if address is None or _memmem is None:
        return bytes(data).find(needle) >= 0
    return _memmem(address, len(data), needle, len(needle)) is not None


def write_part_parallel(path: str, data: memoryview, needle: bytes) -> Tuple[int, str, bool]:
    """Writes ``data`` to a new file at ``path`` while hashing it and scanning it for ``needle``
    on other threads; returns ``(size, sha256 hex, needle found)``."""
    fd = os.open(path, _PART_FLAGS, 0o600)
    hasher = hashlib.sha256()
    errors: List[BaseException] = []

    def _guarded(fn: Callable[..., Any], *args: Any) -> Callable[[], None]:
        def run() -> None:
            try:
                fn(*args)
            except BaseException as exc:  # re-raised on the calling thread
                errors.append(exc)

        return run

    threads = [
        threading.Thread(target=_guarded(hasher.update, data), name="kcoral-part-hash"),
        threading.Thread(target=_guarded(_write_all, fd, data), name="kcoral-part-write"),
    ]
    try:
        for thread in threads:
            thread.start()
        found = _contains(data, needle)
    finally:
        for thread in threads:
            if thread.ident is not None:
                thread.join()
        os.close(fd)
    if errors:
        raise errors[0]
    return len(data), hasher.hexdigest(), found


def _write_all(fd: int, view: memoryview) -> None:
    while view:
        n = os.write(fd, view)
        view = view[n:]


_IOV_MAX = 1024  # buffers one writev takes (Linux)


class Chunks:
    """A ``bytes`` value given as the buffers it is the concatenation of, so that a function can
    return a large value it assembled from pieces without joining them in memory: a kept return
    (``KeepPolicy``) is written from the pieces straight to its file; any other use joins them
    (``joined``). On the wire it is a ``bytes`` value like any other.

    >>> bytes(Chunks([b"ab", memoryview(b"cd")]).joined())
    b'abcd'
    """

    def __init__(self, parts: List[Any]) -> None:
        self.parts: List[memoryview] = [_byte_view(part) for part in parts]
        self.nbytes = sum(len(part) for part in self.parts)

    def joined(self) -> memoryview:
        """The value as one buffer (a copy of the pieces)."""
        return memoryview(b"".join(self.parts))


def write_pieces(fd: int, pieces: List[memoryview]) -> None:
    """Writes ``pieces`` one after another to ``fd`` with ``writev`` (the kernel copies them),
    however few bytes each call takes."""
    parts = [piece for piece in pieces if len(piece)]
    while parts:
        written = os.writev(fd, parts[:_IOV_MAX])
        if written == 0:
            raise OSError(f"writev: no progress with {len(parts)} pieces left")
        while parts and written >= len(parts[0]):
            written -= len(parts[0])
            parts.pop(0)
        if written:
            parts[0] = parts[0][written:]


def write_kept(path: str, pieces: List[memoryview]) -> int:
    """Writes a kept value's ``pieces`` to a new file at ``path`` with ``writev``; returns its
    size. Neither hashed (the server does) nor scanned for the delimiter (it is never sent)."""
    fd = os.open(path, _PART_FLAGS, 0o600)
    try:
        write_pieces(fd, pieces)
    finally:
        os.close(fd)
    return sum(len(piece) for piece in pieces)


class _PartWriter:
    """Streams bytes into one part file, hashing and scanning for the delimiter on the way.

    All data passes through one staging buffer; the last ``len(needle) - 1`` bytes of the
    previous chunk stay at its front so a delimiter spanning two chunks is found too.
    """

    def __init__(self, path: str, needle: bytes, size_hint: int) -> None:
        self.fd = os.open(path, _PART_FLAGS, 0o600)
        self.hasher = hashlib.sha256()
        self.size = 0
        self.needle = needle
        self.found = False
        self._overlap = len(needle) - 1
        self._chunk = max(1, min(CHUNK, size_hint))
        self._buf = bytearray(self._overlap + self._chunk)
        self._keep = 0

    def _ingest(self, n: int) -> None:
        buf = self._buf
        keep = self._keep
        with memoryview(buf) as whole:
            data = whole[keep : keep + n]
            self.hasher.update(data)
            _write_all(self.fd, data)
            data.release()
        self.size += n
        total = keep + n
        if not self.found and buf.find(self.needle, 0, total) >= 0:
            self.found = True
        new_keep = min(self._overlap, total)
        buf[0:new_keep] = buf[total - new_keep : total]
        self._keep = new_keep

    def write(self, data: memoryview) -> None:
        """Append ``data`` (a 1-D byte view)."""
        step = self._chunk
        for off in range(0, len(data), step):
            piece = data[off : off + step]
            n = len(piece)
            self._buf[self._keep : self._keep + n] = piece
            self._ingest(n)

    def read_from(self, fd: int, nbytes: int) -> int:
        """Copy up to ``nbytes`` from ``fd``; returns how many bytes were copied (short at EOF)."""
        copied = 0
        with memoryview(self._buf) as whole:
            while copied < nbytes:
                want = min(self._chunk, nbytes - copied)
                got = os.readv(fd, [whole[self._keep : self._keep + want]])
                if got == 0:
                    break
                self._ingest(got)
                copied += got
        return copied

    def close(self) -> Tuple[int, str, bool]:
        os.close(self.fd)
        return self.size, self.hasher.hexdigest(), self.found

    def abort(self) -> None:
        try:
            os.close(self.fd)
        except OSError:
            pass


@dataclass
class Staged:
    """A part written under a temporary name, numbered later (folder files are read in walk
    order but numbered in sorted order)."""

    tmp_path: str
    size: int
    sha256: str
    collides: bool


@dataclass
class KeepPolicy:
    """Which binary returns the server keeps in its blob cache instead of sending them
    (``X-KCoral-Keep-Returns``, docs/kept-returns.md): ``bytes`` and tensor values of at least
    ``min_bytes``, while the kept ones of the response total at most ``max_bytes``. A value
    past the total is sent as usual."""

    min_bytes: int
    max_bytes: int


class PartStore:
    """The binary parts of one response, numbered ``return:0..n-1`` in encoding order, and the
    parts the server is to keep (``kept``, not numbered: they are not sent)."""

    def __init__(self, results_dir: str, keep: Optional[KeepPolicy] = None) -> None:
        self.dir = results_dir
        self.parts: List[Part] = []
        self.binary_bytes = 0
        self.kept: List[KeptPart] = []
        self.kept_bytes = 0
        self.keep = keep
        self.boundary = new_boundary()
        self._needle = delimiter(self.boundary)
        self._tmp_counter = 0

    def _path(self, index: int) -> str:
        return os.path.join(self.dir, f"part-{index}")

    def _register(self, path: str, size: int, sha: str, collides: bool) -> Tuple[int, Part]:
        part = Part(path, size, sha, collides)
        self.parts.append(part)
        self.binary_bytes += size
        return len(self.parts) - 1, part

    def add_buffer(self, data: memoryview) -> Tuple[int, Part]:
        path = self._path(len(self.parts))
        return self._register(path, *self._write(path, data))

    def keeps(self, size: int) -> bool:
        """Whether a binary value of ``size`` bytes is to be kept by the server."""
        keep = self.keep
        return (
            keep is not None
            and size >= keep.min_bytes
            and self.kept_bytes + size <= keep.max_bytes
        )

    def add_kept(self, data: "memoryview | Chunks") -> KeptPart:
        """Write a value the server keeps (``kept-<i>``; hashed and cached by the server)."""
        path = os.path.join(self.dir, f"kept-{len(self.kept)}")
        pieces = data.parts if isinstance(data, Chunks) else [data]
        try:
            size = write_kept(path, pieces)
        except BaseException:
            _unlink(path)
            raise
        part = KeptPart(path, size, new_kept_placeholder())
        self.kept.append(part)
        self.kept_bytes += part.size
        return part

    def _write(self, path: str, data: memoryview) -> Tuple[int, str, bool]:
        if len(data) >= PARALLEL_MIN_BYTES:
            try:
                return write_part_parallel(path, data, self._needle)
            except BaseException:
                _unlink(path)
                raise
        writer = _PartWriter(path, self._needle, len(data))
        try:
            writer.write(data)
        except BaseException:
            writer.abort()
            _unlink(path)
            raise
        return writer.close()

    def stage_from_fd(self, fd: int, nbytes: int) -> Tuple[Staged, int]:
        """Copy ``nbytes`` from ``fd`` into a temporary part; returns it and the bytes copied."""
        self._tmp_counter += 1
        path = os.path.join(self.dir, f"tmp-{self._tmp_counter}")
        writer = _PartWriter(path, self._needle, nbytes)
        try:
            copied = writer.read_from(fd, nbytes)
        except BaseException:
            writer.abort()
            _unlink(path)
            raise
        size, sha, found = writer.close()
        return Staged(path, size, sha, found), copied

    def commit(self, staged: Staged) -> Tuple[int, Part]:
        path = self._path(len(self.parts))
        os.rename(staged.tmp_path, path)
        return self._register(path, staged.size, staged.sha256, staged.collides)

    @staticmethod
    def discard(staged: Staged) -> None:
        _unlink(staged.tmp_path)

    def mark(self) -> Tuple[int, int]:
        return len(self.parts), len(self.kept)

    def rollback(self, mark: Tuple[int, int]) -> None:
        """Drop parts (sent and kept) added since ``mark``: numbering stays contiguous."""
        parts, kept = mark
        while len(self.parts) > parts:
            part = self.parts.pop()
            self.binary_bytes -= part.size
            _unlink(part.path)
        while len(self.kept) > kept:
            part = self.kept.pop()
            self.kept_bytes -= part.size
            _unlink(part.path)

    def final_boundary(self) -> str:
        """A boundary whose delimiter occurs in no part (re-drawn in the unlikely other case)."""
        if any(part.collides for part in self.parts):
            while True:
                candidate = new_boundary()
                needle = delimiter(candidate)
                if not any(_file_contains(part.path, needle) for part in self.parts):
                    self.boundary = candidate
                    break
        return self.boundary


def _file_contains(path: str, needle: bytes) -> bool:
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return False
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            return mm.find(needle) >= 0


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _check_text(value: str) -> str:
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ExecutionError(
                "serialization", "cannot return a string containing unpaired surrogates"
            ) from None
    return value


class ValueEncoder:
    """Encodes returned values into result nodes (dicts), writing binary parts to ``store``.

    ``tensor_type`` is ``torch.Tensor`` on GPU and simulated-GPU workers and ``None`` on CPU
    workers (which can never return tensors).
    """

    def __init__(self, store: PartStore, tensor_type: Optional[type]) -> None:
        self.store = store
        self.tensor_type = tensor_type

    def encode(self, value: Any) -> Dict[str, Any]:
        if value is None:
            return {"type": "null"}
        if isinstance(value, bool):
            return {"type": "boolean", "value": value}
        if isinstance(value, int):
            return {"type": "integer", "value": int(value)}
        if isinstance(value, float):
            if not math.isfinite(value):
                raise ExecutionError("serialization", "cannot return a non-finite number")
            return {"type": "number", "value": float(value)}
        if isinstance(value, str):
            return {"type": "string", "value": _check_text(str(value))}
        if isinstance(value, (bytes, bytearray, memoryview)):
            return self._binary("bytes", _byte_view(value))
        if isinstance(value, Chunks):
            if self.store.keeps(value.nbytes):
                kept = self.store.add_kept(value)
                return _kept_node("bytes", kept)
            return self._binary("bytes", value.joined())
        if isinstance(value, (list, tuple)):
            return {"type": "array", "value": [self.encode(item) for item in value]}
        if isinstance(value, dict):
            if not all(isinstance(key, str) for key in value):
                raise ExecutionError("serialization", "returned objects must have string keys")
            return {
                "type": "object",
                "value": {_check_text(str(k)): self.encode(v) for k, v in value.items()},
            }
        if self.tensor_type is not None and isinstance(value, self.tensor_type):
            return self._tensor(value)
        raise ExecutionError(
            "serialization", f"cannot return value of type {type(value).__name__}"
        )

    def _binary(self, kind: str, data: memoryview) -> Dict[str, Any]:
        if self.store.keeps(len(data)):
            return _kept_node(kind, self.store.add_kept(data))
        index, part = self.store.add_buffer(data)
        return {"type": kind, "part": f"return:{index}", "sha256": part.sha256}

    def _tensor(self, value: Any) -> Dict[str, Any]:
        import torch  # only reached when tensor_type is torch.Tensor, so already imported

        try:
            tensor = _host_copy(torch, value)
            dtype = str(tensor.dtype)
            dtype = dtype[6:] if dtype.startswith("torch.") else dtype
            shape = [int(d) for d in tensor.shape]
        except Exception as exc:
            raise ExecutionError(
                "serialization", f"failed to export tensor: {type(exc).__name__}: {exc}"
            ) from exc
        if dtype not in DTYPE_ITEM_SIZES:
            raise ExecutionError("serialization", f"cannot return tensor dtype {dtype!r}")
        try:
            flat = tensor.reshape(-1).view(torch.uint8).numpy()
        except Exception as exc:
            raise ExecutionError(
                "serialization", f"failed to export tensor: {type(exc).__name__}: {exc}"
            ) from exc
        node = self._binary("tensor", memoryview(flat).cast("B"))
        node["dtype"] = dtype
        node["shape"] = shape
        return node


PINNED_MAX_BYTES = 512 << 20


def _host_copy(torch: Any, value: Any) -> Any:
    """A contiguous host copy of a tensor. Device tensors of up to ``PINNED_MAX_BYTES`` land in
    page-locked memory (torch caches those blocks, so a reused worker copies at full DMA speed
    into memory it already touched; a fresh pageable buffer costs page faults on every request)."""
    tensor = value.detach()
    nbytes = tensor.numel() * tensor.element_size()
    if tensor.device.type == "cuda" and 0 < nbytes <= PINNED_MAX_BYTES:
        host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        host.copy_(tensor)
        return host
    return tensor.cpu().contiguous()


def _kept_node(kind: str, kept: KeptPart) -> Dict[str, Any]:
    """A ``kept`` node whose ``sha256`` the server fills in (``KeptPart``)."""
    return {"type": "kept", "kind": kind, "sha256": kept.placeholder, "size": kept.size}


def _byte_view(value: Any) -> memoryview:
    view = memoryview(value)
    if view.c_contiguous:
        return view.cast("B") if (view.format != "B" or view.ndim != 1) else view
    return memoryview(view.tobytes())


class Results:
    """The ``results`` object of one response: returns in execution order."""

    def __init__(
        self, results_dir: str, tensor_type: Optional[type], keep: Optional[KeepPolicy] = None
    ) -> None:
        self.store = PartStore(results_dir, keep)
        self.encoder = ValueEncoder(self.store, tensor_type)
        self.nodes: Dict[str, Dict[str, Any]] = {}

    def add(self, key: str, produce: Callable[[], Dict[str, Any]]) -> None:
        """Run ``produce`` (which encodes one return); on failure its parts are rolled back."""
        mark = self.store.mark()
        try:
            node = produce()
        except BaseException:
            self.store.rollback(mark)
            raise
        self.nodes[key] = node

    def return_value(self, key: str, value: Any) -> None:
        def produce() -> Dict[str, Any]:
            try:
                return self.encoder.encode(value)
            except ExecutionError:
                raise
            except Exception as exc:  # a cycle, or a value whose own methods fail
                raise ExecutionError(
                    "serialization", f"cannot return value: {type(exc).__name__}: {exc}"
                ) from exc

        self.add(key, produce)

    def text(self) -> str:
        """The results JSON text exactly as it goes on the wire."""
        set_digits = getattr(sys, "set_int_max_str_digits", None)
        if set_digits is None:
            return _dumps(self.nodes)
        previous = sys.get_int_max_str_digits()
        set_digits(0)  # integers are arbitrary-size on the wire
        try:
            return _dumps(self.nodes)
        finally:
            set_digits(previous)


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
