"""Slot main: ``python -m kcoral_runtime.zygote --mode {gpu,sim,cpu} [--sim-devices N]``.

Imports the heavy modules once (never creating a CUDA context), then forks one child per
``fork`` frame and relays frames between the server (its stdin/stdout pipes, moved to private
fds at startup) and each child (one socketpair per child). It is a child subreaper: a child's
``exited`` is sent only once the child and every descendant it left behind are gone.
See docs/architecture.md §3.
"""

from __future__ import annotations

import os
import sys


def _take_channel() -> "tuple[int, int]":
    """Move the framed channel off fds 0/1: fd 0 -> /dev/null, fd 1 -> fd 2."""
    read_fd = os.dup(0)  # os.dup makes non-inheritable (close-on-exec) fds
    write_fd = os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    return read_fd, write_fd


if __name__ == "__main__":
    # Before any import can print to fd 1 and corrupt the channel.
    _CHANNEL = _take_channel()

import argparse  # noqa: E402
import fcntl  # noqa: E402
import gc  # noqa: E402
import importlib.machinery  # noqa: E402
import json  # noqa: E402
import mmap  # noqa: E402
import platform  # noqa: E402
import selectors  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
import warnings  # noqa: E402
from typing import Any, Dict, List, Optional, Set  # noqa: E402

from . import procs, progress, seccomp  # noqa: E402
from .frames import Exited, Forked, Hello  # noqa: E402
from .workspace import WorkspaceMounts, drop_capabilities  # noqa: E402
from .ipc import FrameDecoder, OutQueue, dumps, frame, frame_with_suffix, split_tail  # noqa: E402
from .log import log  # noqa: E402

POLL_SECONDS = 0.01
STOP_LIMIT_SECONDS = 30.0
_F_SETPIPE_SZ = 1031


class ChildRecord:
    def __init__(self, c: int, pid: int, sock: socket.socket, progress: mmap.mmap) -> None:
        self.c = c
        self.pid = pid
        self.sock = sock
        # Shared with the child: the index of the instruction it is running (``progress``).
        self.progress = progress
        self.decoder = FrameDecoder()
        self.out = OutQueue()
        self.eof = False  # the socket reached end of stream (every frame relayed)
        self.status: Optional[int] = None  # wait status once reaped
        self.kill_deadline: Optional[float] = None  # SIGKILL after this (monotonic)
        self.termed: Set[int] = set()
        self.root_termed = False
        self.orphans = False


