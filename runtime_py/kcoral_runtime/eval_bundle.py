"""Raw tensor bundles: how ``kcoral eval``'s workers hand inputs and outputs to each other.

A bundle is bytes that only ever describe data, never code (no pickle): a magic line, the
header's length, the header as JSON, then every tensor's raw bytes back to back::

    b"KCEVAL1\\n" | u64 little-endian header length | header JSON (UTF-8) | tensor bytes ...

    encode_bundle(header, tensors) --bytes--> (client, blob cache) --bytes--> decode_bundle
      header["tensors"][i] = {"dtype", "shape", "offset", "nbytes", "sha256" (or None)}

A bundle may also travel as **segments**: its bytes cut between whole tensors into a few
values (``BundleWriter.segments``), so that the server, which hashes every kept value, hashes
them on several threads; ``Bundle`` reads a list of segments as the one bundle they join to,
each tensor inside one of them.

The per-tensor SHA-256s make a bundle checkable in parallel: the SHA-256 of the bundle's
``prefix`` (magic, length, header) pins every tensor's digest, and ``verify_tensors`` checks
the tensors against them on several threads (hashlib lets go of the GIL while it hashes), where
one SHA-256 of the whole bundle is one core's work.

Values (a model's inputs or outputs) are described in the header by ``describe_value``: a
tensor becomes ``{"t": "tensor", "i": index, ...}`` (its bytes in the bundle), a number, bool,
string or None ``{"t": "scalar", "v": value}``, a list or tuple ``{"t": "list"|"tuple",
"items": [...]}``; anything else ``{"t": "other", "type": name}`` without data. A tensor that
is not a plain ``torch.Tensor`` (a subclass, a lazy wrapper) is stored by its plain data with
``"plain": false``: the judge flags it.

``capture_value`` copies a value at one moment: every tensor's data into memory that only the
caller holds (a ``Captured`` that remembers the tensor's type), read without a subclass's
``__torch_function__``. The candidate's worker captures each output right after the call that
made it, so an output the candidate later overwrites, or fills in late, is judged as it was when
the call returned.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import math
import os
import struct
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .huge_pages import new_bytearray
from .values import Chunks, write_pieces

MAGIC = b"KCEVAL1\n"
# The least share of a bundle worth a segment of its own (BundleWriter.segments).
SEGMENT_MIN_BYTES = 16 << 20
_LENGTH = struct.Struct("<Q")

# The dtypes a bundle carries (torch's names without "torch.").
DTYPES = (
    "bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32",
    "float64", "float8_e4m3fn", "float8_e5m2",
)


class BundleError(ValueError):
    """A bundle that cannot be read or a value that cannot be put in one."""


def _torch() -> Any:
    import torch

    return torch


def dtype_name(tensor: Any) -> str:
    name = str(tensor.dtype).replace("torch.", "")
    if name not in DTYPES:
        raise BundleError(f"tensor dtype {name} cannot be compared (supported: {', '.join(DTYPES)})")
    return name


def plain_tensor(tensor: Any) -> Any:
    """The tensor as a plain ``torch.Tensor`` over the same data, read without a subclass's
    ``__torch_function__`` taking part (what is stored is its data, not what it says)."""
    torch = _torch()
    with _plain_dispatch(torch):
        plain = torch.Tensor.detach(tensor)
        if type(plain) is not torch.Tensor:
            plain = torch.Tensor.as_subclass(plain, torch.Tensor)
    return plain


def tensor_bytes(tensor: Any) -> memoryview:
    """The tensor's elements as raw little-endian bytes, row-major (a host copy when needed)."""
    torch = _torch()
    flat = plain_tensor(tensor).to("cpu").contiguous().reshape(-1)
    if flat.numel() == 0:
        return memoryview(b"")
    return memoryview(flat.view(torch.uint8).numpy()).cast("B")


def _plain_dispatch(torch: Any) -> Any:
    guard = getattr(torch._C, "DisableTorchFunctionSubclass", None)
    if guard is None:  # pragma: no cover - older torch
        import contextlib

        return contextlib.nullcontext()
    return guard()


def sha256_tensor(tensor: Any) -> str:
    """SHA-256 of the tensor's raw bytes (``tensor_bytes``)."""
    return hashlib.sha256(tensor_bytes(tensor)).hexdigest()


class Captured:
    """A tensor's data as it was when ``capture_value`` copied it, in memory only its holder
    references, with the type the tensor had (what ``BundleWriter.describe_value`` records)."""

    __slots__ = ("data", "type_name", "plain")

    def __init__(self, data: Any, type_name: str, plain: bool) -> None:
        self.data = data  # a plain torch.Tensor of its own
        self.type_name = type_name
        self.plain = plain


