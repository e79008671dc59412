"""Restoring a reused child's process state between requests (spec server §2).

``ProcessState`` is taken after ``init`` and written back (only what changed) after each
request of a reused child::

    init ──▶ ProcessState(torch) ──▶ request ──▶ interpreter.restore()   right after the last
                                                                         instruction
                                                 restore()                environment, POSIX
                                                                          state, torch knobs

* ``InterpreterState``: trace/profile hooks, gc callbacks and settings, switch interval,
  recursion limit (the engine puts it back first: it would run on every later line).
* ``PosixState``: umask, resource limits, signal handlers and mask, interval timers
  (``restore_signals`` alone before the sandbox checks: no handler of the program runs after).
* the C-level environment (``CEnviron``) and torch's knobs (``TORCH_CALLS``, ``TORCH_ATTRS``).

What cannot be written back (a lowered hard limit) raises ``StateNotRestored`` (-> retire).
Finding what a request left behind (threads, files, mappings, processes, audit hooks) is
``leak_checks.py``.
"""

from __future__ import annotations

import _signal
import ctypes
import gc
import os
import resource
import signal
import sys
import threading
from typing import Any, Dict, List, Tuple


# Knobs read and written as attributes: (path under torch, attribute). fp32_precision rather than
# allow_tf32, which cannot express "unset" and would rewrite 'none' as 'ieee'.
TORCH_ATTRS: Tuple[Tuple[str, str], ...] = (
    ("backends.cuda.matmul", "fp32_precision"),
    ("backends.cudnn", "fp32_precision"),
    ("backends.cudnn.conv", "fp32_precision"),
    ("backends.cudnn.rnn", "fp32_precision"),
    ("backends.cuda.matmul", "allow_fp16_reduced_precision_reduction"),
    ("backends.cuda.matmul", "allow_bf16_reduced_precision_reduction"),
    ("backends.cudnn", "benchmark"),
    ("backends.cudnn", "deterministic"),
)
# Getter/setter pairs, restored before the attributes (set_float32_matmul_precision writes
# through to the per-backend knobs, so the finer ones must land last).
TORCH_CALLS: Tuple[Tuple[str, str], ...] = (
    ("get_float32_matmul_precision", "set_float32_matmul_precision"),
    ("get_default_dtype", "set_default_dtype"),
    ("get_default_device", "set_default_device"),
    ("is_grad_enabled", "set_grad_enabled"),
    ("are_deterministic_algorithms_enabled", "use_deterministic_algorithms"),
)
_UNREADABLE = object()


def _reach(root: Any, path: str) -> Any:
    for part in path.split("."):
        root = getattr(root, part)
    return root


