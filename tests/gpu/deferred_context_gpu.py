"""GPU check of deferred worker contexts (issue 41 item 4) with the real CUDA driver.

This process plays the server for a real GPU zygote given the gate's shim (``KCORAL_GATE_LIB``):
it forks fresh children, sends ``init`` with or without ``"context": false``, grants every lease
the children ask for, and reads ``nvidia-smi`` for the processes that hold a context. Checks:

* ``devices``: a deferred child reports the same target and device UUIDs as an eager one, and
  holds no context while the eager one does;
* ``script``: a ``kcoral run python`` request on a deferred child (torch, a GEMM on the GPU in
  the script's process) completes; the child's lease frames are the script process's hold only
  (no drain after it) and the child itself holds no context when the script is granted;
* ``program``: a program that uses torch in the worker runs on a deferred child: no context
  before its first instruction's grant, its result right (the context was created under the
  lease, and the worker's own driver did not load the gate's library);
* ``cpu_only_first``: a ``cpu_only`` run first in a deferred child (the CUDA guard) completes.

Prints ``PASS``/``FAIL`` per check, the eager and deferred ``init`` times, and ``RESULT: n/m
passed``; exit status 0 when all passed.

    python3 tests/gpu/deferred_context_gpu.py      # from the project root, on the GPU machine
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parents[2]
RUNTIME = ROOT / "runtime_py"
sys.path.insert(0, str(RUNTIME))

from kcoral_runtime import gate_shim  # noqa: E402
from kcoral_runtime.ipc import FrameDecoder, encode, split_tail  # noqa: E402

TOOLS = RUNTIME / "kcoral_runtime" / "tools"
WAIT = 120.0
SCRIPT = """import torch
a = torch.randn(2048, 2048, device="cuda")
b = a @ a
torch.cuda.synchronize()
print("gemm", float(b.abs().sum()) > 0)
"""
PROGRAM_MODULE = """import torch
def gemm():
    x = torch.ones(256, 256, device="cuda")
    return float((x @ x)[0, 0].item())