def capture_value(value: Any) -> Any:
    """``value`` with every tensor replaced by a ``Captured`` copy of its data (on the tensor's
    device, stream-ordered), lists and tuples rebuilt; other objects are kept as they are (a
    bundle records only their type)."""
    torch = _torch()
    if isinstance(value, torch.Tensor):
        with _plain_dispatch(torch):
            data = torch.Tensor.clone(plain_tensor(value))
        return Captured(data, type(value).__name__, type(value) is torch.Tensor)
    if isinstance(value, list):
        return [capture_value(v) for v in value]
    if isinstance(value, tuple):
        return tuple(capture_value(v) for v in value)
    return value


_HASH_THREADS_MAX = 8


def usable_cpus() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _hash_threads() -> int:
    """Threads for hashing several buffers: the CPUs this process may use, at most 8."""
    return max(1, min(usable_cpus(), _HASH_THREADS_MAX))


def _sha256_hex(data: Any) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_many(buffers: Sequence[Any]) -> List[str]:
    """The SHA-256 (hex) of each buffer, in order, computed on several threads when there are
    several buffers (no thread outlives the call)."""
    threads = min(len(buffers), _hash_threads())
    if threads <= 1:
        return [_sha256_hex(b) for b in buffers]
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="kcoral-eval-hash") as pool:
        return list(pool.map(_sha256_hex, buffers))


