"""Test client for the worker runtime: drives a real zygote subprocess over its pipes.

Zygotes are expensive (the sim one imports torch), so one per mode is shared by the whole
session; every test forks its own children from it.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Dict, List, Optional, Sequence

import pytest

RUNTIME_DIR = Path(__file__).resolve().parents[1]
if str(RUNTIME_DIR) not in sys.path:
    sys.path.insert(0, str(RUNTIME_DIR))

from kcoral_runtime.ipc import FrameDecoder, encode  # noqa: E402

TIMEOUT = 30.0


class ZygoteProcess:
    """A zygote subprocess plus a reader thread that records every frame it sends."""

    def __init__(self, mode: str, *args: str) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(RUNTIME_DIR)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
        )
        self.stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kcoral_runtime.zygote", "--mode", mode, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            env=env,
            start_new_session=True,
        )
        self.mode = mode
        self.frames: List[Dict[str, Any]] = []
        self.closed = False
        self.auto_grant = True
        self._write_lock = threading.Lock()
        self._cond = threading.Condition()
        self._next_c = 0
        self._reader = threading.Thread(target=self._read_loop, daemon=True)
        self._reader.start()
        self.hello = self.wait(lambda f: f["t"] in ("hello", "error"), timeout=60)

    def _read_loop(self) -> None:
        decoder = FrameDecoder()
        fd = self.proc.stdout.fileno()  # type: ignore[union-attr]
        while True:
            data = os.read(fd, 1 << 16)
            if not data:
                break
            for payload in decoder.feed(data):
                msg = json.loads(payload)
                if self.auto_grant and msg.get("t") == "lease" and msg.get("a") == "acquire":
                    self.send({"t": "lease", "c": msg["c"], "a": "granted"})
                with self._cond:
                    self.frames.append(msg)
                    self._cond.notify_all()
        with self._cond:
            self.closed = True
            self._cond.notify_all()

    def send(self, obj: Dict[str, Any]) -> None:
        with self._write_lock:
            self.proc.stdin.write(server_frame(obj))  # type: ignore[union-attr]
            self.proc.stdin.flush()  # type: ignore[union-attr]

    def wait(
        self, pred: Callable[[Dict[str, Any]], bool], timeout: float = TIMEOUT, start: int = 0
    ) -> Dict[str, Any]:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for frame in self.frames[start:]:
                    if pred(frame):
                        return frame
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self.closed:
                    raise AssertionError(
                        f"no matching frame within {timeout}s; frames: {self.frames[start:][-10:]};"
                        f" stderr: {self.stderr_text()[-3000:]}"
                    )
                self._cond.wait(remaining)

    def mark(self) -> int:
        with self._cond:
            return len(self.frames)

    def frames_of(self, c: int, start: int = 0) -> List[Dict[str, Any]]:
        with self._cond:
            return [f for f in self.frames[start:] if f.get("c") == c]

    def stderr_text(self) -> str:
        self.stderr.seek(0)
        return self.stderr.read().decode("utf-8", "replace")

    def new_id(self) -> int:
        self._next_c += 1
        return self._next_c

    def child(
        self,
        env: Optional[Dict[str, str]] = None,
        unset: Sequence[str] = (),
        max_requests: int = 0,
        init: bool = True,
    ) -> "ChildHandle":
        c = self.new_id()
        start = self.mark()
        self.send(
            {"t": "fork", "c": c, "env": env or {}, "unset": list(unset), "max_requests": max_requests}
        )
        forked = self.wait(lambda f: f["t"] == "forked" and f["c"] == c, start=start)
        handle = ChildHandle(self, c, forked["pid"])
        if init:
            handle.init()
        return handle

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.send({"t": "shutdown"})
                self.proc.wait(timeout=15)
            except Exception:
                self.proc.kill()
                self.proc.wait()
        self.stderr.close()


def server_frame(obj: Dict[str, Any]) -> bytes:
    """``obj`` framed as the server frames it: a ``run``'s program travels as the frame's tail."""
    req = obj.get("req")
    if obj.get("t") != "run" or not isinstance(req, dict) or "program" not in req:
        return encode(obj)
    program = req["program"]
    head = {**obj, "req": {k: v for k, v in req.items() if k != "program"}}
    return encode(head, program.encode() if isinstance(program, str) else program)


class ChildHandle:
    def __init__(self, zygote: ZygoteProcess, c: int, pid: int) -> None:
        self.zygote = zygote
        self.c = c
        self.pid = pid
        self.ready: Optional[Dict[str, Any]] = None

    def init(self) -> Dict[str, Any]:
        start = self.zygote.mark()
        self.zygote.send({"t": "init", "c": self.c})
        frame = self.zygote.wait(
            lambda f: f.get("c") == self.c and f["t"] in ("ready", "init_failed", "exited"),
            start=start,
        )
        self.ready = frame
        return frame

    def run(self, req: Dict[str, Any], timeout: float = TIMEOUT) -> SimpleNamespace:
        """Send ``run``; wait for ``outcome``. Returns outcome, retire, frames (this child's)."""
        start = self.zygote.mark()
        self.zygote.send({"t": "run", "c": self.c, "req": req})
        frame = self.zygote.wait(
            lambda f: f.get("c") == self.c and f["t"] in ("outcome", "exited"),
            timeout=timeout,
            start=start,
        )
        assert frame["t"] == "outcome", f"child exited instead: {frame}; {self.zygote.stderr_text()[-3000:]}"
        return SimpleNamespace(
            frame=frame,
            outcome=frame["outcome"],
            retire=frame["retire"],
            results=json.loads(_results_text(frame["outcome"])),
            frames=self.zygote.frames_of(self.c, start),
        )

    def send(self, obj: Dict[str, Any]) -> None:
        self.zygote.send({**obj, "c": self.c})

    def wait_exited(self, timeout: float = TIMEOUT, start: int = 0) -> Dict[str, Any]:
        return self.zygote.wait(
            lambda f: f.get("c") == self.c and f["t"] == "exited", timeout=timeout, start=start
        )

    def kill(self, grace: float = 0.0) -> Dict[str, Any]:
        self.zygote.send({"t": "kill", "c": self.c, "grace": grace})
        return self.wait_exited()


class RequestFactory:
    """Builds ``run`` requests with a fresh workspace and results dir under ``tmp_path``."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.blob_dir = tmp_path / "blobs"
        self.blob_dir.mkdir()
        self.count = 0

    def blob(self, data: bytes) -> str:
        sha = hashlib.sha256(data).hexdigest()
        path = self.blob_dir / sha
        if not path.exists():
            path.write_bytes(data)
        return sha

    def __call__(
        self,
        instructions: List[Dict[str, Any]],
        blobs: Sequence[str] = (),
        workspace: Optional[Path] = None,
        **fields: Any,
    ) -> Dict[str, Any]:
        self.count += 1
        if workspace is None:
            workspace = self.tmp / f"work{self.count}"
            workspace.mkdir()
        results = self.tmp / f"results{self.count}"
        results.mkdir()
        req = {
            "request_id": f"req-{self.count}",
            "program": json.dumps({"instructions": instructions}),
            "blobs": {sha: str(self.blob_dir / sha) for sha in blobs},
            "workspace": str(workspace),
            "results": str(results),
            "output_limit_bytes": 1 << 20,
            "max_return_bytes": 1 << 30,
            "sandbox": False,
        }
        req.update(fields)
        return req


def module(id: str, source: str) -> Dict[str, Any]:
    return {"op": "upload", "kind": "module", "id": id, "source": source}


def get_function(id: str, mod: str, name: str, cpu_only: Optional[bool] = None) -> Dict[str, Any]:
    ins: Dict[str, Any] = {"op": "get_function", "id": id, "module": {"$ref": mod}, "name": name}
    if cpu_only is not None:
        ins["cpu_only"] = cpu_only
    return ins


def run(id: str, fn: str, *args: Any) -> Dict[str, Any]:
    return {"op": "run", "id": id, "fn": {"$ref": fn}, "args": list(args)}


def ref(id: str) -> Dict[str, str]:
    return {"$ref": id}


def ret(key: str, value: str) -> Dict[str, Any]:
    return {"op": "return", "key": key, "value": {"$ref": value}}


def ret_path(key: str, kind: str, path: Any) -> Dict[str, Any]:
    return {"op": "return", "key": key, "kind": kind, "path": path}


def upload_blob(id: str, kind: str, sha: str, **extra: Any) -> Dict[str, Any]:
    return {"op": "upload", "kind": kind, "id": id, "blob": sha, **extra}


def call(source: str, name: str = "main", *args: Any) -> List[Dict[str, Any]]:
    """module + get_function + run + return of the result under key 'r'."""
    return [module("m", source), get_function("f", "m", name), run("r", "f", *args), ret("r", "r")]


def read_capture(outcome: Dict[str, Any], stream: str) -> Optional[bytes]:
    info = outcome[stream]
    if info is None:
        return None
    data = Path(info["path"]).read_bytes()
    assert len(data) == info["size"]
    return data


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


kc = SimpleNamespace(
    module=module,
    get_function=get_function,
    run=run,
    ref=ref,
    ret=ret,
    ret_path=ret_path,
    upload_blob=upload_blob,
    call=call,
    read_capture=read_capture,
    pid_alive=pid_alive,
)


@pytest.fixture(name="kc")
def kc_fixture() -> SimpleNamespace:
    return kc


@pytest.fixture
def make_request(tmp_path: Path) -> RequestFactory:
    return RequestFactory(tmp_path)


@pytest.fixture(scope="session")
def cpu_zygote():
    zygote = ZygoteProcess("cpu")
    assert zygote.hello["t"] == "hello", zygote.stderr_text()
    yield zygote
    zygote.close()


@pytest.fixture(scope="session")
def sim_zygote():
    zygote = ZygoteProcess("sim", "--sim-devices", "4")
    assert zygote.hello["t"] == "hello", zygote.stderr_text()
    yield zygote
    zygote.close()


@pytest.fixture
def zygote_factory():
    """Private zygotes for tests that must not share one."""
    made: List[ZygoteProcess] = []

    def make(mode: str, *args: str) -> ZygoteProcess:
        zygote = ZygoteProcess(mode, *args)
        made.append(zygote)
        return zygote

    yield make
    for zygote in made:
        zygote.close()


def _results_text(outcome: Dict[str, Any]) -> str:
    """The results JSON of an outcome: in the frame, or (large results) in its file."""
    if outcome.get("results_file"):
        with open(outcome["results_file"]["path"], encoding="utf-8") as f:
            text = f.read()
        assert len(text.encode("utf-8")) == outcome["results_file"]["size"]
        return text
    return outcome["results"]
