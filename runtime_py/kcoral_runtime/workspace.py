"""Per-request workspaces inside a bubblewrap sandbox.

A program always sees its working directory at ``/work``, yet every request gets a directory of
its own on the host, removed when the request ends. bubblewrap binds the seat's directory of
workspaces (host ``slots/<k>/ws``) at ``/kcoral/ws`` and starts the zygote with
``CAP_SYS_ADMIN`` in the sandbox's user namespace only. The zygote then, before anything else::

    unshare(CLONE_NEWNS)            a mount namespace of its own (shared with its children)
    /kcoral/ws   -> O_PATH fd       kept by the zygote only
    /kcoral/ws   <- empty tmpfs     other requests' workspaces are out of sight
    /work        <- bind /proc/self/fd/<fd>/<name>     the first workspace

and for every later request the server names the next workspace (a ``workspace`` frame), which
replaces the bind at ``/work`` (the old one is detached). Children share the mount namespace, so
a child's ``chdir("/work")`` lands in the workspace of the request it runs. Every child drops all
capabilities right after the fork, before any uploaded code runs (``drop_capabilities``);
``no_new_privs`` (set with the seccomp filter) keeps ``execve`` from regaining any.

Without a sandbox none of this runs: the workspace is a host directory named in the request.
"""

from __future__ import annotations

import ctypes
import os
import re

from . import procs

PARENT = "/kcoral/ws"
TARGET = "/work"
_NAME = re.compile(r"^w[0-9]{1,18}$")

_CLONE_NEWNS = 0x00020000
_MS_RDONLY = 1
_MS_NOSUID = 2
_MS_NODEV = 4
_MS_BIND = 4096
_MS_REC = 16384
_MS_PRIVATE = 1 << 18
_MNT_DETACH = 2
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source: "bytes | None", target: bytes, fstype: "bytes | None", flags: int,
           data: "bytes | None" = None) -> None:
    libc = procs.libc()
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                           ctypes.c_char_p]
    _check(libc.mount(source, target, fstype, flags, data), f"mount {target.decode()}")


class WorkspaceMounts:
    """The zygote's side: owns the mount namespace and switches ``/work`` between requests."""

    def __init__(self) -> None:
        self.fd = -1

    def setup(self, first: str) -> None:
        """Private mount namespace, hidden parent, ``first`` at ``/work`` (module docstring).

        Must run before the process starts a thread (``unshare`` of the mount namespace
        refuses a process whose file-system information is shared).
        """
        libc = procs.libc()
        _check(libc.unshare(ctypes.c_int(_CLONE_NEWNS)), "unshare(CLONE_NEWNS)")
        _mount(None, b"/", None, _MS_REC | _MS_PRIVATE)
        self.fd = os.open(PARENT, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        _mount(b"tmpfs", PARENT.encode(), b"tmpfs", _MS_RDONLY | _MS_NOSUID | _MS_NODEV,
               b"size=4k,mode=0555")
        os.chdir("/")
        self._bind(first)

    def switch(self, name: str) -> None:
        """Detach the previous workspace from ``/work`` and bind ``name`` there."""
        libc = procs.libc()
        _check(libc.umount2(TARGET.encode(), ctypes.c_int(_MNT_DETACH)), "umount /work")
        self._bind(name)

    def _bind(self, name: str) -> None:
        if not _NAME.match(name):
            raise ValueError(f"invalid workspace name {name!r}")
        source = f"/proc/self/fd/{self.fd}/{name}".encode()
        _mount(source, TARGET.encode(), None, _MS_BIND)

    def close(self) -> None:
        """In a forked child: give up the zygote's handle on the workspaces."""
        if self.fd >= 0:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = -1


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


def drop_capabilities() -> None:
    """Give up every capability (effective, permitted, inheritable, ambient) for good."""
    libc = procs.libc()
    _check(libc.prctl(ctypes.c_int(_PR_CAP_AMBIENT), ctypes.c_ulong(_PR_CAP_AMBIENT_CLEAR_ALL),
                      ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0)),
           "clear ambient capabilities")
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    _check(libc.capset(ctypes.byref(header), ctypes.byref(data)), "capset")


def effective_capabilities() -> int:
    """This process's effective capability mask (``CapEff`` in ``/proc/self/status``)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    return 0
