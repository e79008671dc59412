"""Finding what a request of a reused child left behind (spec server §2), and undoing its
imports from the workspace.

* ``SandboxState`` (sandbox mode), taken while the child waits for its next request::

      idle ──▶ SandboxState() ──▶ request ──▶ clean_and_check_process(ws)   under the lease,
                                                                            before the outcome
                                              check_files()                 after the answer

  ``clean_and_check_process`` undoes ``sys.path`` and modules from the workspace (also through
  the links that lead into it, ``WORKSPACE_ALIASES``) and reports threads and audit hooks that
  outlive the request; ``check_files`` reports descriptors and mappings into the workspace.
  Descriptors: each is ``fstat``-ed, and its target read only when ``KNOWN_DESCRIPTORS`` does
  not hold it with that identity. Mappings: ``/proc/self/map_files`` is listed, and
  ``/proc/self/maps`` read only when a range exists that ``KNOWN_RANGES`` does not hold.
* audit hooks cannot be removed, nor listed: a sandboxed zygote installs ``watch_audit_hooks``,
  which its children inherit, to notice a program adding one.
* ``forget_workspace_imports`` (no sandbox): the request's workspace off ``sys.path``, with its
  finders and modules.
* ``kill_leftover_processes``: found with one ``waitpid``, killed, and reported.

Anything reported retires the child. Writing back the state a request changed is
``state_restore.py``.
"""

from __future__ import annotations

import importlib
import os
import signal
import stat
import sys
import threading
import time
from typing import Any, Dict, FrozenSet, List, Optional, Set, Tuple

from . import procs

_AUDIT_HOOK_ADDED: List[bool] = []
_WATCHING: List[Any] = []


def _notice_audit_hook(event: str, args: Any, _added: List[bool] = _AUDIT_HOOK_ADDED) -> None:
    if event == "sys.addaudithook":
        _added.append(True)


def watch_audit_hooks() -> None:
    """Notice, from now on, any audit hook added in this process or its forks
    (``audit_hook_added``). Once per process: hooks cannot be removed."""
    if _notice_audit_hook not in _WATCHING:
        _WATCHING.append(_notice_audit_hook)
        sys.addaudithook(_notice_audit_hook)


def audit_hook_added() -> bool:
    """Whether an audit hook was added since ``watch_audit_hooks`` (it outlives any request:
    it would see every later program's file opens, imports and subprocesses)."""
    return bool(_AUDIT_HOOK_ADDED)


# --------------------------------------------------------------------------- children


def kill_leftover_processes(timeout: float = 2.0) -> bool:
    """Kill and reap every descendant of this process. True if there were live ones.

    This process is a child subreaper, so every descendant that outlived its parent is our
    direct child now; a descendant surviving ``timeout`` (uninterruptible) is left to the
    zygote, which does not report our exit before it is gone.
    """
    if not procs.has_live_children():
        return False
    deadline = time.monotonic() + timeout
    while True:
        procs.signal_tree(os.getpid(), signal.SIGKILL, include_root=False)
        if not procs.has_live_children() or time.monotonic() >= deadline:
            return True
        time.sleep(0.002)


# --------------------------------------------------------------------------- sandbox


def warm_thread_pools(torch: Any) -> None:
    """Start the lazily created native thread pools (OpenBLAS, torch intra-op) now, so a
    request that first uses them is not mistaken for one that leaks threads."""
    try:
        import numpy

        a = numpy.ones((256, 256))
        a @ a
    except Exception:
        pass
    if torch is not None:
        try:
            torch.ones(1 << 18).mul_(2)
        except Exception:
            pass


def _native_threads() -> Set[int]:
    return {int(tid) for tid in os.listdir("/proc/self/task")}


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root + "/")


