"""The inputs of ``kcoral eval``'s step 1, one set per secret seed, made side by side.

``get_inputs()`` draws from torch's default CPU generator, whose ``normal_`` runs on one thread
under the generator's lock: the sets of one evaluation (three correctness seeds and three timing
seeds by default; 128 MiB each for the 4096² GEMM) cost one core's time each, one after the
other, and threads cannot share that generator. Processes can: the seeds are split into one
share per usable CPU; the worker makes the first share itself, and a forked process per further
share makes, hashes and lays out its sets as a small bundle::

    worker (step 1)                                   forked process per further share
      memfd + pipe per share, fork -----------------> per seed: seed the generator, get_inputs()
      first share here: get_inputs() per seed (under   BundleWriter: SHA-256 per tensor,
        the cpu_only guard: it shows a problem that      the bundle written into the memfd
        touches CUDA), hashed while the others run
      wait for each process; its status on the pipe <-- os._exit(0), or an error report + 1
      read each memfd (preadv); adopt its tensors and digests
        into the inputs bundle (no second hash)

The sets are the same as one process makes them one after another: each seed reseeds the
generator before ``get_inputs()``. Python's ``random`` and numpy's global generator (which
problems do not seed; the client's seeds are torch's) are reseeded from the OS in each forked
process, so that sets do not repeat each other's draws. With one usable CPU, or one seed, the
sets are made here, one after another, as before.
"""

from __future__ import annotations

import json
import os
import random
import sys
from typing import Any, Callable, Dict, List, Optional, Tuple

from .errors import ExecutionError
from .eval_bundle import Bundle, BundleWriter, usable_cpus
from .huge_pages import new_bytearray

_REPORT_LIMIT = 16 << 10  # an error report fits a pipe's buffer: the child never blocks on it


class _Forked:
    """A forked process making a share of the sets: its pid, its memfd and its status pipe. Each
    is given back once (``wait``, ``close``): a pid or descriptor number may be reused after."""

    def __init__(self, pid: int, memfd: int, status: int) -> None:
        self.pid = pid
        self.memfd = memfd
        self.status = status
        self.exit_status: Optional[int] = None

    def wait(self) -> int:
        """The wait status, the process reaped on the first call."""
        if self.exit_status is None:
            _, self.exit_status = os.waitpid(self.pid, 0)
        return self.exit_status

    def kill(self) -> None:
        """Kills and reaps the process unless it was reaped already."""
        if self.exit_status is None:
            try:
                os.kill(self.pid, 9)
            except OSError:
                pass
            self.wait()

    def close(self) -> None:
        """Closes the status pipe and the memfd unless they were closed already."""
        fds, self.status, self.memfd = (self.status, self.memfd), -1, -1
        for fd in fds:
            if fd >= 0:
                os.close(fd)


def _child(make: Callable[[int], List[Any]], seeds: List[int], memfd: int, status: int) -> None:
    """In the forked process: the sets of ``seeds``, as a bundle in ``memfd``; never returns."""
    code = 1
    try:
        random.seed()
        numpy = sys.modules.get("numpy")
        if numpy is not None:
            numpy.random.seed()
        writer = BundleWriter()
        described = [writer.describe_value(make(seed)) for seed in seeds]

        # Written, not mapped: the kernel's copy fills the memfd without a fault per page.
        writer.write_to(memfd, {"values": described})
        code = 0
    except BaseException as exc:  # noqa: BLE001 - reported to the worker, whatever it is
        kind = exc.kind if isinstance(exc, ExecutionError) else "runtime"
        report = {"kind": kind, "message": f"{type(exc).__name__}: {exc}"}
        try:
            os.write(status, json.dumps(report).encode()[:_REPORT_LIMIT])
        except OSError:
            pass
    finally:
        os._exit(code)


def _start(make: Callable[[int], List[Any]], seeds: List[int]) -> _Forked:
    memfd = os.memfd_create("kcoral-eval-inputs", os.MFD_CLOEXEC)
    read_end, write_end = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the forked process (its result is tested)
        os.close(read_end)
        _child(make, seeds, memfd, write_end)
    os.close(write_end)
    return _Forked(pid, memfd, read_end)


def _finish(forked: _Forked) -> Tuple[Bundle, List[Dict[str, Any]]]:
    """Waits for ``forked``; its sets as a bundle over the memfd and their descriptions."""
    try:
        chunks = []
        while True:
            chunk = os.read(forked.status, _REPORT_LIMIT)
            if not chunk:
                break
            chunks.append(chunk)
        status = forked.wait()
        if status != 0:
            if chunks:
                report = json.loads(b"".join(chunks))
                raise ExecutionError(report["kind"], report["message"])
            raise ExecutionError(
                "runtime", f"the process making a share of the input sets ended with wait status "
                           f"{status} and no report")
        bundle = Bundle(_read_whole(forked.memfd))
        return bundle, bundle.header["values"]
    finally:
        forked.close()


def _read_whole(fd: int) -> bytearray:
    """The whole file ``fd`` read into a new buffer (on huge pages when large): ``preadv``
    copies in the kernel, where a mapping of it would fault in every 4 KiB page."""
    size = os.fstat(fd).st_size
    data = new_bytearray(size)
    view = memoryview(data)
    got = 0
    while got < size:
        n = os.preadv(fd, [view[got:]], got)
        if n == 0:
            raise ExecutionError("runtime", f"the input sets' memfd ended at {got} of {size} "
                                            "bytes")
        got += n
    view.release()
    return data


def _stop(forked: List[_Forked]) -> None:
    for process in forked:
        process.kill()
        process.close()


def describe_seeds(make: Callable[[int], List[Any]], seeds: List[int], writer: BundleWriter,
                   processes: Optional[int] = None) -> List[Dict[str, Any]]:
    """``writer.describe_value(make(seed))`` for every seed, in order, with each tensor's SHA-256
    computed where it was made. ``processes``: how many processes make sets at once, this one
    included (default: the usable CPUs; 1: all here, one after another)."""
    width = min(len(seeds), processes if processes is not None else usable_cpus())
    if width <= 1:
        return [writer.describe_value(make(seed)) for seed in seeds]
    # Contiguous shares, as even as they come; the first is made here.
    bounds = [len(seeds) * k // width for k in range(width + 1)]
    shares = [seeds[bounds[k]: bounds[k + 1]] for k in range(width)]
    forked: List[_Forked] = []
    try:
        for share in shares[1:]:
            forked.append(_start(make, share))
        described = [writer.describe_value(make(seed)) for seed in shares[0]]
        writer.hash_tensors()  # while the forked processes still run
        while forked:
            bundle, values = _finish(forked[0])  # on a failure _stop still kills the others
            forked.pop(0)
            described.extend(writer.adopt(bundle, value) for value in values)
    except BaseException:
        _stop(forked)
        raise
    return described


__all__ = ["describe_seeds"]
