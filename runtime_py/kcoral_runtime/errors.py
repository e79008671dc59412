"""Errors with a wire ``kind`` (spec protocol §3.4)."""

from __future__ import annotations

KINDS = frozenset(
    {"parse", "compile", "runtime", "gpu_access", "correctness", "serialization", "unavailable", "engine"}
)


class ExecutionError(Exception):
    """An instruction failure that keeps its kind on the wire.

    Uploaded code may raise it too (e.g. ``ExecutionError("correctness", "...")``).
    """

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind if kind in KINDS else "engine"
        self.message = message


class GPUAccessViolation(ExecutionError):
    """A ``cpu_only`` call entered the CUDA API (raised by the CUPTI guard)."""

    def __init__(self, cuda_call: str, location: str, call_stack: str, detected_at_ns: int) -> None:
        super().__init__(
            "gpu_access", f"cpu_only function called {cuda_call} at {location}"
        )
        self.cuda_call = cuda_call
        self.location = location
        self.call_stack = call_stack
        self.detected_at_ns = detected_at_ns


class ValidationError(ValueError):
    """A path or value that breaks a protocol rule."""


def foreign_execution_error_kind(exc: BaseException) -> "str | None":
    """The wire kind of an ``ExecutionError`` from a real ``kcoral`` installation, else None.

    Uploaded code written for upstream raises ``kcoral.errors.ExecutionError``. On our workers
    that module is normally our compatibility package (the same class as ours), but a worker
    environment may have the real package installed, whose class is a different object: it is
    recognized by its module and name, and keeps its kind as it would upstream.
    """
    for cls in type(exc).__mro__:
        if cls.__module__ == "kcoral.errors" and cls.__name__ == "ExecutionError":
            kind = getattr(exc, "kind", None)
            return kind if kind in KINDS else "engine"
    return None
