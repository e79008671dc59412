"""``kcoral.errors`` for uploaded code (see the package docstring).

The execution errors are ``kcoral_runtime``'s own classes: an instruction that raises
``ExecutionError(kind, message)`` fails with that ``kind`` and ``message`` on the wire. The
client-side errors exist so that code importing them by name keeps working on a worker; nothing
on the worker raises them.
"""

from __future__ import annotations

from typing import Optional

from kcoral_runtime.errors import ExecutionError, GPUAccessViolation, ValidationError

__all__ = [
    "ExecutionError",
    "GPUAccessViolation",
    "KCoralError",
    "ProtocolError",
    "TransportError",
    "ValidationError",
]


class KCoralError(Exception):
    """An HTTP error answer from a server (client side): ``"HTTP <status>: <message>"``."""

    def __init__(
        self,
        status_code: int,
        message: str,
        *,
        kind: Optional[str] = None,
        request_id: Optional[str] = None,
    ) -> None:
        super().__init__(f"HTTP {status_code}: {message}")
        self.status_code = status_code
        self.message = message
        self.kind = kind
        self.request_id = request_id


class TransportError(Exception):
    """A connection or transfer failure (client side)."""


class ProtocolError(Exception):
    """An answer that breaks the protocol (client side)."""
