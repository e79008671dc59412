"""A fresh child stays not dumpable until ``init``.

The zygote forks a seat's next child while the previous one may still be exiting, and whatever
of the previous program still runs there must not trace the new child or write into its memory
(``tests/sandbox_test.ts`` has the end-to-end attack). ``init`` comes once the previous child is
gone; from then on the child is dumpable as a program expects. Each case runs in a forked
process, since the flag is per process.
"""

from __future__ import annotations

import mmap
import os
import socket
import traceback
from typing import Callable

from kcoral_runtime import child as child_module
from kcoral_runtime import procs
from kcoral_runtime.devices import CpuBackend
from kcoral_runtime.ipc import FrameSocket

PR_GET_DUMPABLE = 3


def _dumpable() -> int:
    return procs.libc().prctl(PR_GET_DUMPABLE, 0, 0, 0, 0)


def _in_fork(body: Callable[[], None]) -> int:
    """Runs ``body`` in a forked process; its exit code (0 when it raised nothing)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            body()
            code = 0
        except BaseException:
            traceback.print_exc()
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _child() -> "tuple[child_module.Child, FrameSocket]":
    ours, theirs = socket.socketpair()
    return child_module.Child(theirs, "cpu", {}, 0, 1, mmap.mmap(-1, 4096)), FrameSocket(ours)


def test_not_dumpable_until_init_then_dumpable() -> None:
    def body() -> None:
        procs.set_dumpable(False)  # as forked from the zygote
        child, server = _child()
        child.prepare()
        assert _dumpable() == 0, "dumpable before init"
        child._init()
        frame = server.recv()
        assert frame is not None and frame["t"] == "ready", frame
        assert _dumpable() == 1, "not dumpable after init"

    assert _in_fork(body) == 0


def test_a_set_up_that_needs_a_dumpable_process_runs_again_at_init() -> None:
    def body() -> None:
        procs.set_dumpable(False)
        original = CpuBackend.prepare

        def prepare(self: CpuBackend) -> None:
            if _dumpable() == 0:
                raise OSError("refused: not dumpable")
            original(self)

        CpuBackend.prepare = prepare  # type: ignore[method-assign]
        child, server = _child()
        child.prepare()
        assert child.prepare_error is not None
        child._init()
        frame = server.recv()
        assert frame is not None and frame["t"] == "ready", frame

    assert _in_fork(body) == 0


def test_a_set_up_that_fails_either_way_is_init_failed() -> None:
    def body() -> None:
        procs.set_dumpable(False)

        def prepare(self: CpuBackend) -> None:
            raise OSError("no device")

        CpuBackend.prepare = prepare  # type: ignore[method-assign]
        child, server = _child()
        child.prepare()
        child_module._exit = lambda code: None  # type: ignore[assignment]  # stay to be checked
        child._init()
        frame = server.recv()
        assert frame is not None and frame["t"] == "init_failed", frame
        assert "no device" in frame["message"], frame

    assert _in_fork(body) == 0
