"""Workspace files: blob reads, file materialization, file/folder return collection.

Nothing here follows a symbolic link inside the workspace: paths are walked component by
component with directory fds and ``O_NOFOLLOW`` (spec protocol §2.4, server §4.2).
"""

from __future__ import annotations

import os
import stat
from typing import Any, Dict, Iterator, List, Tuple

from . import huge_pages
from .errors import ExecutionError, ValidationError
from .paths import RESERVED_SANDBOX_DIR, normalize_file_path
from .values import Part, PartStore, Staged

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _CLOEXEC
_NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | _CLOEXEC


# --------------------------------------------------------------------------- blobs


def read_blob_bytes(path: str) -> bytes:
    """The whole blob as ``bytes`` (one copy: page cache -> the bytes object, a large one on
    huge pages: ``huge_pages.py``)."""
    with open(path, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        made = huge_pages.new_bytes(size)
        if made is None:
            return f.readall()
        data, view = made
        got = 0
        while got < size:
            n = f.readinto(view[got:])
            if not n:
                raise OSError(f"blob {path} is shorter than its {size} bytes")
            got += n
        view.release()
        return data


def copy_blob_into(blob_path: str, dst: int) -> None:
    """Copy the whole blob file at ``blob_path`` into the open file ``dst``."""
    src = os.open(blob_path, os.O_RDONLY | _CLOEXEC)
    try:
        copy_fd(src, dst, os.fstat(src).st_size)
    finally:
        os.close(src)


def copy_fd(src: int, dst: int, nbytes: int) -> None:
    """Copy ``nbytes`` in the kernel where possible (sendfile), else through a buffer."""
    offset = 0
    try:
        while offset < nbytes:
            sent = os.sendfile(dst, src, offset, min(nbytes - offset, 1 << 30))
            if sent == 0:
                raise OSError("blob is shorter than its size")
            offset += sent
        return
    except OSError as exc:
        if offset or getattr(exc, "errno", None) is None:
            raise
    os.lseek(src, 0, os.SEEK_SET)
    buf = bytearray(min(nbytes, 1 << 20) or 1)
    with memoryview(buf) as view:
        while offset < nbytes:
            got = os.readv(src, [view[: min(len(buf), nbytes - offset)]])
            if got == 0:
                raise OSError("blob is shorter than its size")
            chunk = view[:got]
            while chunk:
                chunk = chunk[os.write(dst, chunk) :]
            offset += got


# --------------------------------------------------------------------------- upload


def _walk_parents(root_fd: int, parts: List[str], create: bool) -> List[int]:
    """Open (creating with 0700 if asked) each directory below ``root_fd``; returns the fds."""
    fds: List[int] = []
    parent = root_fd
    try:
        for part in parts:
            if create:
                try:
                    os.mkdir(part, 0o700, dir_fd=parent)
                except FileExistsError:
                    pass
            parent = os.open(part, DIR_FLAGS, dir_fd=parent)
            fds.append(parent)
    except BaseException:
        for fd in reversed(fds):
            os.close(fd)
        raise
    return fds


def materialize_file(workspace: str, path: Any, blob_path: str, sandbox: bool) -> str:
    """Write a blob to ``workspace/path`` (0600, O_EXCL|O_NOFOLLOW). Returns the normalized path."""
    shown = path
    try:
        normalized = normalize_file_path(path)
        shown = normalized
        parts = normalized.split("/")
        if sandbox and parts[0] == RESERVED_SANDBOX_DIR:
            raise ValidationError(
                f"{RESERVED_SANDBOX_DIR!r} is reserved for sandbox runtime files"
            )
        root = os.open(workspace, DIR_FLAGS)
        try:
            fds = _walk_parents(root, parts[:-1], create=True)
            try:
                parent = fds[-1] if fds else root
                out = os.open(parts[-1], _NEW_FILE_FLAGS, 0o600, dir_fd=parent)
                try:
                    copy_blob_into(blob_path, out)
                finally:
                    os.close(out)
            finally:
                for fd in reversed(fds):
                    os.close(fd)
        finally:
            os.close(root)
    except Exception as exc:
        raise ExecutionError(
            "runtime", f"cannot materialize file {shown!r}: {type(exc).__name__}: {exc}"
        ) from exc
    return normalized


# --------------------------------------------------------------------------- return


def _stage_file(store: PartStore, parent_fd: int, name: str, budget: int) -> Staged:
    """Snapshot one regular file into a staged part; refuses anything that changes meanwhile."""
    fd = os.open(name, _READ_FLAGS, dir_fd=parent_fd)
    try:
        before = os.fstat(fd)
        if not stat.S_ISREG(before.st_mode):
            raise ValueError(f"file return requires a regular file: {name!r}")
        if before.st_size > budget:
            raise ValueError("file return exceeds max_response_bytes binary budget")
        staged, copied = store.stage_from_fd(fd, before.st_size)
        try:
            after = os.fstat(fd)
            if (
                copied != before.st_size
                or after.st_size != before.st_size
                or after.st_mtime_ns != before.st_mtime_ns
                or after.st_ctime_ns != before.st_ctime_ns
            ):
                raise ValueError(f"file changed while reading: {name!r}")
        except BaseException:
            store.discard(staged)
            raise
        return staged
    finally:
        os.close(fd)


def _file_node(index: int, part: Part) -> Dict[str, Any]:
    return {"type": "file", "part": f"return:{index}", "sha256": part.sha256, "size": part.size}


def _scan_folder(
    store: PartStore, root_fd: int, budget: int, staged: List[Tuple[str, Staged]]
) -> List[str]:
    """Walk a folder (no link following), staging every file; returns the directory list."""
    directories: List[str] = []
    seen = set()
    stack: List[Tuple[int, Iterator[os.DirEntry], str]] = []

    def enter(fd: int, relative: str) -> None:
        try:
            info = os.fstat(fd)
            identity = (info.st_dev, info.st_ino)
            if identity in seen:
                raise ValueError("file return encountered a repeated directory")
            seen.add(identity)
            stack.append((fd, os.scandir(fd), relative))
        except BaseException:
            os.close(fd)
            raise

    enter(root_fd, "")
    try:
        while stack:
            parent_fd, entries, relative = stack[-1]
            entry = next(entries, None)
            if entry is None:
                entries.close()  # type: ignore[attr-defined]
                os.close(parent_fd)
                stack.pop()
                continue
            name = normalize_file_path(f"{relative}/{entry.name}" if relative else entry.name)
            mode = entry.stat(follow_symlinks=False).st_mode
            if stat.S_ISDIR(mode):
                directories.append(name)
                enter(os.open(entry.name, DIR_FLAGS, dir_fd=parent_fd), name)
            elif stat.S_ISREG(mode):
                item = _stage_file(store, parent_fd, entry.name, budget)
                staged.append((name, item))
                budget -= item.size
            else:
                raise ValueError(f"file return rejects symbolic links and special files: {name!r}")
    finally:
        for fd, entries, _ in reversed(stack):
            entries.close()  # type: ignore[attr-defined]
            os.close(fd)
    return directories


def collect(store: PartStore, workspace: str, path: Any, kind: str, budget: int) -> Dict[str, Any]:
    """Encode a file or folder return rooted at ``workspace`` (never the current directory)."""
    parent, _, name = normalize_file_path(path).rpartition("/")
    root = os.open(workspace, DIR_FLAGS)
    try:
        fds = _walk_parents(root, parent.split("/") if parent else [], create=False)
        try:
            parent_fd = fds[-1] if fds else root
            if kind == "file":
                item = _stage_file(store, parent_fd, name, budget)
                try:
                    index, part = store.commit(item)
                except BaseException:
                    store.discard(item)
                    raise
                return _file_node(index, part)
            folder_fd = os.open(name, DIR_FLAGS, dir_fd=parent_fd)
        finally:
            for fd in reversed(fds):
                os.close(fd)
    finally:
        os.close(root)

    staged: List[Tuple[str, Staged]] = []
    committed = 0
    try:
        directories = _scan_folder(store, folder_fd, budget, staged)
        staged.sort(key=lambda item: item[0])  # parts are numbered in sorted path order
        files: Dict[str, Dict[str, Any]] = {}
        for name, item in staged:
            index, part = store.commit(item)
            committed += 1
            files[name] = _file_node(index, part)
    finally:
        for _, item in staged[committed:]:
            store.discard(item)
    return {"type": "folder", "files": files, "directories": sorted(directories)}
