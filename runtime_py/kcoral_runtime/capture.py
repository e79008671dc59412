"""fd-level capture of stdout/stderr for a whole request (spec protocol §3.6, server §4.3).

fds 1 and 2 are pointed at ``<results>/stdout`` and ``<results>/stderr``, so C code and
subprocesses are captured too; ``sys.stdout``/``sys.stderr`` become UTF-8 (errors=replace)
text streams on those fds. The server reads the head of each file up to its limit.

Only that head is ever returned, so a program printing in a loop must not fill the results disk
(or, on tmpfs, memory) within its timeout: while a capture runs, a guard thread checks every
``GUARD_INTERVAL_SECONDS`` how much each file holds and, past ``limit + GUARD_SLACK_BYTES``,
drops everything after the first ``limit + 1`` bytes through its own descriptor (so a program
that points fd 1 elsewhere cannot make it cut another file; the program can see that descriptor
too, so each cut, and the close at the end, first checks it still names the same file), once more
when the capture stops.
The file keeps its length (the rest is a hole, later output lands past it), so the size still
says how much was written.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import IO, Any, Dict, List, Optional, Tuple

_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0)

GUARD_INTERVAL_SECONDS = 0.05
GUARD_SLACK_BYTES = 8 << 20


def _flush(stream: Any) -> None:
    try:
        if stream is not None:
            stream.flush()
    except Exception:
        pass


class Captured:
    """Where a request's output went; sizes are read when the outcome is built."""

    def __init__(self, stdout_path: Optional[str], stderr_path: Optional[str]) -> None:
        self.stdout_path = stdout_path
        self.stderr_path = stderr_path

    @staticmethod
    def _describe(path: Optional[str]) -> Optional[Dict[str, Any]]:
        if path is None:
            return None
        try:
            size = os.stat(path).st_size
        except OSError:
            size = 0
        return {"path": path, "size": size}

    def describe(self) -> Tuple[Optional[Dict[str, Any]], Optional[Dict[str, Any]]]:
        return self._describe(self.stdout_path), self._describe(self.stderr_path)


def _identity(info: os.stat_result) -> Tuple[int, int]:
    return info.st_dev, info.st_ino


class _GrowthGuard:
    """Cuts captured files back to their returned head while a capture runs (module docstring).

    One thread per process, started with it (before any request's thread baseline is taken) and
    idle between captures.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._files: List[Tuple[int, Tuple[int, int]]] = []  # (fd, (st_dev, st_ino))
        self._keep = 0
        self._active = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="kcoral-capture-guard", daemon=True)
        self._thread.start()

    def watch(self, fds: List[int], limit_bytes: int) -> None:
        files = [(fd, _identity(os.fstat(fd))) for fd in fds]
        with self._lock:
            self._files, self._keep = files, limit_bytes + 1
        self._active.set()

    def unwatch(self) -> List[int]:
        """Stops watching (after one last cut) and hands back the descriptors still ours to
        close (the program can see them: one it closed may now number a file of its own)."""
        self._active.clear()
        with self._lock:
            ours = self._trim()
            self._files = []
        return ours

    def _trim(self) -> List[int]:
        """Cuts what is over the limit; returns the descriptors that still name our files."""
        ours: List[int] = []
        for fd, identity in self._files:
            try:
                info = os.fstat(fd)
                if _identity(info) != identity:
                    continue  # not our file any more
                ours.append(fd)
                if info.st_blocks * 512 > self._keep + GUARD_SLACK_BYTES:
                    os.ftruncate(fd, self._keep)
                    # The length back (a hole past the head), unless a write has moved it on.
                    if os.fstat(fd).st_size < info.st_size:
                        os.ftruncate(fd, info.st_size)
            except OSError:
                pass
        return ours

    def _loop(self) -> None:
        # Never the thread a signal is delivered to: a program that blocks one in its own thread
        # (to wait for it, or to leave it pending) must not see it acted on here.
        signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
        while True:
            self._active.wait()
            with self._lock:
                self._trim()
            time.sleep(GUARD_INTERVAL_SECONDS)


class OutputCapture:
    """Redirects fds 1/2 between ``start`` and ``stop``. One instance per child process."""

    def __init__(self) -> None:
        self._streams: Optional[Tuple[IO[str], IO[str]]] = None
        self._saved: Optional[Tuple[int, int, Any, Any]] = None
        self._captured = Captured(None, None)
        self._guard = _GrowthGuard()

    def _text_streams(self) -> Tuple[IO[str], IO[str]]:
        streams = self._streams
        if streams is None or streams[0].closed or streams[1].closed:
            streams = tuple(  # type: ignore[assignment]
                open(fd, "w", encoding="utf-8", errors="replace", buffering=1, closefd=False)
                for fd in (1, 2)
            )
            self._streams = streams
        return streams  # type: ignore[return-value]

    def start(self, results_dir: str, limit_bytes: int) -> None:
        if limit_bytes <= 0:
            self._captured = Captured(None, None)  # capture disabled: no redirection at all
            return
        for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            _flush(stream)
        out_path = os.path.join(results_dir, "stdout")
        err_path = os.path.join(results_dir, "stderr")
        out_fd = os.open(out_path, _FLAGS, 0o600)
        try:
            err_fd = os.open(err_path, _FLAGS, 0o600)
        except BaseException:
            os.close(out_fd)
            raise
        saved_out, saved_err = os.dup(1), os.dup(2)
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        self._guard.watch([out_fd, err_fd], limit_bytes)  # closed by stop()
        self._saved = (saved_out, saved_err, sys.stdout, sys.stderr)
        sys.stdout, sys.stderr = self._text_streams()
        self._captured = Captured(out_path, err_path)

    def stop(self) -> Captured:
        saved = self._saved
        if saved is not None:
            self._saved = None
            for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
                _flush(stream)
            if self._streams is not None:
                for stream in self._streams:
                    _flush(stream)
            saved_out, saved_err, sys.stdout, sys.stderr = saved
            os.dup2(saved_out, 1)
            os.dup2(saved_err, 2)
            os.close(saved_out)
            os.close(saved_err)
            for fd in self._guard.unwatch():
                os.close(fd)
        captured = self._captured
        self._captured = Captured(None, None)
        return captured