class CEnviron:
    """The process environment as libc sees it (catches ``setenv`` from native code)."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(None)
        self._environ = ctypes.c_void_p.in_dll(libc, "environ")

    def read(self) -> Dict[str, str]:
        out: Dict[str, str] = {}
        base = self._environ.value
        if not base:
            return out
        entries = ctypes.cast(base, ctypes.POINTER(ctypes.c_char_p))
        index = 0
        while True:
            entry = entries[index]
            if entry is None:
                return out
            name, _, value = entry.decode("utf-8", "surrogateescape").partition("=")
            out.setdefault(name, value)
            index += 1


class StateNotRestored(Exception):
    """Process state a request changed that cannot be put back: the worker must retire."""


_LIMITS = tuple(getattr(resource, name) for name in dir(resource) if name.startswith("RLIMIT_"))
_SIGNALS = tuple(
    int(s) for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP)
)
# The C function: ``signal.getsignal`` wraps each answer in an enum (19 us for all, 1 us raw).
_getsignal = _signal.getsignal
_TIMERS = (signal.ITIMER_REAL, signal.ITIMER_VIRTUAL, signal.ITIMER_PROF)


class PosixState:
    """Process state beyond the environment that a program can change and the next request of a
    reused worker would inherit: a pending ``alarm()`` would fire in it, a lowered descriptor
    limit fail it, a changed umask or signal handler change what it does. ~10 us to check.

    Signal handlers are compared as Python sees them (``signal.getsignal``): a handler a native
    library installs with ``sigaction`` is not seen.
    """

    def __init__(self) -> None:
        self.umask = _read_umask()
        self.limits = {limit: resource.getrlimit(limit) for limit in _LIMITS}
        self.handlers = dict(zip(_SIGNALS, map(_getsignal, _SIGNALS)))
        self.mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
        self.timers = {which: signal.getitimer(which) for which in _TIMERS}

    def restore(self, restored: List[str]) -> None:
        """Writes back what changed (names into ``restored``); raises ``StateNotRestored``."""
        if _read_umask() != self.umask:
            os.umask(self.umask)
            restored.append("umask")
        self.restore_signals(restored)
        for limit, value in self.limits.items():
            if resource.getrlimit(limit) != value:
                try:
                    resource.setrlimit(limit, value)
                except (OSError, ValueError) as exc:
                    raise StateNotRestored(f"resource limit {limit} {value} not restored: {exc}")
                restored.append(f"rlimit:{limit}")

    def restore_signals(self, restored: List[str]) -> None:
        """Interval timers, signal handlers and mask only: after this, no handler the program
        installed runs (a few syscalls; the resource limits are most of ``restore``)."""
        for which, timer in self.timers.items():
            if signal.getitimer(which) != timer:
                signal.setitimer(which, *timer)
                restored.append(f"itimer:{which}")
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
        if mask != self.mask:
            # A signal the program blocked and left pending would be delivered when the mask is
            # put back, to the handler put back below (the default kills the worker): drop it.
            for sig in (signal.sigpending() & mask) - self.mask:
                signal.sigtimedwait([sig], 0)
                restored.append(f"pending:{signal.Signals(sig).name}")
        handlers = self.handlers
        for sig, current in zip(_SIGNALS, map(_getsignal, _SIGNALS)):
            handler = handlers[sig]
            if current is not handler and current != handler and handler is not None:
                signal.signal(sig, handler)
                restored.append(f"signal:{signal.Signals(sig).name}")
        if mask != self.mask:
            signal.pthread_sigmask(signal.SIG_SETMASK, self.mask)
            restored.append("sigmask")


def _read_umask() -> int:
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


class InterpreterState:
    """Interpreter-wide hooks and settings a program can change and the next request of a
    reused worker would run under: a trace or profile function (called on every line or call
    of the next program, and of the runtime), thread trace/profile hooks, gc callbacks, gc
    switched off or retuned, the thread switch interval, the recursion limit. ~0.7 us to check.
    Audit hooks cannot be put back (``watch_audit_hooks``)."""

    def __init__(self) -> None:
        self.trace = sys.gettrace()
        self.profile = sys.getprofile()
        self.thread_trace = threading.gettrace()
        self.thread_profile = threading.getprofile()
        self.gc_callbacks = list(gc.callbacks)
        self.gc_enabled = gc.isenabled()
        self.gc_threshold = gc.get_threshold()
        self.switch_interval = sys.getswitchinterval()
        self.recursion_limit = sys.getrecursionlimit()

    def restore(self, restored: List[str]) -> None:
        """Writes back what changed (names into ``restored``)."""
        if sys.gettrace() is not self.trace:
            sys.settrace(self.trace)
            restored.append("sys.settrace")
        if sys.getprofile() is not self.profile:
            sys.setprofile(self.profile)
            restored.append("sys.setprofile")
        if threading.gettrace() is not self.thread_trace:
            threading.settrace(self.thread_trace)  # type: ignore[arg-type]
            restored.append("threading.settrace")
        if threading.getprofile() is not self.thread_profile:
            threading.setprofile(self.thread_profile)  # type: ignore[arg-type]
            restored.append("threading.setprofile")
        if gc.callbacks != self.gc_callbacks:
            gc.callbacks[:] = self.gc_callbacks
            restored.append("gc.callbacks")
        if gc.isenabled() != self.gc_enabled:
            (gc.enable if self.gc_enabled else gc.disable)()
            restored.append("gc.enable")
        if gc.get_threshold() != self.gc_threshold:
            gc.set_threshold(*self.gc_threshold)
            restored.append("gc.set_threshold")
        if sys.getswitchinterval() != self.switch_interval:
            sys.setswitchinterval(self.switch_interval)
            restored.append("sys.setswitchinterval")
        if sys.getrecursionlimit() != self.recursion_limit:
            sys.setrecursionlimit(self.recursion_limit)
            restored.append("sys.setrecursionlimit")


class ProcessState:
    """Torch knobs, environment, POSIX and interpreter state as they stood after ``init``."""

    def __init__(self, torch: Any) -> None:
        self._torch = torch
        self._cenv = CEnviron()
        self.environ = self._cenv.read()
        self.posix = PosixState()
        self.interpreter = InterpreterState()
        self.knobs: Dict[str, Any] = {}
        if torch is not None:
            for getter, setter in TORCH_CALLS:
                try:
                    self.knobs[setter] = getattr(torch, getter)()
                except Exception:
                    pass  # a torch build without this knob
            for path, name in TORCH_ATTRS:
                try:
                    self.knobs[f"{path}.{name}"] = getattr(_reach(torch, path), name)
                except Exception:
                    pass

    def restore(self) -> List[str]:
        """Write back what changed; returns the names of what was restored. Raises
        ``StateNotRestored`` for what cannot be written back."""
        restored: List[str] = []
        # ``self.interpreter`` is not here: the engine puts it back right after a reused
        # worker's last instruction, before anything else of the request runs.
        self._restore_environ(restored)
        self.posix.restore(restored)
        if self._torch is not None:
            self._restore_torch(restored)
        return restored

    def _restore_environ(self, restored: List[str]) -> None:
        want = self.environ
        current = self._cenv.read()
        if current != want:
            for name in set(current) - set(want):
                os.unsetenv(name)  # reaches libc even for a name os.environ never saw
                os.environ.pop(name, None)
                restored.append(f"env:{name}")
            for name, value in want.items():
                if current.get(name) != value:
                    os.environ[name] = value  # putenv()s as well
                    restored.append(f"env:{name}")
        python_view = os.environ
        if len(python_view) != len(want) or any(python_view.get(k) != v for k, v in want.items()):
            for name in [k for k in python_view if k not in want]:
                del python_view[name]
            for name, value in want.items():
                if python_view.get(name) != value:
                    python_view[name] = value

    def _restore_torch(self, restored: List[str]) -> None:
        torch = self._torch
        for getter, setter in TORCH_CALLS:
            if setter not in self.knobs:
                continue
            try:
                current = getattr(torch, getter)()
            except Exception:
                current = _UNREADABLE
            # set_default_device is not free: setting it even to the same value installs a
            # function mode that intercepts every tensor creation. Write only real changes.
            if current is _UNREADABLE or current != self.knobs[setter]:
                try:
                    getattr(torch, setter)(self.knobs[setter])
                    restored.append(f"torch.{setter}")
                except Exception:
                    pass
        for path, name in TORCH_ATTRS:
            key = f"{path}.{name}"
            if key not in self.knobs:
                continue
            try:
                holder = _reach(torch, path)
                if getattr(holder, name) != self.knobs[key]:
                    setattr(holder, name, self.knobs[key])
                    restored.append(f"torch.{key}")
            except Exception:
                pass
