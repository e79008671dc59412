"""Uploaded Python modules: exec in a fresh namespace, source seeded into ``linecache``."""

from __future__ import annotations

import hashlib
import linecache
from collections import OrderedDict
from typing import Any, Dict, List, Tuple

from .errors import ExecutionError


_COMPILED_MAX = 32


class LoadedPythonModule:
    """The handle of a module upload: its executed namespace (a plain dict, no ``__name__``)."""

    __slots__ = ("namespace",)

    def __init__(self, namespace: Dict[str, Any]) -> None:
        self.namespace = namespace

    def get_function(self, name: str) -> Any:
        try:
            return self.namespace[name]
        except KeyError:
            raise ExecutionError(
                "parse", f"the uploaded Python module defines no name {name!r}"
            ) from None


class ModuleLoader:
    """Executes module sources; remembers the linecache entries it seeded, to drop them later."""

    def __init__(self) -> None:
        self.seeded: List[str] = []
        # Code objects by source (immutable; each load still executes into a fresh namespace).
        self._compiled: "OrderedDict[str, Tuple[str, Any]]" = OrderedDict()

    def load(self, source: str) -> LoadedPythonModule:
        cached = self._compiled.get(source)
        if cached is None:
            digest = hashlib.sha1(source.encode("utf-8", "surrogatepass")).hexdigest()[:16]
            filename = f"<uploaded:{digest}>"
            code = None
        else:
            self._compiled.move_to_end(source)
            filename, code = cached
        # Kernels are re-read from source (inspect.getsource in Triton/TIRx): seed linecache.
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        self.seeded.append(filename)
        namespace: Dict[str, Any] = {}
        try:
            if code is None:
                code = compile(source, filename, "exec")
                self._compiled[source] = (filename, code)
                if len(self._compiled) > _COMPILED_MAX:
                    self._compiled.popitem(last=False)
            exec(code, namespace)
        except SyntaxError as exc:
            raise ExecutionError("parse", f"syntax error: {exc}") from exc
        except Exception as exc:
            raise ExecutionError("parse", f"{type(exc).__name__}: {exc}") from exc
        return LoadedPythonModule(namespace)

    def forget(self) -> None:
        for filename in self.seeded:
            linecache.cache.pop(filename, None)
        self.seeded.clear()
