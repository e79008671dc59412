"""The GPU gate: a request's processes take its lease at their first CUDA call, not at start.

A GPU (or simulated-GPU) child whose server built the shim (``gate_shim.py``; its path in
``KCORAL_GATE_LIB``) runs a :class:`Gate`: an abstract Unix socket served by one thread, and
the variables every process it starts inherits (``CUDA_INJECTION64_PATH`` and ``LD_PRELOAD``
naming the shim, ``KCORAL_GATE`` naming the socket). A process of the request that reaches its
first CUDA call connects and waits; the gate checks that it is a descendant of this child
(``SO_PEERCRED``, then its parents in ``/proc``), asks for the lease through the child's
:class:`~kcoral_runtime.lease.Lease` (shared with the engine's own instructions: a request never
waits for itself) and answers ``G`` once it is held. The process's hold ends when its connection
reaches end of file (every process sharing it has exited or exec'd) and the process itself has
exited (its ``pidfd``): by then its descriptors are closed, its context is torn down. Between
requests the gate answers ``D`` (refused): no process of a finished request is left to ask.

```
  process ──connect, "A?"──▶ gate thread ──▶ Lease.process_started() ──acquire──▶ server
          ◀──────── "G" ─────────────────────────────────────── granted ◀──
  … GPU work …
  exit ──▶ EOF + pidfd ──▶ Lease.process_ended() ──release (when nothing else holds it)──▶ server
```
"""

from __future__ import annotations

import os
import secrets
import selectors
import socket
import struct
import threading
from typing import Dict, Optional

from . import procs
from .gate_shim import LIBRARY_NAME
from .log import log

LIBRARY_ENV = "KCORAL_GATE_LIB"
"""Names the built shim (set by the server in the zygote's environment)."""

SOCKET_ENV = "KCORAL_GATE"
"""Names the gate's socket in the processes a request starts (``@`` + abstract name)."""

INJECTION_ENV = "CUDA_INJECTION64_PATH"

_GRANTED = b"G"
_REFUSED = b"D"
_UCRED = struct.Struct("iII")  # pid, uid, gid


def library_path() -> Optional[str]:
    """The shim this worker was given, or ``None`` (no gate: the whole-run lease)."""
    path = os.environ.get(LIBRARY_ENV)
    if not path:
        return None
    if os.path.basename(path) != LIBRARY_NAME or not os.path.isfile(path):
        log(f"{LIBRARY_ENV}={path!r} names no GPU lease gate library; running without the gate")
        return None
    return path


def is_descendant(pid: int, ancestor: int) -> bool:
    """Whether ``pid`` is ``ancestor``'s child, grandchild, ... (read from ``/proc``)."""
    seen = 0
    while pid > 1 and seen < 4096:
        fields = procs.stat_fields(pid)
        if fields is None:
            return False
        pid = fields[1]
        if pid == ancestor:
            return True
        seen += 1
    return False


class _Peer:
    """One connection: the process that made it, and where its hold stands."""

    def __init__(self, sock: socket.socket, pid: int, pidfd: int) -> None:
        self.sock = sock
        self.pid = pid
        self.pidfd = pidfd
        self.holding = False  # answered "G" and counted in the lease
        self.eof = False

    def close(self) -> None:
        try:
            self.sock.close()
        finally:
            if self.pidfd >= 0:
                os.close(self.pidfd)
                self.pidfd = -1


