"""Diagnostics to the slot's stderr (the server keeps it in a ring buffer), never to the
request's captured output: a child logs through a private duplicate of its original fd 2."""

from __future__ import annotations

import os

_fd = 2


def use_private_fd() -> None:
    """Log through a non-inheritable duplicate of the current fd 2 from now on."""
    global _fd
    _fd = os.dup(2)


def log(message: str) -> None:
    data = f"kcoral[{os.getpid()}]: {message}\n".encode("utf-8", "replace")
    try:
        while data:
            data = data[os.write(_fd, data) :]
    except OSError:
        pass