class Zygote:
    def __init__(
        self,
        read_fd: int,
        write_fd: int,
        mode: str,
        versions: Dict[str, str],
        sim_devices: int,
        mounts: Optional[WorkspaceMounts] = None,
    ) -> None:
        self.mode = mode
        self.mounts = mounts  # sandboxed: switches /work between requests
        self.versions = versions
        self.sim_devices = sim_devices
        self.pid = os.getpid()
        self.read_fd = read_fd
        self.write_fd = write_fd
        os.set_blocking(read_fd, False)
        os.set_blocking(write_fd, False)
        try:
            fcntl.fcntl(write_fd, _F_SETPIPE_SZ, 1 << 20)
        except OSError:
            pass
        self.decoder = FrameDecoder()
        self.out = OutQueue()
        self.children: Dict[int, ChildRecord] = {}
        self.by_pid: Dict[int, ChildRecord] = {}
        self.orphan_termed: Set[int] = set()
        self.stopping = False
        self.stop_deadline = 0.0
        self.server_gone = False
        self.write_registered = False
        self.selector = selectors.DefaultSelector()
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, frame: None)  # handled through the wakeup fd
        self.selector.register(self.read_fd, selectors.EVENT_READ, "server")
        self.selector.register(self.wake_r, selectors.EVENT_READ, "wake")

    # ------------------------------------------------------------------ output

    def send(self, obj: Dict[str, Any]) -> None:
        self._send_payload(dumps(obj))

    def _send_payload(self, payload: bytes) -> None:
        self._send_framed(frame(payload))

    def _send_framed(self, data: bytes) -> None:
        if self.server_gone:
            return
        had = bool(self.out)
        self.out.push(data)
        if not had:
            self._flush_server()

    def _flush_server(self) -> None:
        try:
            self.out.write_to(self.write_fd)
        except OSError:
            self._server_closed()
            return
        want = bool(self.out)
        if want != self.write_registered:
            if want:
                self.selector.register(self.write_fd, selectors.EVENT_WRITE, "server_out")
            else:
                self.selector.unregister(self.write_fd)
            self.write_registered = want

    def _send_child(self, rec: ChildRecord, payload: bytes) -> None:
        if rec.eof:
            return
        had = bool(rec.out)
        rec.out.push(frame(payload))
        if not had:
            self._flush_child(rec)

    def _flush_child(self, rec: ChildRecord) -> None:
        try:
            rec.out.write_to(rec.sock.fileno())
        except OSError:
            rec.out = OutQueue()  # the child is gone; its exit is reported through waitpid
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if rec.out else 0)
        try:
            self.selector.modify(rec.sock, events, rec)
        except (KeyError, ValueError):
            pass

    # ------------------------------------------------------------------ loop

    def serve(self) -> int:
        hello = Hello(
            t="hello",
            pid=self.pid,
            python=platform.python_version(),
            versions=self.versions,
            mode=self.mode,
            monotonic_ns=time.monotonic_ns(),
        )
        if self.mode == "sim":
            hello["sim_devices"] = self.sim_devices
        self.send(hello)
        while True:
            timeout = self._timeout()
            for key, mask in self.selector.select(timeout):
                data = key.data
                if data == "server":
                    self._read_server()
                elif data == "server_out":
                    self._flush_server()
                elif data == "wake":
                    self._read_wakeup()
                elif isinstance(data, ChildRecord):
                    if mask & selectors.EVENT_READ:
                        self._read_child(data)
                    if mask & selectors.EVENT_WRITE and not data.eof:
                        self._flush_child(data)
            self._reap()
            self._progress_kills()
            self._handle_orphans()
            self._report_exits()
            if self.stopping:
                if not self.children:
                    return self._finish(0)
                if time.monotonic() > self.stop_deadline:
                    log("giving up on processes that would not die")
                    return self._finish(1)

    def _timeout(self) -> Optional[float]:
        if self.stopping or any(
            rec.status is not None or rec.kill_deadline is not None
            for rec in self.children.values()
        ):
            return POLL_SECONDS
        return None

    def _finish(self, code: int) -> int:
        if not self.server_gone and self.out:
            os.set_blocking(self.write_fd, True)
            try:
                self.out.write_to(self.write_fd)
            except OSError:
                pass
        return code

    def _read_wakeup(self) -> None:
        try:
            data = os.read(self.wake_r, 4096)
        except BlockingIOError:
            return
        for signum in data:
            if signum in (signal.SIGTERM, signal.SIGINT):
                self._stop(report=True)

    def _read_server(self) -> None:
        try:
            data = os.read(self.read_fd, 1 << 20)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._server_closed()
            return
        for payload in self.decoder.feed(data):
            try:
                msg = json.loads(split_tail(payload)[0])  # a tail is relayed, never parsed
            except ValueError:
                log("dropping a frame that is not JSON")
                continue
            if not isinstance(msg, dict):
                log("dropping a frame that is not a JSON object")
                continue
            self._dispatch(msg, payload)

    def _server_closed(self) -> None:
        if self.server_gone:
            return
        self.server_gone = True
        self.out = OutQueue()
        for fd in (self.read_fd, self.write_fd):
            try:
                self.selector.unregister(fd)
            except KeyError:
                pass
        self.write_registered = False
        self._stop(report=False)

    def _dispatch(self, msg: Dict[str, Any], payload: bytes) -> None:
        kind = msg.get("t")
        if kind == "fork":
            self._fork(msg)
        elif kind == "kill":
            self._kill(msg)
        elif kind == "shutdown":
            self._stop(report=True)
        elif kind == "workspace":
            self._switch_workspace(msg)
        elif "c" in msg:
            rec = self.children.get(msg["c"])
            if rec is None or rec.status is not None:
                log(f"dropping a {kind!r} frame for child {msg.get('c')!r}, which is not running")
                return
            self._send_child(rec, payload)
        else:
            log(f"dropping an unknown {kind!r} frame")

    def _switch_workspace(self, msg: Dict[str, Any]) -> None:
        """Bind the named workspace at /work for the next request (no answer: frames are handled
        in order, so the next ``run`` finds it there). Failing closed: a zygote that cannot
        switch exits at once, with every child (the server starts the slot anew), rather than let
        a program run in the last request's workspace."""
        name = msg.get("name")
        try:
            if self.mounts is None:
                raise RuntimeError("this zygote does not manage workspaces (no sandbox)")
            self.mounts.switch(str(name))
        except (OSError, ValueError, RuntimeError) as exc:
            log(f"cannot switch the workspace to {name!r}: {type(exc).__name__}: {exc}; exiting")
            os._exit(70)

    # ------------------------------------------------------------------ children

    def _fork(self, msg: Dict[str, Any]) -> None:
        c = msg.get("c")
        if not isinstance(c, int) or isinstance(c, bool) or c in self.children:
            log(f"refusing fork of child {c!r}: invalid or already in use")
            return
        if self.stopping:
            return
        env = {str(k): str(v) for k, v in (msg.get("env") or {}).items()}
        unset = [str(name) for name in (msg.get("unset") or [])]
        max_requests = int(msg.get("max_requests", 1))
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        shared = progress.new_page()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        pid = os.fork()
        if pid == 0:
            code = 70
            try:
                self._become_child(ours)
                from . import child

                child.main(theirs, self.pid, self.mode, self.versions, self.sim_devices,
                           env, unset, max_requests, shared)
                code = 0
            except BaseException:
                try:
                    traceback.print_exc()
                except BaseException:
                    pass
            finally:
                os._exit(code)
        theirs.close()
        try:
            os.setpgid(pid, pid)  # also done by the child; whoever is first wins the race
        except OSError:
            pass
        ours.setblocking(False)
        rec = ChildRecord(c, pid, ours, shared)
        self.children[c] = rec
        self.by_pid[pid] = rec
        self.selector.register(ours, selectors.EVENT_READ, rec)
        # Our clock as we answer: the server times the round trip to align its clock with ours.
        self.send(Forked(t="forked", c=c, pid=pid, monotonic_ns=time.monotonic_ns()))

    def _become_child(self, ours: socket.socket) -> None:
        """In the forked child: drop every fd and handler that belongs to the zygote."""
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        # Close, never unregister: the epoll instance is shared with the zygote.
        for fd in (self.read_fd, self.write_fd, self.wake_r, self.wake_w, self.selector.fileno()):
            try:
                os.close(fd)
            except OSError:
                pass
        ours.close()  # our copies only: the zygote keeps its own
        for rec in self.children.values():
            rec.sock.close()
            rec.progress.close()  # another child's page: not ours to see or write
        if self.mounts is not None:
            # Before any program runs: no handle on other workspaces, no capability at all.
            self.mounts.close()
            drop_capabilities()

    def _read_child(self, rec: ChildRecord) -> None:
        try:
            data = rec.sock.recv(1 << 20)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            rec.eof = True
            try:
                self.selector.unregister(rec.sock)
            except (KeyError, ValueError):
                pass
            return
        # Tagged at the end: JSON keeps the last of duplicate keys, so a child cannot speak for
        # another child (its own "c" is overridden) nor as the zygote (every frame it sends is
        # marked "child").
        suffix = b',"c":%d,"child":true}' % rec.c
        for payload in rec.decoder.feed(data):
            if len(payload) > 2 and payload[:1] == b"{" and payload[-1:] == b"}":
                self._send_framed(frame_with_suffix(payload, suffix))
            else:
                log(f"dropping a malformed frame from child {rec.c}")

    def _kill(self, msg: Dict[str, Any]) -> None:
        rec = self.children.get(msg.get("c"))  # type: ignore[arg-type]
        if rec is None:
            log(f"kill of unknown child {msg.get('c')!r}")
            return
        try:
            grace = max(0.0, float(msg.get("grace", 0)))
        except (TypeError, ValueError):
            grace = 0.0
        self._start_kill(rec, grace)

    def _start_kill(self, rec: ChildRecord, grace: float) -> None:
        deadline = time.monotonic() + grace
        if rec.kill_deadline is not None and rec.kill_deadline <= deadline:
            return
        rec.kill_deadline = deadline
        if grace <= 0:
            self._signal_child_tree(rec, signal.SIGKILL)
        else:
            self._signal_child_tree(rec, signal.SIGTERM, once=True)

    def _signal_child_tree(self, rec: ChildRecord, sig: int, once: bool = False) -> None:
        if rec.status is not None:
            return  # reaped: what is left of its tree is handled as orphans
        if not (once and rec.root_termed):
            procs.signal_group(rec.pid, sig)
            try:
                os.kill(rec.pid, sig)  # unreaped, so the pid is still ours
            except ProcessLookupError:
                pass
            rec.root_termed = rec.root_termed or once
        for pid, parent in procs.descendants(rec.pid):
            if once and pid in rec.termed:
                continue
            procs.signal_descendant(pid, parent, sig)
            if once:
                rec.termed.add(pid)

    def _progress_kills(self) -> None:
        now = time.monotonic()
        for rec in self.children.values():
            if rec.kill_deadline is not None and rec.status is None:
                if now >= rec.kill_deadline:
                    self._signal_child_tree(rec, signal.SIGKILL)
                else:
                    self._signal_child_tree(rec, signal.SIGTERM, once=True)

    def _reap(self) -> None:
        for pid, status in procs.reap_any():
            rec = self.by_pid.pop(pid, None)
            if rec is not None:
                rec.status = status
            # else: an orphan we adopted has exited

    def _handle_orphans(self) -> None:
        """Kill every process re-parented to us that is not a live child."""
        dead = [rec for rec in self.children.values() if rec.status is not None]
        if not dead:
            self.orphan_termed.clear()
            return
        live = {rec.pid for rec in self.children.values() if rec.status is None}
        orphans = procs.children(self.pid) - live
        self._orphans_present = bool(orphans)
        if not orphans:
            return
        for rec in dead:
            rec.orphans = True
        now = time.monotonic()
        in_grace = any(
            rec.kill_deadline is not None and now < rec.kill_deadline for rec in dead
        )
        for pid in orphans:
            if in_grace:
                if pid not in self.orphan_termed:
                    self.orphan_termed.add(pid)
                    procs.signal_tree(pid, signal.SIGTERM, include_root=True)
            else:
                procs.signal_tree(pid, signal.SIGKILL, include_root=True)

    _orphans_present = False

    def _report_exits(self) -> None:
        for rec in list(self.children.values()):
            if rec.status is None or not rec.eof or self._orphans_present:
                continue
            del self.children[rec.c]
            try:
                rec.sock.close()
            except OSError:
                pass
            status = procs.decode_status(rec.status)
            exited = Exited(t="exited", c=rec.c, code=status["code"], signal=status["signal"],
                            orphans=rec.orphans)
            instruction = progress.read(rec.progress)
            if instruction is not None:
                exited["instr"] = instruction
            rec.progress.close()
            self.send(exited)

    def _stop(self, report: bool) -> None:
        if not self.stopping:
            self.stopping = True
            self.stop_deadline = time.monotonic() + STOP_LIMIT_SECONDS
        for rec in self.children.values():
            if rec.status is None:
                self._start_kill(rec, 0.0)
            # a closed channel cannot deliver anything more: count the child as drained
            rec.eof = rec.eof or not report
        if not report:
            self.server_gone = True


