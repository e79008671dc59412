"""The frame types of ``frames.py`` are exactly those of the tables in docs/architecture.md §3.1
(server/workers/worker_protocol_test.ts checks the server side against the same tables), and every
key a documented frame shows is a key of its type."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Dict, List

RUNTIME_DIR = Path(__file__).resolve().parents[1]
if str(RUNTIME_DIR) not in sys.path:
    sys.path.insert(0, str(RUNTIME_DIR))

from kcoral_runtime.frames import FRAME_TYPES  # noqa: E402

DOC = RUNTIME_DIR.parent / "docs" / "architecture.md"
TABLES = {
    "Server → zygote": "zygote_commands",
    "Server → child": "child_commands",
    "Zygote → server": "zygote_reports",
    "Child → server": "child_reports",
}


def _documented() -> Dict[str, List[List[str]]]:
    """Per table: each row's frame type and the keys its example shows."""
    tables: Dict[str, List[List[str]]] = {}
    current = None
    for line in DOC.read_text().splitlines():
        heading = next((name for name in TABLES if line.startswith(name)), None)
        if heading:
            current = TABLES[heading]
            tables[current] = []
            continue
        row = re.match(r'^\| `(\{"t":"([a-z_]+)".*?\})`', line)
        if row and current:
            keys = re.findall(r'"([a-z_]+)":', row.group(1))
            tables[current].append([row.group(2)] + keys)
        elif current and line.strip() and not line.startswith("|"):
            current = None
    return tables


def test_frame_types_are_the_documented_ones() -> None:
    documented = _documented()
    for direction, types in FRAME_TYPES.items():
        names = list(dict.fromkeys(row[0] for row in documented[direction]))
        assert names == list(types), direction


def test_documented_keys_belong_to_their_types() -> None:
    for direction, rows in _documented().items():
        for row in rows:
            frame_type = FRAME_TYPES[direction][row[0]]
            keys = set(frame_type.__required_keys__) | set(frame_type.__optional_keys__)
            # "c" is the zygote's tag on relayed frames ("child": true too).
            missing = set(row[1:]) - keys - {"c", "child"}
            assert not missing, f"{direction} {row[0]}: {missing}"
