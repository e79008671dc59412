"""The per-request process, forked by the zygote (docs/architecture.md §3).

It applies its ``env``/``unset`` first, does what needs no lease at once (a GPU child
initialises the driver: ``backend.prepare()``), waits for ``init`` (creates the device context,
under the server's lease; answers ``ready`` or ``init_failed``), then serves ``run`` frames until
it retires. An ``init`` with ``"context": false`` (sent without the lease) only learns the
devices: the context is created by the first instruction that takes the lease, and a request
that never does (a ``kcoral run`` script, whose processes take the lease through the gate)
leaves none to create or tear down (``ready`` says ``"context": "deferred"``). Until ``init`` it is not dumpable, so the program of the seat's previous child, which
may still be exiting beside it, cannot trace it or write into its memory. Every exit is an
``os._exit``: no interpreter teardown, no atexit handlers inherited from the zygote.

```
  fork ──▶ prepare (no lease) ──▶ wait for init ──▶ init: context (lease) ──▶ ready ──▶ run …
```
"""

from __future__ import annotations

import gc
import mmap
import os
import signal
import socket
import sys
import traceback
from typing import Any, Dict, List, Optional, Tuple

from . import devices, gate, procs, progress
from .devices import CpuBackend, make_backend
from .engine import Engine
from .frames import Clean, InitFailed, Outcome, Ready
from .gpu_receipt import RequestReceipt
from .ipc import FrameSocket
from .lease import Lease, NoLease
from .log import log, use_private_fd


def _flush_all() -> None:
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            if stream is not None:
                stream.flush()
        except Exception:
            pass


def _exit(code: int) -> None:
    _flush_all()
    os._exit(code)


def install_cpu_only_guard(mode: str) -> None:
    """After ``init``: GPU children run ``cpu_only`` functions under the CUPTI guard.

    Only the factory is installed here; libcupti is loaded and subscribed at the first
    ``cpu_only`` run (never in the zygote, never before the CUDA context exists) and
    unsubscribed when that run ends. Simulated and CPU children have no GPU to guard and run
    ``cpu_only`` functions directly.
    """
    if mode == "gpu":
        from . import cuda_guard

        devices.set_cpu_only_guard(cuda_guard.cpu_only_guard)
    else:
        devices.set_cpu_only_guard(None)


def _reseed_numpy() -> None:
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        try:
            numpy.random.seed()  # a fresh process would have drawn fresh entropy
        except Exception:
            pass


