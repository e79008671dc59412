"""Uploaded shared libraries, loaded through ``tvm_ffi`` when the worker has it."""

from __future__ import annotations

import os
import tempfile
from collections import OrderedDict
from typing import Any, Callable, List, Optional

from .errors import ExecutionError
from .files import copy_fd

MEMO_LIMIT = 32


class LoadedLibrary:
    """A request's view of a loaded TVM-FFI module."""

    __slots__ = ("module",)

    def __init__(self, module: Any) -> None:
        self.module = module

    def get_function(self, name: str) -> "LoadedFunction":
        try:
            exists = self.module.implements_function(name)
        except Exception as exc:
            raise ExecutionError("runtime", f"cannot inspect the uploaded library: {exc}") from exc
        if not exists:
            raise ExecutionError("compile", f"the uploaded library exports no function {name!r}")
        try:
            function = self.module.get_function(name)
        except Exception as exc:
            raise ExecutionError(
                "compile", f"cannot bind function {name!r} from the uploaded library: {exc}"
            ) from exc
        return LoadedFunction(self, function)


class LoadedFunction:
    """A library function that keeps its module mapped while it is reachable."""

    __slots__ = ("owner", "function")

    def __init__(self, owner: LoadedLibrary, function: Callable[..., Any]) -> None:
        self.owner = owner
        self.function = function

    def __call__(self, *args: Any) -> Any:
        return self.function(*args)


def tvm_ffi_available() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("tvm_ffi") is not None
    except (ImportError, ValueError):
        return False


class LibraryLoader:
    """dlopen via ``tvm_ffi.load_module``; a per-process memo of the last 32 libraries.

    The bytes go to a private temporary file that is unlinked right after loading.
    """

    def __init__(self, unavailable_message: Optional[str]) -> None:
        self._unavailable = unavailable_message
        self._memo: "OrderedDict[str, Any]" = OrderedDict()
        self.request_refs: List[LoadedLibrary] = []

    def load(self, blob_path: str, sha256: str, sandbox: bool, workspace: str) -> LoadedLibrary:
        if self._unavailable is not None:
            raise ExecutionError("unavailable", self._unavailable)
        import tvm_ffi

        module = self._memo.get(sha256)
        if module is not None:
            self._memo.move_to_end(sha256)
        else:
            module = self._load_new(tvm_ffi, blob_path, sha256, sandbox, workspace)
            self._memo[sha256] = module
            if len(self._memo) > MEMO_LIMIT:
                self._memo.popitem(last=False)
        library = LoadedLibrary(module)
        self.request_refs.append(library)
        return library

    @staticmethod
    def _load_new(tvm_ffi: Any, blob_path: str, sha256: str, sandbox: bool, workspace: str) -> Any:
        base = os.path.join(workspace, ".kcoral", "libraries") if sandbox else None
        if base is not None:
            os.makedirs(base, 0o700, exist_ok=True)
        directory = tempfile.mkdtemp(prefix="kcoral-lib-", dir=base)
        path = os.path.join(directory, f"{sha256}.so")
        try:
            out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o700)
            try:
                src = os.open(blob_path, os.O_RDONLY | os.O_CLOEXEC)
                try:
                    copy_fd(src, out, os.fstat(src).st_size)
                finally:
                    os.close(src)
            finally:
                os.close(out)
            try:
                if sandbox:
                    return tvm_ffi.load_module(path, keep_module_alive=False)
                return tvm_ffi.load_module(path)
            except Exception as exc:
                raise ExecutionError("compile", f"cannot load the uploaded library: {exc}") from exc
        finally:
            try:
                os.unlink(path)  # the mapping outlives the file
            except OSError:
                pass
            try:
                os.rmdir(directory)
            except OSError:
                pass

    def end_request(self, sandbox: bool) -> None:
        self.request_refs.clear()
        if sandbox:
            self._memo.clear()  # no uploaded mapping may outlive a sandboxed request
