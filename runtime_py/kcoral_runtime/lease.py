"""The child's side of the per-GPU lease (spec protocol §2.5, server §3).

The server owns the lease. ``acquire`` sends ``{"t":"lease","a":"acquire"}`` and blocks until
``{"t":"lease","a":"granted"}``; ``release`` drains the GPU first, then sends
``{"t":"lease","a":"release"}`` (no answer). CPU workers use :class:`NoLease`: no messages.
The end of a request re-acquires for cleanup and never sends ``release``: the ``outcome`` frame
itself ends the request's hold (see :meth:`Lease.request_done`).

Two kinds of holder share one request's lease: the engine (the instructions that run in this
process, ``acquire``/``release``) and the processes the request started, admitted by the GPU
gate (``gate.py``) at their first CUDA call (``process_started``/``process_ended``). The lease
is asked for when the first of them needs it and given back when none needs it any more; the
gate's thread and the engine's take turns reading the channel (only the one that sent
``acquire`` reads, until ``granted``), so neither waits behind the other's work.

The request's GPU-state receipt (``gpu_receipt.py``, when the child has one) takes its readings
here: as the lease is first held (granted, or with the program) and before each release;
``take_receipt`` adds the last one if the lease is still held as the outcome is built.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Dict, Optional

from .errors import ExecutionError
from .ipc import FrameSocket, frame
from .log import log

ACQUIRE = frame(b'{"t":"lease","a":"acquire"}')
RELEASE = frame(b'{"t":"lease","a":"release"}')

_FREE, _ASKING, _HELD = 0, 1, 2


class NoLease:
    held = False

    def acquire(self) -> None:
        pass

    def release(self) -> None:
        pass

    def request_done(self) -> None:
        pass

    def begin_request(self) -> None:
        pass

    def take_receipt(self) -> Optional[Dict[str, Any]]:
        return None


class Lease:
    def __init__(self, channel: FrameSocket, backend: Any, receipt: Any = None) -> None:
        self.channel = channel
        self.backend = backend
        self.receipt = receipt  # gpu_receipt.RequestReceipt, or None
        self._cond = threading.Condition()
        self._state = _FREE
        self._engine = False  # the engine's instructions want the lease
        self._processes = 0  # processes of the request admitted by the gate and still alive

    # ------------------------------------------------------------------ state

    @property
    def held(self) -> bool:
        """Whether this child holds the lease now."""
        return self._state == _HELD

    @held.setter
    def held(self, value: bool) -> None:
        """``True``: the server granted the lease together with the program (``lease_held``);
        ``False``: nothing is held, by anyone."""
        with self._cond:
            if value:
                self._state = _HELD
                self._engine = True
            else:
                self._state = _FREE
                self._engine = False
                self._processes = 0
            self._cond.notify_all()
        if value and self.receipt is not None:
            self.receipt.acquired()

    @property
    def processes(self) -> int:
        """Processes of the request that hold the lease through the gate."""
        return self._processes

    # ------------------------------------------------------------------ engine

    def acquire(self) -> None:
        """The engine needs the lease (blocks until it is held)."""
        with self._cond:
            self._engine = True
        self._take()

    def release(self) -> None:
        """The engine no longer needs the lease: drain what this process queued, then hand the
        lease back unless a process of the request still holds it through the gate."""
        with self._cond:
            if not self._engine or self._state != _HELD:
                self._engine = False
                return
        try:
            self.backend.prepare_release()  # drain, so no kernel of ours runs on a peer's lease
        except Exception as exc:
            # The lease stays held: the final drain will find the same error and retire us.
            raise ExecutionError("runtime", f"{type(exc).__name__}: {exc}") from exc
        with self._cond:
            self._engine = False
            self._give_back_if_unused()

    def request_done(self) -> None:
        """The ``outcome`` frame hands the lease back: the server releases it on ``outcome``
        (worker kept) or after ``exited`` (worker retiring). The next request starts without it."""
        self.held = False

    def begin_request(self) -> None:
        """A request starts: its receipt has no reading yet."""
        if self.receipt is not None:
            self.receipt.begin()

    def take_receipt(self) -> Optional[Dict[str, Any]]:
        """The request's GPU-state receipt as its outcome is built (a release reading first if
        the lease is still held); ``None`` without one or when the request never held the
        lease."""
        if self.receipt is None:
            return None
        if self._state == _HELD:
            self.receipt.releasing()
        return self.receipt.take()

    # ------------------------------------------------------------------ gate

    def process_started(self) -> None:
        """A process of the request reached its first CUDA call: blocks until the lease is
        held, which it then shares until :meth:`process_ended`."""
        with self._cond:
            self._processes += 1
        self._take()

    def process_ended(self) -> None:
        """A process admitted by :meth:`process_started` is gone."""
        with self._cond:
            if self._processes > 0:
                self._processes -= 1
            self._give_back_if_unused()

    # ------------------------------------------------------------------ both

    def _take(self) -> None:
        with self._cond:
            while True:
                if self._state == _HELD:
                    return
                if self._state == _FREE:
                    self._state = _ASKING
                    self.channel.sock.sendall(ACQUIRE)
                    break
                self._cond.wait()  # another thread asked: it reads the grant for both of us
        granted = False
        try:
            while True:
                msg = self.channel.recv()
                if msg is None:
                    os._exit(1)  # the zygote is gone: nobody can grant or use anything any more
                if msg.get("t") == "lease" and msg.get("a") == "granted":
                    granted = True
                    break
                log(f"ignoring a {msg.get('t')!r} frame while waiting for the lease")
        finally:
            with self._cond:
                self._state = _HELD if granted else _FREE
                self._cond.notify_all()
        if self.receipt is not None:
            self.receipt.acquired()

    def _give_back_if_unused(self) -> None:
        """With the condition held: release when neither the engine nor a process needs it."""
        if self._state == _HELD and not self._engine and self._processes == 0:
            if self.receipt is not None:
                self.receipt.releasing()  # still held: the GPU as this request leaves it
            self.channel.sock.sendall(RELEASE)
            self._state = _FREE
