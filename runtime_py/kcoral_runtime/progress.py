"""Which instruction a child is running, told to its zygote through a shared page.

A crash inside an instruction is answered with that instruction's index (spec server §12: 200
FAILED, not 500). The child writes the index into a page it shares with the zygote (an anonymous
``MAP_SHARED`` mapping made before the fork) as it starts each instruction, and -1 as it takes a
request and as it answers one; when the child is gone the zygote reads it and puts it in
``exited``. One 8-byte store
per instruction, where a frame per instruction cost a wake-up of the zygote and of the server::

    zygote: page = new_page() ──fork──▶ child: start(page) … mark(page, k) … (crash)
    zygote: reaps the child ──▶ exited {"instr": read(page)}
"""

from __future__ import annotations

import mmap
import struct
from typing import Optional

_INDEX = struct.Struct("<q")
NONE = -1


def new_page() -> mmap.mmap:
    """A page shared with the children forked after it is made, holding "no instruction"."""
    page = mmap.mmap(-1, _INDEX.size)  # MAP_SHARED | MAP_ANONYMOUS
    _INDEX.pack_into(page, 0, NONE)
    return page


def mark(page: mmap.mmap, index: int) -> None:
    """The child starts instruction ``index`` (``NONE``: it takes a new request)."""
    _INDEX.pack_into(page, 0, index)


def read(page: mmap.mmap) -> Optional[int]:
    """The instruction the child last started, or None (none in its current request)."""
    index = _INDEX.unpack_from(page, 0)[0]
    return index if index >= 0 else None
