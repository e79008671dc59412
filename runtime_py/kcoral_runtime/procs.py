"""Process-tree helpers: prctl, /proc children walks, signals that cannot hit a reused pid."""

from __future__ import annotations

import ctypes
import errno
import os
import signal
from typing import Dict, List, Optional, Set, Tuple

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_NO_NEW_PRIVS = 38
PR_SET_CHILD_SUBREAPER = 36

_libc: Optional[ctypes.CDLL] = None


def libc() -> ctypes.CDLL:
    """This process's C library, with ``errno`` kept for ``ctypes.get_errno``."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


def _prctl(option: int, value: int) -> None:
    if libc().prctl(ctypes.c_int(option), ctypes.c_ulong(value), ctypes.c_ulong(0),
                  ctypes.c_ulong(0), ctypes.c_ulong(0)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl({option}) failed: {os.strerror(err)}")


def set_parent_death_signal(sig: int = signal.SIGKILL) -> None:
    """Be sent ``sig`` when the thread that forked us exits."""
    _prctl(PR_SET_PDEATHSIG, int(sig))


def set_no_new_privs() -> None:
    """Never gain privileges again (set-user-ID bits and file capabilities stop applying)."""
    _prctl(PR_SET_NO_NEW_PRIVS, 1)


def set_dumpable(dumpable: bool) -> None:
    """Whether processes of the same user may ptrace us (and read our /proc files in full)."""
    _prctl(PR_SET_DUMPABLE, int(dumpable))


def set_child_subreaper() -> None:
    """Adopt orphaned descendants, so none of them can escape our tree."""
    _prctl(PR_SET_CHILD_SUBREAPER, 1)


def _read(path: str) -> Optional[str]:
    try:
        with open(path, "rb") as f:
            return f.read().decode("ascii", "replace")
    except OSError:
        return None


def stat_fields(pid: int) -> Optional[Tuple[str, int]]:
    """(state letter, ppid) from /proc/<pid>/stat, or None when the process is gone."""
    text = _read(f"/proc/{pid}/stat")
    if not text:
        return None
    rest = text.rpartition(")")[2].split()
    if len(rest) < 2:
        return None
    return rest[0], int(rest[1])


def children(pid: int) -> Set[int]:
    """Direct children of ``pid`` (any of its threads may have forked them)."""
    found: Set[int] = set()
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    have_children_file = False
    for tid in tids:
        text = _read(f"/proc/{pid}/task/{tid}/children")
        if text is None:
            continue
        have_children_file = True
        found.update(int(x) for x in text.split())
    if not have_children_file and tids:
        found = _children_by_scan(pid)
    return found


def _children_by_scan(pid: int) -> Set[int]:
    """Fallback for kernels without /proc/<pid>/task/<tid>/children."""
    found: Set[int] = set()
    for name in os.listdir("/proc"):
        if name.isdigit():
            fields = stat_fields(int(name))
            if fields is not None and fields[1] == pid:
                found.add(int(name))
    return found


def descendants(pid: int) -> List[Tuple[int, int]]:
    """Every descendant of ``pid`` as (pid, parent pid), parents before children."""
    out: List[Tuple[int, int]] = []
    seen: Set[int] = {pid}
    pending = [pid]
    while pending:
        parent = pending.pop(0)
        for child in sorted(children(parent)):
            if child not in seen:
                seen.add(child)
                out.append((child, parent))
                pending.append(child)
    return out


def signal_descendant(pid: int, parent: int, sig: int) -> None:
    """Signal ``pid`` only if it is still the child of ``parent`` we found in /proc.

    The pid is pinned with a pidfd first, so the ancestry check and the signal apply to the
    same process even if the pid is recycled in between.
    """
    pidfd_open = getattr(os, "pidfd_open", None)
    send = getattr(signal, "pidfd_send_signal", None)
    try:
        if pidfd_open is None or send is None:
            fields = stat_fields(pid)
            if fields is not None and fields[1] == parent:
                os.kill(pid, sig)
            return
        fd = pidfd_open(pid)
        try:
            fields = stat_fields(pid)
            if fields is not None and fields[1] == parent:
                send(fd, sig)
        finally:
            os.close(fd)
    except OSError as exc:
        if exc.errno not in (errno.ESRCH, errno.EPERM):
            raise


def signal_tree(root: int, sig: int, include_root: bool) -> int:
    """Signal every descendant of ``root`` (and ``root`` itself if asked). Returns how many.

    ``root`` must be our own unreaped child or ourselves, so its pid cannot be recycled.
    """
    tree = descendants(root)
    if include_root:
        try:
            os.kill(root, sig)
        except ProcessLookupError:
            pass
    for pid, parent in tree:
        signal_descendant(pid, parent, sig)
    return len(tree) + (1 if include_root else 0)


def signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def reap_any() -> List[Tuple[int, int]]:
    """Reap every exited child without blocking: [(pid, wait status)]."""
    out: List[Tuple[int, int]] = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return out
        if pid == 0:
            return out
        out.append((pid, status))


def has_live_children() -> bool:
    """Reap exited children; True if any child process is still running.

    One ``waitpid`` call in the common case (ECHILD: no children at all).
    """
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return False
        if pid == 0:
            return True


def decode_status(status: int) -> Dict[str, Optional[int]]:
    if os.WIFSIGNALED(status):
        return {"code": None, "signal": os.WTERMSIG(status)}
    if os.WIFEXITED(status):
        return {"code": os.WEXITSTATUS(status), "signal": None}
    return {"code": None, "signal": None}


def comm(pid: int, tid: Optional[int] = None) -> str:
    path = f"/proc/{pid}/task/{tid}/comm" if tid is not None else f"/proc/{pid}/comm"
    return (_read(path) or "?").strip()