class BundleWriter:
    """Collects tensors while values are described; ``finish`` lays out the bundle."""

    def __init__(self, hashes: bool = True) -> None:
        self._hashes = hashes  # per-tensor SHA-256 in the header (off: "sha256" is None)
        self._chunks: List[memoryview] = []
        self._entries: List[Dict[str, Any]] = []
        self._offset = 0
        self._unhashed: List[int] = []  # entries whose SHA-256 is still to be computed

    def add_tensor(self, tensor: Any, sha256: Optional[str] = None) -> int:
        """Adds ``tensor``'s bytes; ``sha256``: its digest when already known (else computed by
        ``hash_tensors``)."""
        tensor = plain_tensor(tensor)
        data = tensor_bytes(tensor)
        entry = {
            "dtype": dtype_name(tensor),
            "shape": [int(s) for s in tensor.shape],
            "offset": self._offset,
            "nbytes": len(data),
            "sha256": sha256 if self._hashes else None,
        }
        self._entries.append(entry)
        self._chunks.append(data)
        self._offset += len(data)
        if self._hashes and sha256 is None:
            self._unhashed.append(len(self._entries) - 1)
        return len(self._entries) - 1

    def adopt(self, bundle: "Bundle", described: Dict[str, Any]) -> Dict[str, Any]:
        """The description of a value of ``bundle`` (described there as ``described``) with its
        tensors added here: their bytes read from ``bundle`` when ``finish`` lays this one out,
        their digests taken from its header (a bundle this process trusts, eval_inputs)."""
        kind = described.get("t")
        if kind == "tensor":
            index = described["i"]
            digest = bundle.entries[index].get("sha256")
            return dict(described, i=self.add_tensor(bundle.tensor(index, writable=False),
                                                     digest))
        if kind in ("list", "tuple"):
            return dict(described, items=[self.adopt(bundle, item) for item in described["items"]])
        return dict(described)

    def hash_tensors(self) -> None:
        """Computes the SHA-256 of every tensor added since the last call, on several threads
        (``finish`` calls it; call it earlier to have the hashing done at a chosen moment)."""
        pending, self._unhashed = self._unhashed, []
        for index, digest in zip(pending, sha256_many([self._chunks[i] for i in pending])):
            self._entries[index]["sha256"] = digest

    def entry(self, index: int) -> Dict[str, Any]:
        return self._entries[index]

    def describe_value(self, value: Any) -> Dict[str, Any]:
        """The header form of ``value``; its tensors are added to the bundle."""
        torch = _torch()
        if isinstance(value, Captured):
            return self._describe_tensor(value.data, value.type_name, value.plain)
        if isinstance(value, torch.Tensor):
            return self._describe_tensor(plain_tensor(value), type(value).__name__,
                                         type(value) is torch.Tensor)
        if value is None or isinstance(value, (bool, int, str)):
            return {"t": "scalar", "v": value}
        if isinstance(value, float):
            if math.isfinite(value):
                return {"t": "scalar", "v": value}
            return {"t": "scalar", "float": repr(value)}
        if isinstance(value, (list, tuple)):
            return {
                "t": "tuple" if isinstance(value, tuple) else "list",
                "items": [self.describe_value(item) for item in value],
            }
        return {"t": "other", "type": type(value).__name__}

    def _describe_tensor(self, plain: Any, type_name: str, is_plain: bool) -> Dict[str, Any]:
        index = self.add_tensor(plain)
        entry = self._entries[index]
        return {
            "t": "tensor", "i": index, "dtype": entry["dtype"], "shape": entry["shape"],
            "device": plain.device.type, "plain": is_plain, "type": type_name,
        }

    def _prefix(self, header: Dict[str, Any]) -> bytes:
        """The magic, the header's length and the header (every tensor's entry in it)."""
        self.hash_tensors()
        header = dict(header, tensors=self._entries)
        text = json.dumps(header, separators=(",", ":"), allow_nan=False).encode()
        return MAGIC + _LENGTH.pack(len(text)) + text

    def finish(self, header: Dict[str, Any], allocate: Callable[[int], Any] = new_bytearray
               ) -> Any:
        """The bundle, laid out in ``allocate(size)``'s writable buffer (by default a
        ``bytearray``, on huge pages when large: huge_pages.py)."""
        prefix = self._prefix(header)
        out = allocate(len(prefix) + self._offset)
        out[: len(prefix)] = prefix
        position = len(prefix)
        for chunk in self._chunks:
            out[position: position + len(chunk)] = chunk
            position += len(chunk)
        return out

    def _pieces(self, header: Dict[str, Any]) -> List[memoryview]:
        """The bundle ``finish`` lays out, as its pieces: the prefix, then every tensor's bytes."""
        return [memoryview(self._prefix(header)), *self._chunks]

    def segments(self, header: Dict[str, Any], count: int = 8,
                 min_bytes: Optional[int] = None) -> List[Chunks]:
        """The bundle as at most ``count`` values (``Bundle`` reads their list), cut between
        whole pieces: the first holds the prefix, and each piece goes to the equal share of the
        bundle its middle falls in. Fewer segments where a share would be under ``min_bytes``
        (default ``SEGMENT_MIN_BYTES``; a small bundle is one). Kept (docs/kept-returns.md), the
        server copies and hashes them in parallel where one value is one core's work."""
        pieces = self._pieces(header)
        total = sum(len(piece) for piece in pieces)
        least = SEGMENT_MIN_BYTES if min_bytes is None else min_bytes
        count = max(1, min(count, total // max(1, least)))
        share = max(1, -(-total // count))
        groups: List[List[memoryview]] = [[] for _ in range(count)]
        position = 0
        for piece in pieces:  # each to the share its middle falls in
            groups[min(count - 1, (position + len(piece) // 2) // share)].append(piece)
            position += len(piece)
        groups = [group for group in groups if group]
        return [Chunks(group) for group in groups]

    def write_to(self, fd: int, header: Dict[str, Any]) -> int:
        """Writes the bundle ``finish`` lays out to the file ``fd`` (from its offset) with
        ``writev``: the kernel copies the tensors' bytes, no buffer of the bundle's size is made
        and no page of the file is mapped here. Returns the bundle's size."""
        parts = self._pieces(header)
        write_pieces(fd, parts)
        return sum(len(part) for part in parts)


class Bundle:
    """A decoded bundle: the header and lazily made CPU tensors over its bytes. ``data`` is the
    bundle's bytes, or the list of its segments (``BundleWriter.segments``)."""

    def __init__(self, data: Any) -> None:
        segments = [memoryview(part).cast("B") for part in data] \
            if isinstance(data, (list, tuple)) else [memoryview(data).cast("B")]
        if not segments:
            raise BundleError("not a kcoral eval bundle (no segments)")
        view = segments[0]
        if len(view) < len(MAGIC) + _LENGTH.size or bytes(view[: len(MAGIC)]) != MAGIC:
            raise BundleError("not a kcoral eval bundle (bad magic)")
        (length,) = _LENGTH.unpack_from(view, len(MAGIC))
        start = len(MAGIC) + _LENGTH.size
        if start + length > len(view):
            raise BundleError("bundle header runs past the end of its first segment")
        try:
            self.header: Dict[str, Any] = json.loads(bytes(view[start: start + length]))
        except ValueError as exc:
            raise BundleError(f"bundle header is not JSON: {exc}") from None
        self.prefix: memoryview = view[: start + length]  # magic, length, header
        # The data after the header, as segments and the data offset each starts at.
        self._segments = [view[start + length:], *segments[1:]]
        self._starts: List[int] = []
        available = 0
        for segment in self._segments:
            self._starts.append(available)
            available += len(segment)
        entries = self.header.get("tensors")
        if not isinstance(entries, list):
            raise BundleError("bundle header has no tensor list")
        for entry in entries:
            _check_entry(entry, available)
            self._locate(entry)
        self.entries: List[Dict[str, Any]] = entries

    def _locate(self, entry: Dict[str, Any]) -> Tuple[int, int]:
        """The segment that holds ``entry``'s bytes, and their offset in it."""
        k = bisect.bisect_right(self._starts, entry["offset"]) - 1
        if entry["nbytes"] and k + 1 < len(self._starts) \
                and entry["offset"] + entry["nbytes"] > self._starts[k + 1]:
            raise BundleError("bundle tensor entry spans two segments")
        return k, entry["offset"] - self._starts[k]

    def raw(self, index: int) -> memoryview:
        entry = self.entries[index]
        k, offset = self._locate(entry)
        return self._segments[k][offset: offset + entry["nbytes"]]

    def sha256(self) -> str:
        """The SHA-256 of the whole bundle (its segments joined)."""
        digest = hashlib.sha256(self.prefix)
        for segment in self._segments:
            digest.update(segment)
        return digest.hexdigest()

    def tensor(self, index: int, device: str = "cpu", writable: bool = True) -> Any:
        """Tensor ``index`` as a new tensor on ``device`` (its own memory, writable). For another
        device than the CPU the bytes are copied there straight from the bundle. With
        ``writable`` false a CPU tensor is a view of the bundle's bytes instead of a copy: only
        for a caller that never writes to it (the bytes may be shared)."""
        torch = _torch()
        entry = self.entries[index]
        dtype = getattr(torch, entry["dtype"])
        count = 1
        for size in entry["shape"]:
            count *= size
        if count == 0:
            return torch.empty(entry["shape"], dtype=dtype, device=device)
        if device == "cpu" and writable:
            raw = torch.frombuffer(bytearray(self.raw(index)), dtype=torch.uint8)
            return raw.view(dtype).reshape(entry["shape"])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # read-only buffer: read by the copy, or the caller
            raw = torch.frombuffer(self.raw(index), dtype=torch.uint8)
        if device != "cpu":
            raw = raw.to(device)
        return raw.view(dtype).reshape(entry["shape"])

    def value(self, described: Dict[str, Any], device: str = "cpu", writable: bool = True) -> Any:
        """The value a header description stands for (tensors on ``device``; ``writable`` as
        for ``tensor``)."""
        kind = described.get("t")
        if kind == "tensor":
            return self.tensor(described["i"], device, writable)
        if kind == "scalar":
            if "float" in described:
                return float(described["float"])
            return described.get("v")
        if kind in ("list", "tuple"):
            items = [self.value(item, device, writable) for item in described["items"]]
            return tuple(items) if kind == "tuple" else items
        raise BundleError(f"a value of type {described.get('type')} carries no data")


def _check_entry(entry: Any, available: int) -> None:
    if not isinstance(entry, dict) or entry.get("dtype") not in DTYPES:
        raise BundleError("bundle tensor entry without a known dtype")
    shape = entry.get("shape")
    if not isinstance(shape, list) or not all(isinstance(s, int) and s >= 0 for s in shape):
        raise BundleError("bundle tensor entry with a bad shape")
    offset, nbytes = entry.get("offset"), entry.get("nbytes")
    if not isinstance(offset, int) or not isinstance(nbytes, int) or offset < 0 or nbytes < 0 \
            or offset + nbytes > available:
        raise BundleError("bundle tensor entry outside the data")
    itemsize = _ITEMSIZE[entry["dtype"]]
    count = 1
    for size in shape:
        count *= size
    if count * itemsize != nbytes:
        raise BundleError(f"bundle tensor of shape {shape} and dtype {entry['dtype']} is not "
                          f"{nbytes} bytes")


_ITEMSIZE = {
    "bool": 1, "uint8": 1, "int8": 1, "float8_e4m3fn": 1, "float8_e5m2": 1, "int16": 2,
    "float16": 2, "bfloat16": 2, "int32": 4, "float32": 4, "int64": 8, "float64": 8,
}


def sha256_bytes(data: Any) -> str:
    return hashlib.sha256(memoryview(data)).hexdigest()


def verify_tensors(bundle: Bundle) -> bool:
    """Whether every tensor's bytes have the SHA-256 its header entry states (an entry without
    one fails), checked on several threads."""
    entries = bundle.entries
    if any(not isinstance(entry.get("sha256"), str) for entry in entries):
        return False
    digests = sha256_many([bundle.raw(i) for i in range(len(entries))])
    return all(digest == entry["sha256"] for digest, entry in zip(digests, entries))


def tensors_in(described: Dict[str, Any]) -> List[int]:
    """The bundle indices of every tensor inside a value description, in order."""
    kind = described.get("t")
    if kind == "tensor":
        return [described["i"]]
    if kind in ("list", "tuple"):
        return [i for item in described["items"] for i in tensors_in(item)]
    return []


__all__ = [
    "MAGIC", "DTYPES", "BundleError", "BundleWriter", "Bundle", "Captured", "capture_value",
    "dtype_name", "plain_tensor",
    "tensor_bytes",
    "sha256_tensor", "sha256_bytes", "sha256_many", "usable_cpus", "verify_tensors", "tensors_in",
]