def subprocess_python_path(current: str, runtime_dir: str, compat_dir: Optional[str]) -> str:
    """``PYTHONPATH`` ``current`` with ``runtime_dir`` and then ``compat_dir`` (unless ``None``)
    appended, each only where no entry names it already."""
    entries = current.split(os.pathsep) if current else []
    for extra in (runtime_dir, compat_dir):
        if extra is not None and extra not in entries:
            entries.append(extra)
    return os.pathsep.join(entries)


def installed_kcoral() -> Optional[str]:
    """Where a ``kcoral`` other than ours is found on ``sys.path`` (the working directory, a
    request's workspace, left out), or ``None``. A namespace portion does not count: a regular
    package anywhere on the path, ours included, comes before it."""
    here = os.getcwd()
    path = [entry for entry in sys.path if entry not in ("", here)]
    spec = importlib.machinery.PathFinder.find_spec("kcoral", path)
    return spec.origin if spec is not None and spec.origin is not None else None


def expose_runtime() -> None:
    """Upstream's worker-side names (``kcoral.errors``, ``kcoral.builtins``, the package
    ``compat/kcoral``) for uploaded code and for every process a request starts.

    In this process (and the children it forks) the compat directory goes last on
    ``sys.path``: a real ``kcoral`` comes first and wins. A new interpreter (a ``kcoral run``
    script, a program's subprocess, its grandchildren) builds its path from ``PYTHONPATH``,
    which the children inherit: it gets the runtime's directory (``kcoral.builtins`` imports
    ``kcoral_runtime``; the server names it already) and, when no real ``kcoral`` is installed,
    the compat directory, both at the end. With a real one the compat directory stays off
    ``PYTHONPATH``: its entries come before ``site-packages`` and would hide that installation
    there, where this process finds it. Either way a subprocess imports the same files as this
    process. Before any child is forked: reuse hygiene restores this environment after each
    request."""
    package_dir = os.path.dirname(os.path.abspath(__file__))
    compat_dir = os.path.join(package_dir, "compat")
    real = installed_kcoral()
    sys.path.append(compat_dir)
    os.environ["PYTHONPATH"] = subprocess_python_path(
        os.environ.get("PYTHONPATH", ""), os.path.dirname(package_dir),
        None if real is not None else compat_dir)


