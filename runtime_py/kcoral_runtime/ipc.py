"""Frames: a 4-byte big-endian length, then that many bytes of UTF-8 JSON (one object),
optionally followed by a NUL byte and a binary tail (JSON text never holds a raw NUL).

Used on the zygote's stdin/stdout pipes (server <-> zygote) and on each child's socketpair
(zygote <-> child). The ``run`` frame's tail is the program JSON text as received, so the
program travels as its own bytes, not escaped into the frame's JSON a second time::

    [length][{"t":"run","c":N,"req":{...}}][\0][program bytes]

See docs/architecture.md §3.1.
"""

from __future__ import annotations

import json
import os
import socket
import struct
from collections import deque
from typing import Any, Deque, List, Optional, Tuple

HEADER = struct.Struct(">I")
MAX_FRAME_BYTES = 0xFFFFFFFF


def dumps(obj: Any) -> bytes:
    """Compact UTF-8 JSON; falls back to ASCII escapes if a string holds lone surrogates."""
    try:
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode(
            "utf-8"
        )
    except UnicodeEncodeError:
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode(
            "ascii"
        )


def frame(payload: bytes) -> bytes:
    if len(payload) > MAX_FRAME_BYTES:
        raise ValueError(f"frame of {len(payload)} bytes exceeds the 4-byte length prefix")
    return HEADER.pack(len(payload)) + payload


def frame_with_suffix(payload: bytes, suffix: bytes) -> bytes:
    """``frame(payload[:-1] + suffix)`` with a single copy of the payload: the payload's closing
    brace is replaced by ``suffix`` (members added last win over any the payload already has)."""
    size = len(payload) - 1 + len(suffix)
    if size > MAX_FRAME_BYTES:
        raise ValueError(f"frame of {size} bytes exceeds the 4-byte length prefix")
    return b"".join((HEADER.pack(size), memoryview(payload)[:-1], suffix))


def encode(obj: Any, tail: Optional[bytes] = None) -> bytes:
    """One complete frame for ``obj``, with ``tail`` after a NUL byte when given."""
    return frame(dumps(obj) if tail is None else b"".join((dumps(obj), b"\0", tail)))


def split_tail(payload: bytes) -> Tuple[bytes, Optional[bytes]]:
    """A frame's JSON text and its binary tail (None: the frame has none)."""
    end = payload.find(b"\0")
    if end < 0:
        return payload, None
    return payload[:end], payload[end + 1 :]


class FrameDecoder:
    """Incremental decoder: feed bytes, get complete payloads (raw JSON bytes)."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> List[bytes]:
        buf = self._buf
        buf += data
        out: List[bytes] = []
        pos = 0
        end = len(buf)
        with memoryview(buf) as view:
            while end - pos >= 4:
                (size,) = HEADER.unpack_from(view, pos)
                if end - pos - 4 < size:
                    break
                out.append(bytes(view[pos + 4 : pos + 4 + size]))
                pos += 4 + size
        if pos:
            del buf[:pos]
        return out

    @property
    def pending(self) -> int:
        return len(self._buf)


class OutQueue:
    """Bytes waiting for a non-blocking fd, written without quadratic copying."""

    def __init__(self) -> None:
        self._chunks: Deque[bytes] = deque()
        self._offset = 0

    def __bool__(self) -> bool:
        return bool(self._chunks)

    def push(self, data: bytes) -> None:
        if data:
            self._chunks.append(data)

    def write_to(self, fd: int) -> None:
        """Write as much as the fd takes now; raises OSError other than EAGAIN."""
        while self._chunks:
            head = self._chunks[0]
            try:
                n = os.write(fd, memoryview(head)[self._offset :])
            except BlockingIOError:
                return
            self._offset += n
            if self._offset >= len(head):
                self._chunks.popleft()
                self._offset = 0


class FrameSocket:
    """Blocking frame I/O over a connected stream socket (the child's end)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._decoder = FrameDecoder()
        self._ready: Deque[bytes] = deque()

    def send(self, obj: Any) -> None:
        self.sock.sendall(encode(obj))

    def send_raw(self, payload: bytes) -> None:
        self.sock.sendall(frame(payload))

    def recv(self) -> Optional[dict]:
        """The next frame as a dict (a tail is dropped); ``None`` at end of stream."""
        return self.recv_with_tail()[0]

    def recv_with_tail(self) -> Tuple[Optional[dict], Optional[bytes]]:
        """The next frame as a dict and its tail (or None); ``(None, None)`` at end of stream."""
        while not self._ready:
            data = self.sock.recv(1 << 16)
            if not data:
                return None, None
            self._ready.extend(self._decoder.feed(data))
        text, tail = split_tail(self._ready.popleft())
        msg = json.loads(text)
        if not isinstance(msg, dict):
            raise ValueError("frame is not a JSON object")
        return msg, tail