class Gate:
    """The gate of one child. ``lease`` is the child's :class:`~kcoral_runtime.lease.Lease`."""

    def __init__(self, lease, library: str) -> None:
        self.lease = lease
        self.library = library
        self.name = "@kcoral-gate-" + secrets.token_hex(16)
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind("\0" + self.name[1:])
        self._listener.listen(64)
        self._listener.setblocking(False)
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, "listen")
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._peers: Dict[int, _Peer] = {}  # by socket fd
        self._lock = threading.Lock()
        self._open = False  # a request is running: processes may be admitted
        self._closing = False
        self._closed = threading.Event()
        self.admitted = 0  # processes admitted in the current request
        self._thread = threading.Thread(target=self._serve, name="kcoral-gpu-gate", daemon=True)
        self._thread.start()

    def environment(self) -> Dict[str, str]:
        """What the processes of a request inherit (put in ``os.environ`` once, after ``init``)."""
        preload = os.environ.get("LD_PRELOAD", "")
        env = {
            INJECTION_ENV: self.library,
            SOCKET_ENV: self.name,
            "LD_PRELOAD": f"{self.library}:{preload}" if preload else self.library,
        }
        # An ASan binary insists on coming first in the library list; the shim needs no
        # interception, so the order check can go (a user's own ASAN_OPTIONS wins).
        if "ASAN_OPTIONS" not in os.environ:
            env["ASAN_OPTIONS"] = "verify_asan_link_order=0"
        return env

    # ------------------------------------------------------------------ requests

    def begin_request(self) -> None:
        """Admit the request's processes from now on."""
        with self._lock:
            self._open = True
            self.admitted = 0

    def end_request(self) -> None:
        """The request is over (its processes were killed): refuse from now on and drop every
        connection; the lease's holds end with the request (``Lease.request_done``)."""
        with self._lock:
            self._open = False
            if not self._peers:
                return
            self._closed.clear()
            self._closing = True
        os.write(self._wake_w, b"x")
        self._closed.wait()

    # ------------------------------------------------------------------ thread

    def _serve(self) -> None:
        while True:
            for key, _ in self._selector.select():
                data = key.data
                try:
                    if data == "listen":
                        self._accept()
                    elif data == "wake":
                        self._drain_wake()
                    elif isinstance(data, tuple):
                        self._exited(data[1])
                    else:
                        self._readable(data)
                except Exception as exc:  # the gate must outlive any one peer's trouble
                    log(f"GPU gate: {type(exc).__name__}: {exc}")
            with self._lock:
                closing = self._closing
            if closing:
                for peer in list(self._peers.values()):
                    self._drop(peer, count=False)
                with self._lock:
                    self._closing = False
                self._closed.set()

    def _drain_wake(self) -> None:
        try:
            os.read(self._wake_r, 64)
        except BlockingIOError:
            pass

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except BlockingIOError:
                return
            sock.setblocking(True)
            pid = _UCRED.unpack(
                sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
            )[0]
            pidfd = -1
            try:
                pidfd = os.pidfd_open(pid)
            except (OSError, AttributeError):
                pass
            with self._lock:
                admit = self._open
            # Pinned by its pidfd first, so the ancestry we read is that of the process itself.
            if not admit or pidfd < 0 or not is_descendant(pid, os.getpid()):
                if admit:
                    log(f"GPU gate: refused process {pid}, which is not one of this request's")
                _send(sock, _REFUSED)
                sock.close()
                if pidfd >= 0:
                    os.close(pidfd)
                continue
            peer = _Peer(sock, pid, pidfd)
            self._peers[sock.fileno()] = peer
            self._selector.register(sock, selectors.EVENT_READ, peer)

    def _readable(self, peer: _Peer) -> None:
        try:
            data = peer.sock.recv(16)
        except OSError:
            data = b""
        if data and not peer.holding:
            with self._lock:
                admit = self._open
            if not admit:
                _send(peer.sock, _REFUSED)
                self._drop(peer, count=False)
                return
            self.lease.process_started()  # blocks until the request holds the lease
            peer.holding = True
            with self._lock:
                self.admitted += 1
            if not _send(peer.sock, _GRANTED):
                data = b""  # gone while it waited
        if data:
            return
        peer.eof = True
        self._selector.unregister(peer.sock)
        if not peer.holding:
            self._drop(peer, count=False)
        elif _has_exited(peer.pidfd):
            self._drop(peer, count=True)
        else:
            self._selector.register(peer.pidfd, selectors.EVENT_READ, ("exit", peer))

    def _exited(self, peer: _Peer) -> None:
        self._selector.unregister(peer.pidfd)
        self._drop(peer, count=True)

    def _drop(self, peer: _Peer, count: bool) -> None:
        for fileobj in (peer.sock, peer.pidfd):
            try:
                self._selector.unregister(fileobj)
            except (KeyError, ValueError):
                pass
        self._peers.pop(peer.sock.fileno(), None)
        peer.close()
        if count and peer.holding:
            self.lease.process_ended()


def _send(sock: socket.socket, data: bytes) -> bool:
    try:
        sock.sendall(data)
        return True
    except OSError:
        return False


def _has_exited(pidfd: int) -> bool:
    """Whether the process of ``pidfd`` has exited (a pidfd reads as ready once it has)."""
    if pidfd < 0:
        return True
    ready = selectors.DefaultSelector()
    try:
        ready.register(pidfd, selectors.EVENT_READ)
        return bool(ready.select(0))
    finally:
        ready.close()


def start(lease) -> Optional[Gate]:
    """The child's gate when the server gave it the shim (``KCORAL_GATE_LIB``), else ``None``;
    its variables go into ``os.environ`` (every process a request starts inherits them)."""
    library = library_path()
    if library is None:
        return None
    gate = Gate(lease, library)
    for name, value in gate.environment().items():
        os.environ[name] = value
    return gate