def _parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m kcoral_runtime.zygote")
    parser.add_argument("--mode", choices=("gpu", "sim", "cpu"), required=True)
    parser.add_argument("--sim-devices", type=int, default=1,
                        help="number of simulated GPUs (sim mode): sim-0 .. sim-<N-1>")
    parser.add_argument("--workspace", default=None,
                        help="(sandbox) the first workspace to bind at /work (workspace.py)")
    parser.add_argument("--preload", default="",
                        help="comma-separated modules to import before forking children "
                             "(devices.preload)")
    args = parser.parse_args(argv)
    if args.sim_devices < 1:
        parser.error("--sim-devices must be at least 1")
    return args


def _fatal(write_fd: int, message: str) -> int:
    log(message)
    try:
        os.set_blocking(write_fd, True)
        os.write(write_fd, frame(dumps({"t": "error", "message": message})))
    except OSError:
        pass
    return 1


def main(channel: "tuple[int, int]", argv: Optional[List[str]] = None) -> int:
    read_fd, write_fd = channel
    args = _parse_args(argv)
    warnings.filterwarnings("ignore", message=r".*fork\(\).*", category=DeprecationWarning)
    try:
        parent = os.getppid()
        # SIGTERM, not SIGKILL: our handler then kills every child tree before we exit, where a
        # SIGKILLed zygote would leave its children's descendants to init.
        procs.set_parent_death_signal(signal.SIGTERM)
        if os.getppid() != parent:
            return 1
        procs.set_child_subreaper()
        mounts: Optional[WorkspaceMounts] = None
        if args.workspace is not None:
            # Before any thread starts (a mount namespace of our own needs a single thread).
            mounts = WorkspaceMounts()
            mounts.setup(args.workspace)
        elif sys.path and sys.path[0] == os.getcwd():
            # Unsandboxed, each request puts its own workspace first on the path (engine.py);
            # the directory we were started in is not one.
            del sys.path[0]
        # A program runs as our user, in our sandbox: it must not ptrace us and inject code that
        # every later child would inherit. Children make themselves dumpable again.
        procs.set_dumpable(False)
        # Before anything starts a thread: a filter covers only the thread that installs it and
        # what that thread starts afterwards.
        refused = seccomp.install()
        if refused is not None:
            log(f"a program can start processes outside its worker's tree: {refused}")
        from . import devices

        devices.import_heavy(args.mode)
        devices.preload([name for name in args.preload.split(",") if name], args.mode)
        expose_runtime()
        versions = devices.collect_versions(args.mode)
        from . import child, engine  # noqa: F401  (imported once, here, not per child)
    except BaseException as exc:
        return _fatal(write_fd, f"zygote startup failed: {type(exc).__name__}: {exc}\n"
                                + traceback.format_exc())
    gc.collect()
    gc.freeze()  # imported objects stay shared copy-on-write and out of later collections
    if mounts is not None:
        # Sandboxed, a reused child retires when a program added an audit hook (leak_checks.py).
        from .leak_checks import watch_audit_hooks

        watch_audit_hooks()
    return Zygote(read_fd, write_fd, args.mode, versions, args.sim_devices, mounts).serve()


if __name__ == "__main__":
    sys.exit(main(_CHANNEL))
