"""Recognises the ``kcoral run`` runner and tool definitions among uploaded module sources.

``kcoral run`` (and the MCP ``run_python`` and ``profile`` tools) upload the files of
``kcoral_runtime/tools`` as module sources, unchanged. A module whose text is exactly one of
this runtime's own files is code the worker knows: its top-level code only imports the standard
library, and its functions start processes and copy files, never calling CUDA in the worker's
process. The engine uses that to leave the lease to the processes a tool starts (``gate.py``):

* ``runner`` -- ``tools/runner.py``;
* ``gated`` -- ``tools/python.py`` and ``tools/shell.py``: their processes take the lease at
  their first CUDA call;
* ``whole_run`` -- ``tools/ncu.py``, ``tools/compute_sanitizer.py``, ``tools/run_iket.py``:
  profilers that put their own injection library in ``CUDA_INJECTION64_PATH``; their run keeps
  the lease from start to end, as every run did before the gate.

A source that differs by one byte (another version's client, upstream's) is not recognised, and
its run holds the lease for its whole life.
"""

from __future__ import annotations

import hashlib
import os
from typing import Dict, Optional

RUNNER = "runner"
GATED = "gated"
WHOLE_RUN = "whole_run"

_ROLES = {
    "runner.py": RUNNER,
    "python.py": GATED,
    "shell.py": GATED,
    "ncu.py": WHOLE_RUN,
    "compute_sanitizer.py": WHOLE_RUN,
    "run_iket.py": WHOLE_RUN,
}

_known: Optional[Dict[str, str]] = None


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def known() -> Dict[str, str]:
    """SHA-256 of each tool file's text -> its role (read once, from this package)."""
    global _known
    if _known is None:
        found: Dict[str, str] = {}
        directory = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tools")
        for name, role in _ROLES.items():
            try:
                with open(os.path.join(directory, name), "r", encoding="utf-8", newline="") as f:
                    found[_digest(f.read())] = role
            except OSError:
                pass
        _known = found
    return _known


def role_of(source: object) -> Optional[str]:
    """The role of an uploaded module's ``source``, or ``None`` for any other module."""
    if not isinstance(source, str):
        return None
    return known().get(_digest(source))