class Child:
    def __init__(
        self,
        sock: socket.socket,
        mode: str,
        versions: Dict[str, str],
        sim_devices: int,
        max_requests: int,
        progress_page: mmap.mmap,
    ) -> None:
        self.channel = FrameSocket(sock)
        self.progress_page = progress_page
        self.mode = mode
        self.versions = versions
        self.sim_devices = sim_devices
        self.max_requests = max_requests
        self.served = 0
        self.engine: Optional[Engine] = None
        self.backend: Optional[CpuBackend] = None
        self.prepare_error: Optional[Tuple[BaseException, str]] = None
        self.receipt: Optional[RequestReceipt] = None

    # ------------------------------------------------------------------ frames

    def _notify_instr(self, index: int) -> None:
        progress.mark(self.progress_page, index)  # the zygote reads it if we crash

    def prepare(self) -> None:
        """Makes the backend and does its lease-free set-up; a failure is answered at ``init``."""
        try:
            backend = make_backend(self.mode, self.versions, self.sim_devices)
            # A worker that serves more than one request reuses torch's cached pinned blocks.
            backend.reused = self.max_requests != 1
            backend.prepare()
        except BaseException as exc:
            self.prepare_error = (exc, traceback.format_exc())
            return
        self.backend = backend
        if backend.uses_lease and self.receipt is None:
            # NVML opened and the GPUs' identity read once, lease-free, before any request.
            try:
                self.receipt = RequestReceipt.for_worker()
            except Exception as exc:  # noqa: BLE001 - requests go on without receipts
                log(f"no GPU-state receipts: {type(exc).__name__}: {exc}")

    def serve(self) -> None:
        self.prepare()
        while True:
            msg, tail = self.channel.recv_with_tail()
            if msg is None:
                _exit(0)  # the zygote closed our channel
                return
            kind = msg.get("t")
            if kind == "init":
                if self.engine is None:
                    self._init(msg.get("context") is not False)
                else:
                    log("ignoring a second init")
            elif kind == "run":
                if self.engine is None:
                    self._init()  # init is implied; the server normally sends it first
                req = msg.get("req") or {}
                req["program"] = tail  # the frame's tail: the program JSON text as received
                self._run(req)
            else:
                log(f"ignoring a {kind!r} frame")

    def _init(self, context: bool = True) -> None:
        # The seat's last child is gone (the server waits for its exit report, which waits for
        # its leftover processes): from here on we may be traced as a program expects.
        procs.set_dumpable(True)
        if self.prepare_error is not None:
            # Should a driver refuse a process that is not dumpable, the lease-free set-up runs
            # once more, now dumpable (under the lease: slower, still correct).
            first, self.prepare_error = self.prepare_error[0], None
            self.prepare()
            if self.prepare_error is None:
                log(f"prepare succeeded only once dumpable: {type(first).__name__}: {first}")
        failure = self.prepare_error
        if failure is None:
            try:
                backend = self.backend
                assert backend is not None
                target, device_uuids = backend.init(context)
                install_cpu_only_guard(backend.mode)
                lease: Any = (Lease(self.channel, backend, self.receipt) if backend.uses_lease
                              else NoLease())
                # After cuInit (the driver read its injection variable already; a deferred
                # context needs a successful cuInit too): the processes of our requests take
                # the lease at their first CUDA call, this one never.
                gpu_gate = gate.start(lease) if backend.uses_lease else None
                engine = Engine(backend, lease, self._notify_instr, gpu_gate)
                engine.snapshot_state()
            except BaseException as exc:
                failure = (exc, traceback.format_exc())
        if failure is not None:
            exc, trace = failure
            self.channel.send(
                InitFailed(
                    t="init_failed",
                    message=f"{type(exc).__name__}: {exc}",
                    traceback=trace[-8192:],
                )
            )
            _exit(1)
            return
        self.engine = engine
        gc.collect()
        gc.freeze()  # what init created lives as long as we do: keep it out of later collections
        ready = Ready(t="ready", target=target, versions=self.versions, device_uuids=device_uuids)
        backend = self.backend
        if backend is not None and backend.uses_lease:
            ready["context"] = "deferred" if backend.context_pending else "created"
        self.channel.send(ready)

    def _run(self, req: Dict[str, Any]) -> None:
        assert self.engine is not None
        progress.mark(self.progress_page, progress.NONE)  # no instruction of this request yet
        self.served += 1
        last = self.max_requests > 0 and self.served >= self.max_requests
        engine = self.engine
        outcome, retire, detail = engine.execute(req, last)
        frame = Outcome(t="outcome", outcome=outcome, retire=retire)
        if detail is not None:
            frame["retire_detail"] = detail
        pending = engine.reset_pending
        if pending:
            frame["cleanup"] = True  # the server keeps our lease and seat until ``clean``
        progress.mark(self.progress_page, progress.NONE)  # the request's instructions are over
        self.channel.send(frame)
        if retire is not None:
            _exit(0)
        if pending:
            # Reuse hygiene after the answer, still under the lease, before the next request.
            retire, detail = engine.finish_request()
            clean = Clean(t="clean", retire=retire)
            if detail is not None:
                clean["retire_detail"] = detail
            self.channel.send(clean)
            if retire is not None:
                _exit(0)
        engine.lease.request_done()
        engine.idle()  # the next request's sandbox snapshot, taken while nothing waits on us


def main(
    sock: socket.socket,
    zygote_pid: int,
    mode: str,
    versions: Dict[str, str],
    sim_devices: int,
    env: Dict[str, str],
    unset: List[str],
    max_requests: int,
    progress_page: mmap.mmap,
) -> None:
    """Entry point right after fork (the zygote already closed its own fds in us);
    ``progress_page``: shared with the zygote, which reports the instruction a crash hit."""
    procs.set_parent_death_signal(signal.SIGKILL)
    if os.getppid() != zygote_pid:
        os._exit(1)  # the zygote died before we could ask to follow it
    # Not dumpable yet, as the zygote: the last child of this seat may still be exiting, and
    # whatever of its program still runs must not trace us or write into our memory. ``init``
    # makes us dumpable: the server sends it once that child is gone.
    procs.set_child_subreaper()
    try:
        os.setpgid(0, 0)
    except OSError:
        pass  # already done by the zygote
    for name in unset:
        os.environ.pop(name, None)
        os.unsetenv(name)
    for name, value in env.items():
        os.environ[name] = value
    use_private_fd()
    _reseed_numpy()
    Child(sock, mode, versions, sim_devices, max_requests, progress_page).serve()