def forget_workspace_imports(workspace: str) -> None:
    """Undo what a request's imports from its (unsandboxed) workspace left in this process.

    Without a sandbox each request's workspace is a new host directory, put first on
    ``sys.path`` for the request (so uploaded modules import as they do at ``/work``). Afterwards
    the directory is gone: its path entry, its cached finder (one per request would pile up in
    a reused worker) and the modules loaded from it (a later request may upload another version
    of the same module) are dropped. The module scan runs only when an import looked there.
    """
    while workspace in sys.path:
        sys.path.remove(workspace)
    finders = [k for k in sys.path_importer_cache if isinstance(k, str) and _under(k, workspace)]
    if not finders:
        return
    for key in finders:
        del sys.path_importer_cache[key]
    for name, module in list(sys.modules.items()):
        try:
            names = [getattr(module, "__file__", None)]
            names.extend(getattr(module, "__path__", None) or ())
        except Exception:
            continue
        if any(isinstance(n, str) and _under(n, workspace) for n in names):
            sys.modules.pop(name, None)
    importlib.invalidate_caches()


# Paths a sandbox links into the workspace (server/workers/sandbox.ts): ``/tmp`` and ``/var/tmp``
# to ``/work/.kcoral/tmp``, ``/dev/shm`` to ``/work/.kcoral/shm``. A module imported through one
# of them names it in its ``__file__``, not ``/work``.
WORKSPACE_ALIASES: Tuple[str, ...] = ("/tmp", "/var/tmp", "/dev/shm")
_SPELLINGS: Dict[str, Tuple[str, Tuple[str, ...]]] = {}


def workspace_root(workspace: str) -> Tuple[str, Tuple[str, ...]]:
    """The real path of ``workspace`` and the paths under which its files can be named: its
    absolute and real path and each of ``WORKSPACE_ALIASES`` that leads into it. Remembered
    per workspace path: a sandbox's ``/work`` and its links stay what they are for the
    sandbox's life."""
    known = _SPELLINGS.get(workspace)
    if known is not None:
        return known
    root = os.path.realpath(workspace)
    spellings = [os.path.abspath(workspace), root]
    for alias in WORKSPACE_ALIASES:
        if alias not in spellings and _under(os.path.realpath(alias), root):
            spellings.append(alias)
    known = (root, tuple(dict.fromkeys(spellings)))
    if len(_SPELLINGS) < 64:  # unsandboxed checks see a new host directory per request
        _SPELLINGS[workspace] = known
    return known


def file_mapping_ranges() -> Optional[FrozenSet[str]]:
    """The address ranges of this process's file-backed mappings, named as in
    ``/proc/self/map_files`` (a directory listing: no path per mapping, unlike
    ``/proc/self/maps``), or None where it cannot be listed."""
    try:
        return frozenset(os.listdir("/proc/self/map_files"))
    except OSError:
        return None


# Ranges (``/proc/self/map_files`` names) known to map no workspace file: every file-backed
# mapping the process had before any program ran (``learn_first_mappings``), and every mapping
# of a library (a file with an executable mapping) mapped later from outside the workspace. A
# library stays mapped where it is (Python never unloads an extension module; the runtime
# unloads only uploaded libraries, which live in the workspace and are never here), and what
# was mapped before any program (the runtime's libraries, the C library's locale files) stays
# too: no workspace file can be mapped in one of these ranges unless a program unmaps what the
# runtime mapped.
KNOWN_RANGES: Set[str] = set()
_FIRST_MAPPINGS_LEARNED: List[bool] = []


def _range_name(maps_range: str) -> str:
    """A ``/proc/self/maps`` range as ``/proc/self/map_files`` names it (no zero padding)."""
    start, _, end = maps_range.partition("-")
    return f"{int(start, 16):x}-{int(end, 16):x}"


def learn_first_mappings() -> None:
    """Adds every file-backed mapping to ``KNOWN_RANGES``; once per process, before any program
    runs in it (the first sandbox snapshot)."""
    if _FIRST_MAPPINGS_LEARNED:
        return
    _FIRST_MAPPINGS_LEARNED.append(True)
    with open("/proc/self/maps", "rb") as maps:
        lines = maps.read().decode(errors="replace").splitlines()
    for line in lines:
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5].startswith("/"):
            KNOWN_RANGES.add(_range_name(fields[0]))


