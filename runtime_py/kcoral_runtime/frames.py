"""The frames between the server, a slot's zygote and its children, as named types.

The same frames are declared on the server side in ``server/workers/worker_protocol.ts``; both
follow the tables of docs/architecture.md §3.1 (a test on each side keeps them in step)::

    server --Fork/Kill/Shutdown/Workspace--> zygote --fork()--> child
    server --Init/Run/LeaseGranted--> zygote --relay--> child
    server <--Hello/Forked/Exited/Error-- zygote
    server <--relay (+"c", "child": true)-- zygote <--Ready/InitFailed/Instr/Lease/Outcome/Clean-- child

A frame is a plain ``dict`` (the ``TypedDict`` constructors build one), encoded as JSON behind a
4-byte length (``ipc.py``).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, TypedDict

# Optional keys live in a ``total=False`` subclass (``NotRequired`` needs Python 3.11; the
# runtime runs on 3.9+ with the standard library only).


# ---------------------------------------------------------------- server -> zygote


class Fork(TypedDict):
    t: str  # "fork"
    c: int
    env: Dict[str, str]
    unset: List[str]
    max_requests: int


class Kill(TypedDict):
    t: str  # "kill"
    c: int
    grace: float


class Shutdown(TypedDict):
    t: str  # "shutdown"


class Workspace(TypedDict):
    t: str  # "workspace"
    name: str


# ---------------------------------------------------------------- server -> child (relayed)


class _InitRequired(TypedDict):
    t: str  # "init"
    c: int


class Init(_InitRequired, total=False):
    context: bool  # False: learn the devices only, the context comes with the first lease


class _RunRequired(TypedDict):
    request_id: str
    program: bytes  # the frame's tail (ipc.py), not a member of its JSON
    blobs: Dict[str, str]
    workspace: str
    results: str
    output_limit_bytes: int
    max_return_bytes: int
    sandbox: bool


class RunRequest(_RunRequired, total=False):
    lease_held: bool
    reply_before_reset: bool
    keep_min_bytes: int  # X-KCoral-Keep-Returns: binary returns of this size or more are kept
    keep_max_bytes: int  # ... while the kept ones total at most this (the cache's share)


class Run(TypedDict):
    t: str  # "run"
    c: int
    req: RunRequest


class LeaseGranted(TypedDict):
    t: str  # "lease"
    c: int
    a: str  # "granted"


# ---------------------------------------------------------------- zygote -> server


class _HelloRequired(TypedDict):
    t: str  # "hello"
    pid: int
    python: str
    versions: Dict[str, str]
    mode: str
    monotonic_ns: int


class Hello(_HelloRequired, total=False):
    sim_devices: int


class Forked(TypedDict):
    t: str  # "forked"
    c: int
    pid: int
    monotonic_ns: int


class _ExitedRequired(TypedDict):
    t: str  # "exited"
    c: int
    code: Optional[int]
    signal: Optional[int]
    orphans: bool


class Exited(_ExitedRequired, total=False):
    instr: int  # the instruction the child last started in its current request (``progress``)


class ZygoteFailed(TypedDict):
    t: str  # "error"
    message: str


# ---------------------------------------------------------------- child -> server (relayed)


class _ReadyRequired(TypedDict):
    t: str  # "ready"
    target: Dict[str, str]
    versions: Dict[str, str]
    device_uuids: List[str]


class Ready(_ReadyRequired, total=False):
    context: str  # GPU and simulated workers: "created" | "deferred"


class InitFailed(TypedDict):
    t: str  # "init_failed"
    message: str
    traceback: str


class Instr(TypedDict):
    t: str  # "instr"
    i: int


class Lease(TypedDict):
    t: str  # "lease"
    a: str  # "acquire" | "release"


class OutcomeFile(TypedDict):
    path: str
    size: int


class OutcomePart(OutcomeFile):
    sha256: str


class _WorkerOutcomeRequired(TypedDict):
    status: str  # "COMPLETED" | "FAILED"
    results: Optional[str]
    error: Optional[Dict[str, Any]]
    parts: List[OutcomePart]
    stdout: Optional[OutcomeFile]
    stderr: Optional[OutcomeFile]
    gpu_access: Optional[Dict[str, Any]]
    boundary: str


class WorkerOutcome(_WorkerOutcomeRequired, total=False):
    results_file: OutcomeFile
    too_large: int
    gpu_receipt: Dict[str, Any]  # the request held the lease (gpu_receipt.py)


class _OutcomeRequired(TypedDict):
    t: str  # "outcome"
    outcome: WorkerOutcome
    retire: Optional[str]


class Outcome(_OutcomeRequired, total=False):
    cleanup: bool
    retire_detail: str


class _CleanRequired(TypedDict):
    t: str  # "clean"
    retire: Optional[str]


class Clean(_CleanRequired, total=False):
    retire_detail: str


#: Every frame type, by who sends it (the tables of docs/architecture.md §3.1).
FRAME_TYPES: Dict[str, Dict[str, type]] = {
    "zygote_commands": {"fork": Fork, "kill": Kill, "shutdown": Shutdown, "workspace": Workspace},
    "child_commands": {"init": Init, "run": Run, "lease": LeaseGranted},
    "zygote_reports": {"hello": Hello, "forked": Forked, "exited": Exited, "error": ZygoteFailed},
    "child_reports": {
        "ready": Ready,
        "init_failed": InitFailed,
        "instr": Instr,
        "lease": Lease,
        "outcome": Outcome,
        "clean": Clean,
    },
}
