"""Workspace path rules (spec protocol §2.6)."""

from __future__ import annotations

from typing import Any

from .errors import ValidationError

RESERVED_SANDBOX_DIR = ".kcoral"


def normalize_file_path(value: Any) -> str:
    """Validate and canonicalize a workspace-relative POSIX path.

    ``..`` is rejected before normalization, so ``a/../b`` never becomes ``b``.
    """
    if not isinstance(value, str) or not value:
        raise ValidationError("filesystem 'path' must be a non-empty string")
    if "\x00" in value:
        raise ValidationError("filesystem 'path' must not contain NUL")
    if "\\" in value:
        raise ValidationError("filesystem 'path' must use POSIX '/' separators")
    if value.startswith("/"):
        raise ValidationError("filesystem 'path' must be relative")
    raw_parts = value.split("/")
    if ".." in raw_parts:
        raise ValidationError("filesystem 'path' must not contain a '..' component")
    parts = [part for part in raw_parts if part not in ("", ".")]
    if not parts:
        raise ValidationError("filesystem 'path' must name a file or folder")
    for part in parts:
        if len(part.encode("utf-8")) > 255:
            raise ValidationError("filesystem 'path' contains a component longer than 255 bytes")
    normalized = "/".join(parts)
    if len(normalized.encode("utf-8")) > 4096:
        raise ValidationError("filesystem 'path' is longer than 4096 bytes")
    return normalized