"""


class Zygote:
    """A GPU zygote over its pipes; every frame it sends is kept, every lease asked is granted."""

    def __init__(self, shim: str) -> None:
        env = {**os.environ, "KCORAL_GATE_LIB": shim, "PYTHONPATH": str(RUNTIME)}
        self.proc = subprocess.Popen([sys.executable, "-m", "kcoral_runtime.zygote", "--mode", "gpu"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                                     start_new_session=True)
        self.frames: List[Dict[str, Any]] = []
        self.cond = threading.Condition()
        self.before_grant: Callable[[Dict[str, Any]], None] = lambda frame: None
        self._lock = threading.Lock()
        self._next = 0
        threading.Thread(target=self._read, daemon=True).start()
        hello = self.wait(lambda f: f["t"] in ("hello", "error"))
        assert hello["t"] == "hello", hello

    def _read(self) -> None:
        decoder = FrameDecoder()
        while True:
            data = os.read(self.proc.stdout.fileno(), 1 << 16)
            if not data:
                with self.cond:
                    self.cond.notify_all()
                return
            for payload in decoder.feed(data):
                frame = json.loads(split_tail(payload)[0])
                if frame.get("t") == "lease" and frame.get("a") == "acquire":
                    threading.Thread(target=self._grant, args=(frame,), daemon=True).start()
                with self.cond:
                    self.frames.append(frame)
                    self.cond.notify_all()

    def _grant(self, frame: Dict[str, Any]) -> None:
        self.before_grant(frame)
        self.send({"t": "lease", "c": frame["c"], "a": "granted"})

    def send(self, obj: Dict[str, Any], tail: Optional[bytes] = None) -> None:
        with self._lock:
            self.proc.stdin.write(encode(obj, tail))
            self.proc.stdin.flush()

    def wait(self, match: Callable[[Dict[str, Any]], bool], start: int = 0) -> Dict[str, Any]:
        deadline = time.monotonic() + WAIT
        with self.cond:
            while True:
                for frame in self.frames[start:]:
                    if match(frame):
                        return frame
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    raise AssertionError(f"no such frame; last: {self.frames[-5:]}")
                self.cond.wait(left)

    def child(self, defer: bool) -> Tuple[int, int, Dict[str, Any], float]:
        """Forks a fresh child and initializes it: (c, pid, ready frame, init seconds)."""
        self._next += 1
        c = self._next
        start = len(self.frames)
        self.send({"t": "fork", "c": c, "env": {}, "unset": [], "max_requests": 1})
        pid = self.wait(lambda f: f["t"] == "forked" and f.get("c") == c, start)["pid"]
        began = time.perf_counter()
        self.send({"t": "init", "c": c, **({"context": False} if defer else {})})
        ready = self.wait(lambda f: f.get("c") == c and f["t"] in ("ready", "init_failed"), start)
        assert ready["t"] == "ready", ready
        return c, pid, ready, time.perf_counter() - began

    def run(self, c: int, req: Dict[str, Any]) -> Tuple[Dict[str, Any], List[str]]:
        """Runs ``req`` on child ``c``: its outcome and its lease frames and outcome, in order."""
        start = len(self.frames)
        program = req.pop("program")
        self.send({"t": "run", "c": c, "req": req}, program.encode())
        outcome = self.wait(lambda f: f.get("c") == c and f["t"] in ("outcome", "exited"), start)
        assert outcome["t"] == "outcome", outcome
        seen = [f["a"] if f["t"] == "lease" else f["t"] for f in self.frames[start:]
                if f.get("c") == c and f["t"] in ("lease", "outcome")]
        return outcome["outcome"], seen

    def kill(self, c: int) -> None:
        self.send({"t": "kill", "c": c, "grace": 0})

    def close(self) -> None:
        try:
            self.send({"t": "shutdown"})
            self.proc.wait(timeout=30)
        except Exception:
            self.proc.kill()


def compute_pids() -> List[int]:
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
                         capture_output=True, text=True, check=True)
    return [int(x) for x in out.stdout.split() if x.strip().isdigit()]


class Requests:
    """``run`` requests with their own workspace and results directory under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.blobs = root / "blobs"
        self.blobs.mkdir()
        self.count = 0

    def blob(self, data: bytes) -> str:
        sha = hashlib.sha256(data).hexdigest()
        (self.blobs / sha).write_bytes(data)
        return sha

    def __call__(self, instructions: List[Dict[str, Any]], blobs: List[str] = ()) -> Dict[str, Any]:
        self.count += 1
        work, results = self.root / f"w{self.count}", self.root / f"r{self.count}"
        work.mkdir()
        results.mkdir()
        return {"request_id": f"req-{self.count}",
                "program": json.dumps({"instructions": instructions}),
                "blobs": {sha: str(self.blobs / sha) for sha in blobs}, "workspace": str(work),
                "results": str(results), "output_limit_bytes": 1 << 20,
                "max_return_bytes": 1 << 30, "sandbox": False}