def mapped_under(root: str, roots: Tuple[str, ...], learn: bool = False) -> Set[str]:
    """The files under ``root`` this process maps (``/proc/self/maps``; ``roots``: the spellings
    of ``root`` whose occurrence in the text makes it worth parsing). ``learn``: also add the
    ranges of the libraries mapped from outside ``root`` to ``KNOWN_RANGES``."""
    with open("/proc/self/maps", "rb") as maps:
        data = maps.read()
    mapped: Set[str] = set()
    # Hundreds of lines with torch loaded: parse only when a workspace path occurs, or to learn.
    if not learn and not any(r.encode() in data for r in roots):
        return mapped
    ranges: Dict[str, List[str]] = {}
    libraries: Set[str] = set()
    for line in data.decode(errors="replace").splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) != 6 or not fields[5].startswith("/"):
            continue
        path = fields[5]
        if _under(path, root):
            mapped.add(path)
        elif learn:
            ranges.setdefault(path, []).append(_range_name(fields[0]))
            if "x" in fields[1]:
                libraries.add(path)
    if learn and not mapped:
        for path in libraries:
            KNOWN_RANGES.update(ranges[path])
    return mapped


# Descriptors known to lead to no workspace file, by number: their identity (device, inode)
# when a check read their target (``/proc/self/fd/N``, a path lookup per descriptor) and found
# it outside the workspace. Only pipes, sockets, character devices and anonymous inodes (not
# regular files, directories or symbolic links) on another device than the workspace's: no
# workspace file can be one, and none can become one (a rename cannot cross a mount), so while
# number and identity stay the same the target need not be read again. A request's workers hold
# ~46 descriptors on an H200, nearly all of that kind (the GPU's device files, pipes, sockets).
KNOWN_DESCRIPTORS: Dict[int, Tuple[int, int]] = {}
_NEVER_KNOWN = (stat.S_IFREG, stat.S_IFDIR, stat.S_IFLNK)


def workspace_descriptors(root: str) -> List[str]:
    """This process's descriptors that lead into ``root``, as ``"fd -> path"``."""
    found: List[str] = []
    known = KNOWN_DESCRIPTORS
    root_device: Optional[int] = None
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            info = os.fstat(fd)
        except OSError:
            continue  # the listing's own descriptor, closed by now
        identity = (info.st_dev, info.st_ino)
        if known.get(fd) == identity:
            continue
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if _under(target, root):
            found.append(f"{fd} -> {target}")
            continue
        if stat.S_IFMT(info.st_mode) in _NEVER_KNOWN:
            continue
        if root_device is None:
            root_device = _device_of(root)
        if root_device >= 0 and info.st_dev != root_device and len(known) < 4096:
            known[fd] = identity
    return found


def _device_of(path: str) -> int:
    try:
        return os.stat(path).st_dev
    except OSError:
        return -1  # nothing is learned


