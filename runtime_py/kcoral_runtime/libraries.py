"""Uploaded shared libraries (``upload kind=library``).

Two loaders, chosen once per process at the first library upload:

* ``tvm_ffi``: when the ``tvm_ffi`` package is importable, exactly as upstream
  (``tvm_ffi.load_module``; functions exported with ``TVM_FFI_DLL_EXPORT_TYPED_FUNC``).
* ``c``: otherwise, the plain C ABI of ``docs/c-abi.md`` (``cabi.load_library``; functions are
  ``extern "C" int name(...)``).

``KCORAL_LIBRARY_ABI=c`` forces the plain C ABI even where ``tvm_ffi`` is importable;
``KCORAL_LIBRARY_ABI=tvm_ffi`` forces ``tvm_ffi`` (an upload then fails ``unavailable`` if it is
missing). Unset or ``auto``: as above.

Either way the bytes go to a private temporary file (``<workspace>/.kcoral/libraries`` in the
sandbox) that is unlinked right after loading, and a per-process memo keyed by SHA-256 keeps the
last ``MEMO_LIMIT`` loaded libraries. A plain-C-ABI library leaving the memo is ``dlclose``d at
the end of the request (after the drain synchronized the devices); in sandbox mode every one is,
and the memo is emptied, so no uploaded mapping outlives a sandboxed request.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections import OrderedDict
from typing import Any, Callable, List, Optional, Union

from . import cabi
from .errors import ExecutionError
from .files import copy_blob_into

MEMO_LIMIT = 32
ABI_ENV = "KCORAL_LIBRARY_ABI"
ABI_CHOICES = ("auto", "c", "tvm_ffi")


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


LibraryHandle = Union[LoadedLibrary, cabi.CLibrary]


def tvm_ffi_available() -> bool:
    import importlib.util

    if sys.modules.get("tvm_ffi") is not None:
        return True
    try:
        return importlib.util.find_spec("tvm_ffi") is not None
    except (ImportError, ValueError):
        return False


def _import_tvm_ffi() -> Optional[Any]:
    """The ``tvm_ffi`` module, or None when it is missing or fails to import."""
    module = sys.modules.get("tvm_ffi")
    if module is not None:
        return module
    if not tvm_ffi_available():
        return None
    try:
        import tvm_ffi
    except Exception:
        return None
    return tvm_ffi


def choose_abi() -> str:
    """``"tvm_ffi"`` or ``"c"`` for this process (``$KCORAL_LIBRARY_ABI``, then availability)."""
    wanted = (os.environ.get(ABI_ENV) or "auto").strip().lower()
    if wanted not in ABI_CHOICES:
        raise ExecutionError(
            "engine", f"{ABI_ENV}={wanted!r} is not one of {', '.join(ABI_CHOICES)}"
        )
    if wanted == "auto":
        return "tvm_ffi" if _import_tvm_ffi() is not None else "c"
    return wanted


class LibraryLoader:
    """Loads uploaded libraries (see the module docstring) and memoizes them by SHA-256.

    ``unavailable_message``: when set, every upload fails ``unavailable`` with it.
    """

    def __init__(self, unavailable_message: Optional[str] = None) -> None:
        self._unavailable = unavailable_message
        self._memo: "OrderedDict[str, Any]" = OrderedDict()
        self._evicted: List[cabi.CLibrary] = []
        self._abi: Optional[str] = None
        self._tvm_ffi: Any = None
        self.request_refs: List[LibraryHandle] = []

    @property
    def abi(self) -> str:
        """``"tvm_ffi"`` or ``"c"`` (decided at the first call, then fixed)."""
        if self._abi is None:
            abi = choose_abi()
            if abi == "tvm_ffi":
                self._tvm_ffi = _import_tvm_ffi()
            self._abi = abi
        return self._abi

    def load(self, blob_path: str, sha256: str, sandbox: bool, workspace: str) -> LibraryHandle:
        if self._unavailable is not None:
            raise ExecutionError("unavailable", self._unavailable)
        abi = self.abi
        if abi == "tvm_ffi" and self._tvm_ffi is None:
            raise ExecutionError(
                "unavailable", f"{ABI_ENV}=tvm_ffi but tvm_ffi cannot be imported on this worker"
            )
        loaded = self._memo.get(sha256)
        if loaded is not None and not (isinstance(loaded, cabi.CLibrary) and loaded.closed):
            self._memo.move_to_end(sha256)
        else:
            loaded = self._load_new(blob_path, sha256, sandbox, workspace)
            self._memo[sha256] = loaded
            while len(self._memo) > MEMO_LIMIT:
                _, old = self._memo.popitem(last=False)
                if isinstance(old, cabi.CLibrary):
                    self._evicted.append(old)  # closed at end_request, after the drain
        handle: LibraryHandle = LoadedLibrary(loaded) if abi == "tvm_ffi" else loaded
        self.request_refs.append(handle)
        return handle

    def _open(self, path: str, sandbox: bool) -> Any:
        if self._abi == "c":
            return cabi.load_library(path)  # ExecutionError("compile", "cannot load library: ...")
        try:
            if sandbox:
                return self._tvm_ffi.load_module(path, keep_module_alive=False)
            return self._tvm_ffi.load_module(path)
        except Exception as exc:
            raise ExecutionError("compile", f"cannot load the uploaded library: {exc}") from exc

    def _load_new(self, blob_path: str, sha256: str, sandbox: bool, workspace: str) -> Any:
        base = os.path.join(workspace, ".kcoral", "libraries") if sandbox else None
        if base is not None:
            os.makedirs(base, 0o700, exist_ok=True)
        directory = tempfile.mkdtemp(prefix="kcoral-lib-", dir=base)
        path = os.path.join(directory, f"{sha256}.so")
        try:
            out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o700)
            try:
                copy_blob_into(blob_path, out)
            finally:
                os.close(out)
            return self._open(path, sandbox)
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
        """After the drain: drop the request's handles, ``dlclose`` what left the memo.

        In sandbox mode every memoized plain-C-ABI library is closed and the memo emptied (no
        uploaded mapping may outlive a sandboxed request).
        """
        self.request_refs.clear()
        closing = self._evicted
        self._evicted = []
        if sandbox:
            closing.extend(v for v in self._memo.values() if isinstance(v, cabi.CLibrary))
            self._memo.clear()
        for library in closing:
            library.close()

    def memoized(self) -> List[str]:
        """The SHA-256 keys in the memo, least recently used first (tests, diagnostics)."""
        return list(self._memo)
