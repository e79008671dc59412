"""The child's side of the per-GPU lease (spec protocol §2.5, server §3).

The server owns the lease. ``acquire`` sends ``{"t":"lease","a":"acquire"}`` and blocks until
``{"t":"lease","a":"granted"}``; ``release`` drains the GPU first, then sends
``{"t":"lease","a":"release"}`` (no answer). CPU workers use :class:`NoLease`: no messages.
The end of a request re-acquires for cleanup and never sends ``release``: the ``outcome`` frame
itself ends the request's hold (see :meth:`Lease.request_done`).
"""

from __future__ import annotations

import os
from typing import Any

from .errors import ExecutionError
from .ipc import FrameSocket, frame
from .log import log

ACQUIRE = frame(b'{"t":"lease","a":"acquire"}')
RELEASE = frame(b'{"t":"lease","a":"release"}')


class NoLease:
    held = False

    def acquire(self) -> None:
        pass

    def release(self) -> None:
        pass

    def request_done(self) -> None:
        pass


class Lease:
    def __init__(self, channel: FrameSocket, backend: Any) -> None:
        self.channel = channel
        self.backend = backend
        self.held = False

    def acquire(self) -> None:
        if self.held:
            return
        self.channel.sock.sendall(ACQUIRE)
        while True:
            msg = self.channel.recv()
            if msg is None:
                os._exit(1)  # the zygote is gone: nobody can grant or use anything any more
            if msg.get("t") == "lease" and msg.get("a") == "granted":
                break
            log(f"ignoring a {msg.get('t')!r} frame while waiting for the lease")
        self.held = True

    def release(self) -> None:
        if not self.held:
            return
        try:
            self.backend.prepare_release()  # drain, so no kernel of ours runs on a peer's lease
        except Exception as exc:
            # The lease stays held: the final drain will find the same error and retire us.
            raise ExecutionError("runtime", f"{type(exc).__name__}: {exc}") from exc
        self.channel.sock.sendall(RELEASE)
        self.held = False

    def request_done(self) -> None:
        """The ``outcome`` frame hands the lease back: the server releases it on ``outcome``
        (worker kept) or after ``exited`` (worker retiring). The next request starts without it."""
        self.held = False
