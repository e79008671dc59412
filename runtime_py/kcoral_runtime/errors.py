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
            "gpu_access", f"cpu_only function called CUDA API {cuda_call} at {location}"
        )
        self.cuda_call = cuda_call
        self.location = location
        self.call_stack = call_stack
        self.detected_at_ns = detected_at_ns


class ValidationError(ValueError):
    """A path or value that breaks a protocol rule."""