class SandboxState:
    """Per-request state of a sandboxed, reused child: taken while the child waits for its next
    request (or at its start), checked in two parts: ``clean_and_check_process`` (imports,
    threads, audit hooks: what touches the program's objects or tells whether any of its code
    can still run; under the lease) and ``check_files`` (descriptors and mappings into the
    workspace: reads of ``/proc`` only, which need no lease once the first part passed;
    ``check_descriptors`` and ``check_mappings`` apart): the engine runs the first part before
    the request's outcome and the second right after it. ``clean_and_check`` runs both."""

    def __init__(self) -> None:
        self.sys_path = list(sys.path)
        # A module from the workspace can only be new, or a replaced entry. The modules
        # themselves (not their ids): an id can be reused once its module is gone.
        self.modules: Dict[str, Any] = dict(sys.modules)
        # The same, in order: when both lists compare equal (identity first, in C) nothing was
        # added or replaced, and the per-module scan is skipped (~10 us against ~90 for 1150).
        self.module_names = list(self.modules)
        self.module_values = list(self.modules.values())
        self.importer_keys = set(sys.path_importer_cache)
        self.threads = _native_threads()
        self.python_threads = {t.ident for t in threading.enumerate()}
        learn_first_mappings()
        self.workspace = ""
        self.roots: Tuple[str, ...] = ()

    def clean_and_check(self, workspace: str) -> Optional[str]:
        """Both parts: undo imports from ``workspace``, then describe what outlived the request
        (or None)."""
        problems = [self.clean_and_check_process(workspace), self.check_files()]
        return "; ".join(p for p in problems if p) or None

    def clean_and_check_process(self, workspace: str) -> Optional[str]:
        """Undo imports from ``workspace``; describe the threads and audit hooks that outlived
        the request (or None). When it finds none, no code of the program can run any more in
        this process (its signal handlers and interpreter hooks already went back)."""
        root, self.roots = workspace_root(workspace)
        self.workspace = root
        sys.path[:] = self.sys_path
        modules = sys.modules
        values, names = self.module_values, self.module_names
        imported = list(modules.values()) != values or list(modules) != names
        if imported:
            before = self.modules
            for name in [n for n, m in modules.items() if before.get(n) is not m]:
                module = modules.get(name)
                if module is not None and self._from_workspace(module):
                    del modules[name]
        roots = self.roots
        prefixes = tuple(r + "/" for r in roots)
        cache = sys.path_importer_cache
        for key in [k for k in cache if type(k) is str and (k in roots or k.startswith(prefixes))]:
            del cache[key]
        # With no module added or replaced and no new directory looked in, no finder can hold a
        # listing the request changed (the workspace's own are gone): nothing to invalidate.
        if imported or not self.importer_keys.issuperset(cache):
            importlib.invalidate_caches()

        problems: List[str] = []
        new_python = [
            t.name for t in threading.enumerate()
            if t.ident not in self.python_threads and t.is_alive()
        ]
        if new_python:
            problems.append("Python threads still running: " + ", ".join(sorted(new_python)))
        new_native = sorted(_native_threads() - self.threads)
        if new_native:
            names = [procs.comm(os.getpid(), tid) for tid in new_native]
            problems.append("native threads still running: " + ", ".join(names))
        if audit_hook_added():
            problems.append("an audit hook was added (sys.addaudithook); it cannot be removed")
        return "; ".join(problems) if problems else None

    def check_files(self) -> Optional[str]:
        """Describe the descriptors and mappings into the workspace of the last
        ``clean_and_check_process`` that outlived the request (or None)."""
        problems = [self.check_descriptors(), self.check_mappings()]
        return "; ".join(p for p in problems if p) or None

    def check_descriptors(self) -> Optional[str]:
        """Describe the descriptors into the workspace of the last ``clean_and_check_process``
        (or None)."""
        fds = workspace_descriptors(self.workspace)
        return "open files in the workspace: " + ", ".join(fds) if fds else None

    def check_mappings(self) -> Optional[str]:
        """Describe the workspace files of the last ``clean_and_check_process`` still mapped
        (or None). Also right after the answer, once the server has emptied the workspace: a
        mapping then reads ``/work/<name> (deleted)``, still under it."""
        mapped = self._new_mappings_under(self.workspace)
        return "workspace files still mapped: " + ", ".join(sorted(mapped)) if mapped else None

    def _new_mappings_under(self, root: str) -> Set[str]:
        """The files under ``root`` still mapped. When every file-backed range is one known to
        map none (``KNOWN_RANGES``), there is none, and the names (``/proc/self/maps``, a path
        per mapping) are not read."""
        now = file_mapping_ranges()
        if now is not None and now <= KNOWN_RANGES:
            return set()
        return mapped_under(root, self.roots, learn=now is not None)

    def _from_workspace(self, module: Any) -> bool:
        """Imported from the workspace (string checks only: no syscall per module)."""
        try:
            names = [getattr(module, "__file__", None)]
            names.extend(getattr(module, "__path__", None) or ())
        except Exception:
            return False
        for name in names:
            if not isinstance(name, str) or not name:
                continue
            if not name.startswith("/"):
                # Relative to the cwd at import time, which during a request is the workspace.
                if not name.startswith("<") and os.path.exists(os.path.join(self.workspace, name)):
                    return True
                continue
            if any(_under(name, root) for root in self.roots):
                return True
        return False