def tool_program(requests: Requests, script: str, runner_cpu_only: bool = False) -> Dict[str, Any]:
    """What ``kcoral run python script.py`` sends, with this runtime's tool sources."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("script.py")
        info.size = len(script.encode())
        info.mode = 0o600
        tar.addfile(info, io.BytesIO(script.encode()))
    blob = requests.blob(out.getvalue())
    runner = {"op": "get_function", "id": "runner", "module": {"$ref": "tool_runner"}, "name": "run"}
    if runner_cpu_only:
        runner["cpu_only"] = True
    return requests([
        {"op": "upload", "kind": "module", "id": "tool_runner",
         "source": (TOOLS / "runner.py").read_text()},
        runner,
        {"op": "upload", "kind": "module", "id": "definition",
         "source": (TOOLS / "python.py").read_text()},
        {"op": "get_function", "id": "tool_run", "module": {"$ref": "definition"}, "name": "run"},
        {"op": "upload", "kind": "bytes", "id": "inputs", "blob": blob},
        {"op": "run", "id": "run", "fn": {"$ref": "runner"},
         "args": [{"$ref": "inputs"}, {"$ref": "tool_run"}, ["script.py"], {}, []]},
        {"op": "return", "key": "outcome", "value": {"$ref": "run"}},
    ], [blob])


def tool_returncode(outcome: Dict[str, Any]) -> int:
    assert outcome["status"] == "COMPLETED", outcome["error"]
    return json.loads(outcome["results"])["outcome"]["value"]["returncode"]["value"]


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="kcoral-deferred-gpu-"))
    zygote = Zygote(gate_shim.build(str(work / "shim")))
    requests = Requests(work)
    results: List[Tuple[str, Optional[str]]] = []

    def check(name: str, body: Callable[[], Optional[str]]) -> None:
        try:
            problem = body()
        except Exception as exc:
            problem = f"{type(exc).__name__}: {exc}"
        results.append((name, problem))
        print(f"{'FAIL' if problem else 'PASS'} {name}{': ' + problem if problem else ''}",
              flush=True)

    def devices() -> Optional[str]:
        eager_c, eager_pid, eager, eager_s = zygote.child(defer=False)
        deferred_c, deferred_pid, deferred, deferred_s = zygote.child(defer=True)
        print(f"  init: eager {eager_s * 1000:.1f} ms, deferred {deferred_s * 1000:.1f} ms")
        pids = compute_pids()
        zygote.kill(eager_c)
        zygote.kill(deferred_c)
        if (eager.get("context"), deferred.get("context")) != ("created", "deferred"):
            return f"ready says {eager.get('context')} / {deferred.get('context')}"
        for key in ("target", "device_uuids"):
            if eager[key] != deferred[key]:
                return f"{key}: eager {eager[key]} but deferred {deferred[key]}"
        if eager_pid not in pids:
            return f"nvidia-smi does not list the eager child's context ({pids})"
        if deferred_pid in pids:
            return "nvidia-smi lists a context of the deferred child"
        return None

    def script() -> Optional[str]:
        c, pid, _, _ = zygote.child(defer=True)
        seen_pids: List[List[int]] = []
        zygote.before_grant = lambda frame: seen_pids.append(compute_pids())
        try:
            outcome, seen = zygote.run(c, tool_program(requests, SCRIPT))
        finally:
            zygote.before_grant = lambda frame: None
        after = compute_pids()
        if tool_returncode(outcome) != 0:
            return "the script failed"
        # The hold ends with the outcome when the gate had not yet seen the process's exit.
        if seen not in (["acquire", "release", "outcome"], ["acquire", "outcome"]):
            return f"lease frames {seen}: expected the script process's hold only"
        if any(pid in pids for pids in [*seen_pids, after]):
            return "the child itself held a context"
        return None

    def program() -> Optional[str]:
        c, pid, _, _ = zygote.child(defer=True)
        before: List[List[int]] = []
        zygote.before_grant = lambda frame: before.append(compute_pids())
        try:
            outcome, seen = zygote.run(c, requests([
                {"op": "upload", "kind": "module", "id": "m", "source": PROGRAM_MODULE},
                {"op": "get_function", "id": "f", "module": {"$ref": "m"}, "name": "gemm"},
                {"op": "run", "id": "r", "fn": {"$ref": "f"}, "args": []},
                {"op": "return", "key": "r", "value": {"$ref": "r"}},
            ]))
        finally:
            zygote.before_grant = lambda frame: None
        if outcome["status"] != "COMPLETED":
            return f"{outcome['error']}"
        if json.loads(outcome["results"])["r"]["value"] != 256.0:
            return f"wrong result {outcome['results']}"
        if not before or pid in before[0]:
            return "a context existed before the first grant"
        if seen != ["acquire", "outcome"]:
            return f"lease frames {seen}"
        return None

    def cpu_only_first() -> Optional[str]:
        c, _, _, _ = zygote.child(defer=True)
        outcome, seen = zygote.run(c, tool_program(requests, SCRIPT, runner_cpu_only=True))
        if tool_returncode(outcome) != 0:
            return "the script failed"
        if seen[:2] != ["acquire", "release"]:
            return f"lease frames {seen}: the context first, under the lease"
        return None

    try:
        if shutil.which("nvidia-smi") is None:
            print("FAIL nvidia-smi is needed")
            return 1
        check("devices", devices)
        check("script", script)
        check("program", program)
        check("cpu_only_first", cpu_only_first)
    finally:
        zygote.close()
        shutil.rmtree(work, ignore_errors=True)
    passed = sum(problem is None for _, problem in results)
    print(f"RESULT: {passed}/{len(results)} passed")
    return 0 if passed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
