"""Executes one program (spec protocol §2.4–§2.5, server §4) and builds its outcome.

The ``run`` request and ``outcome`` formats are docs/architecture.md §3.3–§3.4.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import traceback
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from . import cuda_guard, files, tool_sources
from .capture import OutputCapture
from .errors import ExecutionError, GPUAccessViolation, foreign_execution_error_kind
from .ipc import dumps
from .leak_checks import (
    SandboxState,
    forget_workspace_imports,
    kill_leftover_processes,
    warm_thread_pools,
)
from .log import log
from .modules import ModuleLoader
from .state_restore import ProcessState, StateNotRestored
from .values import KeepPolicy, Results

TRACEBACK_LIMIT = 8192
DEFAULT_OUTPUT_LIMIT_BYTES = 1 << 20
DEFAULT_MAX_RETURN_BYTES = 1 << 30
LEFTOVER_MESSAGE = "program left background processes running; they were terminated"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0)


def is_ref(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and len(value) == 1
        and isinstance(value.get("$ref"), str)
        and bool(value["$ref"])
    )


def _traceback() -> str:
    if sys.exc_info()[0] is None:
        return ""
    return traceback.format_exc()[-TRACEBACK_LIMIT:]


def instruction_error(kind: str, message: str, index: int, ins: Dict[str, Any]) -> Dict[str, Any]:
    """The FAILED ``error`` object: exactly these keys (spec protocol §3.4)."""
    op = ins.get("op")
    return {
        "kind": kind,
        "message": message,
        "instruction_index": index,
        "instruction_op": op,
        "instruction_id": None if op == "return" else ins.get("id"),
        "traceback": _traceback(),
    }


class _Request:
    """Per-request state; dropped as a whole when the program ends."""

    def __init__(self, req: Dict[str, Any], results: Results, cpu_only: Set[str]) -> None:
        self.workspace: str = req["workspace"]
        self.blobs: Dict[str, str] = req.get("blobs") or {}
        self.sandbox = bool(req.get("sandbox", False))
        self.max_return_bytes = int(req.get("max_return_bytes", DEFAULT_MAX_RETURN_BYTES))
        self.results = results
        self.cpu_only = cpu_only
        self.env: Dict[str, Any] = {}
        # ``kcoral run`` tools (tool_sources.py), with the gate only: id -> role of each
        # recognised module and of each function taken from one; the runs that leave the lease
        # to the processes they start, and their results (plain values).
        self.tool_modules: Dict[str, str] = {}
        self.tool_functions: Dict[str, str] = {}
        self.gated_runs: Set[str] = set()
        # A module or library other than a recognised tool's was loaded: code that is not this
        # runtime's own ran in the process.
        self.foreign_code = False

    def blob(self, sha256: str) -> str:
        try:
            return self.blobs[sha256]
        except KeyError:
            raise ExecutionError("engine", f"blob {sha256} was not given to the worker") from None


class Engine:
    """One per child. ``backend`` is a devices backend, ``lease`` a Lease or NoLease,
    ``notify_instr(k)`` sends the ``instr`` frame for instruction ``k``; ``gate``: the child's
    GPU gate (``gate.py``), or ``None`` (every run holds the lease as the spec places it)."""

    def __init__(
        self, backend: Any, lease: Any, notify_instr: Callable[[int], None], gate: Any = None
    ) -> None:
        self.backend = backend
        self.lease = lease
        self.gate = gate
        self.requests = 0  # requests this child has started
        self.notify_instr = notify_instr
        self.modules = ModuleLoader()
        self.capture = OutputCapture()
        self.state: Optional[ProcessState] = None
        self._pools_warm = False
        self.reset_pending = False
        # The next request's sandbox snapshot, taken while idle (``idle``); due after a
        # sandboxed request the child survives.
        self._sandbox_next: Optional[SandboxState] = None
        self._sandbox_due = False
        # A sandboxed request's state whose file checks run after its answer.
        self._files_due: Optional[SandboxState] = None

    def snapshot_state(self) -> None:
        """Record torch knobs and the environment (after init) for reuse hygiene."""
        self.state = ProcessState(self.backend.torch)

    # ------------------------------------------------------------------ request

    def execute(
        self, req: Dict[str, Any], last_request: bool
    ) -> Tuple[Dict[str, Any], Optional[str], Optional[str]]:
        """Run one program. Returns (outcome, retire reason or None, retire detail or None).

        ``last_request``: the child retires after this request anyway (request limit), so
        reset and sandbox checks are skipped. With ``reply_before_reset`` in ``req`` a kept
        child's reset is left pending (``reset_pending``): the outcome is final without it, so
        the caller sends it first and then calls ``finish_request``. In sandbox mode the sandbox
        checks on the process (imports, threads, audit hooks) still run here, before the
        outcome, which carries their verdict; the file checks (descriptors, mappings) run in
        ``finish_request``, right after the answer. The lease goes back as
        soon as what needs it is done (``_sandbox_hygiene``); a retiring child takes it again
        before its outcome, so that its exit stays under the lease, unless its context was
        deferred and never created (``_drain``).
        """
        instructions: List[Dict[str, Any]] = json.loads(req["program"])["instructions"]
        sandbox = bool(req.get("sandbox", False))
        self.requests += 1
        keep = (
            KeepPolicy(int(req["keep_min_bytes"]), int(req.get("keep_max_bytes", 0)))
            if req.get("keep_min_bytes") is not None
            else None
        )
        results = Results(req["results"], self.backend.tensor_type, keep)
        cpu_only = {
            ins["id"]
            for ins in instructions
            if ins.get("op") == "get_function" and ins.get("cpu_only") is True
        }
        sandbox_state: Optional[SandboxState] = None
        self._sandbox_due = False
        self._files_due = None
        if sandbox and not last_request:
            sandbox_state = self._sandbox_next
            if sandbox_state is None:
                if not self._pools_warm:
                    warm_thread_pools(self.backend.torch)
                    self._pools_warm = True
                sandbox_state = SandboxState()
        self._sandbox_next = None
        request = _Request(req, results, cpu_only)
        self.lease.begin_request()
        if req.get("lease_held") and self.backend.uses_lease:
            self.lease.held = True  # the server granted the lease together with the program
        limit = int(req.get("output_limit_bytes", DEFAULT_OUTPUT_LIMIT_BYTES))
        self.capture.start(req["results"], limit)
        if self.gate is not None:
            self.gate.begin_request()
        try:
            error, gpu_access, index, ins = self._run_instructions(instructions, request)
            if self.state is not None and not last_request:
                # A trace/profile hook or gc callback the program left would run on every line
                # of what follows (the drain, the checks) and of the next program: off at once.
                self.state.interpreter.restore([])
            if cuda_guard.stop_active():  # uploaded code left a CUPTI subscription behind
                log("stopped a CUDA guard the program left active")
            # Drain under the lease while output is still captured: device printf flushes here.
            error, poisoned = self._drain(error, index, ins)
        finally:
            captured = self.capture.stop()

        max_return_bytes = request.max_return_bytes
        results_dir = req["results"]
        workspace = request.workspace
        request.env.clear()
        del request
        self.backend.libraries.end_request(sandbox)

        leftovers = kill_leftover_processes()
        if self.gate is not None:
            self.gate.end_request()  # its processes are gone: no hold of theirs is left
        if leftovers and error is None:
            error = instruction_error("runtime", LEFTOVER_MESSAGE, index, ins)

        retire: Optional[str] = None
        detail: Optional[str] = None
        if poisoned:
            retire = "poisoned_context"
        elif leftovers:
            retire = "leftover_processes"
        elif last_request:
            retire = "request_limit"
        elif req.get("reply_before_reset"):
            if sandbox_state is not None:
                retire, detail = self._sandbox_hygiene(sandbox_state, workspace)
            # The caller answers first, then calls finish_request().
            self.reset_pending = retire is None
        else:
            retire, detail = self._reset_and_check(sandbox_state, workspace)
        self._sandbox_due = sandbox_state is not None and retire is None

        stdout, stderr = captured.describe()
        results_text = results.text()
        outcome = {
            "status": "FAILED" if error is not None else "COMPLETED",
            "results": results_text,
            "error": error,
            "parts": [part.wire() for part in results.store.parts],
            "stdout": stdout,
            "stderr": stderr,
            "gpu_access": gpu_access,
            "boundary": results.store.final_boundary(),
        }
        if results.store.kept:
            outcome["kept"] = [part.wire() for part in results.store.kept]
        receipt = self.lease.take_receipt()  # the GPU state as the lease came and went
        if receipt is not None:
            outcome["gpu_receipt"] = receipt
        # Large results go beside the parts as a file (encoded once, here): inside the frame, a
        # JSON text is escaped once more (a quote becomes three bytes).
        encoded = _utf8(results_text) if len(results_text) > RESULTS_INLINE_CHARS else None
        text_bytes = len(encoded) if encoded is not None else _utf8_length(results_text)
        # An answer whose JSON alone exceeds the response limit is not sent (the server answers
        # response_too_large): it would only cost a frame as large as it is.
        json_bytes = text_bytes + (len(dumps(error)) if error is not None else 0)
        if json_bytes > max_return_bytes:
            outcome.update(results="{}", error=None, parts=[], kept=[], too_large=json_bytes)
        elif encoded is not None:
            written = _write_results(results_dir, encoded)
            if written is not None:
                outcome.update(results=None, results_file=written)
        return outcome, retire, detail

    def _run_instructions(
        self, instructions: List[Dict[str, Any]], request: _Request
    ) -> Tuple[Optional[Dict[str, Any]], Optional[Dict[str, Any]], int, Dict[str, Any]]:
        """Execute in order, in the workspace, until done or the first failure.

        Returns (error or None, gpu_access or None, last index, last instruction).
        """
        error: Optional[Dict[str, Any]] = None
        gpu_access: Optional[Dict[str, Any]] = None
        index = 0
        ins = instructions[0]
        saved_cwd: Optional[int] = None
        # Unsandboxed, the workspace is a new host directory per request: uploaded modules import
        # from it as they do from /work in a sandbox (the zygote's path starts there).
        on_path = not request.sandbox and request.workspace not in sys.path
        try:
            saved_cwd = _open_cwd()
            os.chdir(request.workspace)
            if on_path:
                sys.path.insert(0, request.workspace)
            for index, ins in enumerate(instructions):
                self.notify_instr(index)
                self._place(ins, request)
                self._execute(ins, request)
        except GPUAccessViolation as exc:
            error = instruction_error("gpu_access", exc.message, index, ins)
            error["traceback"] = exc.call_stack[-TRACEBACK_LIMIT:]  # the stack at the CUDA call
            gpu_access = {
                "cuda_call": exc.cuda_call,
                "location": exc.location,
                "detected_at_ns": exc.detected_at_ns,
            }
        except ExecutionError as exc:
            error = instruction_error(exc.kind, exc.message, index, ins)
        except BaseException as exc:  # uploaded code: any exception, SystemExit included
            kind = foreign_execution_error_kind(exc)
            if kind is not None:  # raised with a real ``kcoral`` installation's class
                error = instruction_error(kind, str(getattr(exc, "message", exc)), index, ins)
            else:
                error = instruction_error("engine", f"{type(exc).__name__}: {exc}", index, ins)
        finally:
            if on_path:
                forget_workspace_imports(request.workspace)
            if saved_cwd is not None:
                os.fchdir(saved_cwd)
                os.close(saved_cwd)
        return error, gpu_access, index, ins

    # ------------------------------------------------------------------ lease

    def _place(self, ins: Dict[str, Any], request: _Request) -> None:
        """Hold or drop the GPU lease for the instruction about to run (spec protocol §2.5).

        With the gate, a ``kcoral run`` tool's own instructions (``_place_tool``) are the
        exception: its processes take the lease at their first CUDA call. In a worker whose
        context ``init`` deferred, the first instruction that takes the lease creates it, and a
        ``cpu_only`` run first does so under the lease; file and bytes uploads, path returns and
        a tool's instructions never create it."""
        if not self.backend.uses_lease:
            return
        if ins["op"] == "upload" and ins.get("kind") == "library":
            request.foreign_code = True
        if self.gate is not None and self._place_tool(ins, request):
            return
        cpu_only = request.cpu_only
        op = ins["op"]
        if op == "upload":
            kind = ins.get("kind")
            if kind == "file":
                self.lease.release()
                return
            if kind == "bytes":
                return
        elif op == "return":
            if "kind" in ins:
                self.lease.release()
                return
        elif op == "run":
            if ins["fn"]["$ref"] in cpu_only:
                # A stray CUDA call in the function must not be the one that creates the context.
                self._context_under_lease()
                self.lease.release()
                return
        self.lease.acquire()
        self._ensure_context()

    def _ensure_context(self) -> None:
        """Creates the context ``init`` deferred (the lease is held); a failure fails the
        instruction."""
        if not self.backend.context_pending:
            return
        try:
            self.backend.ensure_context()
        except Exception as exc:
            raise ExecutionError(
                "runtime", f"creating the CUDA context failed: {type(exc).__name__}: {exc}"
            ) from exc

    def _context_under_lease(self) -> None:
        """Before code runs without the lease in a worker whose context ``init`` deferred: the
        context, created under the lease (which is then held)."""
        if self.backend.context_pending:
            self.lease.acquire()
            self._ensure_context()

    def _place_tool(self, ins: Dict[str, Any], request: _Request) -> bool:
        """Places the lease for an instruction of a recognised ``kcoral run`` tool; ``False``
        for any other instruction. The tool's modules and functions are this runtime's own code
        (tool_sources.py), which never calls CUDA here: their uploads leave the lease as it is
        (as a bytes upload does). The runner's run of a gated tool (``python``, ``shell``) drops
        it, and its processes take it through the gate; a profiler's run (``ncu``,
        ``compute-sanitizer``, ``run-iket``) keeps the whole-run lease. The outcome of a gated
        run is a plain value: returning it leaves the lease as it is too."""
        op = ins["op"]
        if op == "upload" and ins.get("kind") == "module":
            role = tool_sources.role_of(ins.get("source"))
            if role is None:
                request.foreign_code = True
                return False
            request.tool_modules[ins["id"]] = role
            return True
        if op == "get_function":
            role = request.tool_modules.get(_ref_id(ins.get("module")))
            if role is None:
                return False
            request.tool_functions[ins["id"]] = role
            return True
        if op == "run":
            fn = _ref_id(ins.get("fn"))
            args = ins.get("args") or []
            definition = _ref_id(args[1]) if len(args) == 5 else None
            if (
                request.tool_functions.get(fn) != tool_sources.RUNNER
                or request.tool_functions.get(definition) != tool_sources.GATED
                or fn in request.cpu_only
            ):
                return False
            request.gated_runs.add(ins["id"])
            self.lease.release()
            return True
        if op == "return" and "kind" not in ins:
            return _ref_id(ins.get("value")) in request.gated_runs
        return False

    def _drain(
        self, error: Optional[Dict[str, Any]], index: int, ins: Dict[str, Any]
    ) -> Tuple[Optional[Dict[str, Any]], bool]:
        """Re-acquire, synchronize and consume CUDA's last error. Returns (error, poisoned).
        A worker whose context was deferred and never created has nothing to drain, and its
        exit tears down no context: it neither takes the lease nor creates the context here."""
        if self.backend.context_pending:
            return error, False
        self.lease.acquire()
        try:
            self.backend.synchronize()
        except Exception as exc:  # sticky: the context is unusable
            if error is None:
                error = instruction_error("runtime", f"{type(exc).__name__}: {exc}", index, ins)
            return error, True
        try:
            pending = self.backend.take_last_error()
        except Exception as exc:
            if error is None:
                error = instruction_error("runtime", f"{type(exc).__name__}: {exc}", index, ins)
            return error, True
        if pending is not None:  # non-sticky: this request failed, the context is fine
            if error is None:
                error = instruction_error("runtime", pending, index, ins)
            elif error["kind"] == "gpu_access":
                error["message"] += f"; CUDA also reports {pending}"
        return error, False

    def finish_request(self) -> Tuple[Optional[str], Optional[str]]:
        """The reset ``execute`` left pending (``reply_before_reset``). Unsandboxed, all of it
        under the lease, which the ``clean`` frame hands back. Sandboxed, ``_sandbox_hygiene``
        already did what needs the lease and gave it back: the file checks and the host-only
        state are left (environment, umask, resource limits, torch's knobs); a workspace file
        still open or mapped, or a failure there, retires the child, which takes the lease again
        first, so that its exit stays under it. Returns (retire reason or None, retire detail or
        None)."""
        if not self.reset_pending:
            return None, None
        self.reset_pending = False
        if not self._sandbox_due:  # unsandboxed (a kept sandboxed child's snapshot is due)
            return self._reset_and_check(None, "")
        retire, detail = self._file_verdict()
        if retire is None:
            retire, detail = self._reset_verdict(self._restore_host_state)
        if retire is not None:
            self._sandbox_due = False  # no next request: no snapshot for it
            self.lease.acquire()
        return retire, detail

    def _file_verdict(self) -> Tuple[Optional[str], Optional[str]]:
        """The file checks of a sandboxed request (descriptors and mappings into its workspace),
        left for after its answer: (None, None), or the reason and detail to retire for."""
        state, self._files_due = self._files_due, None
        if state is None:
            return None, None
        try:
            detail = state.check_files()
        except Exception as exc:
            detail = f"sandbox checks failed: {type(exc).__name__}: {exc}"
        if detail is None:
            return None, None
        return self._retiring("sandbox_cleanup", detail)

    def _restore_host_state(self) -> None:
        if self.state is not None:
            self.state.restore()

    def idle(self) -> None:
        """The request is over (outcome sent, reset done): while the child waits for its next
        request, take that request's sandbox snapshot (nothing runs in between)."""
        if self._sandbox_due:
            self._sandbox_due = False
            self._sandbox_next = SandboxState()

    def _sandbox_hygiene(
        self, sandbox_state: SandboxState, workspace: str
    ) -> Tuple[Optional[str], Optional[str]]:
        """A sandboxed request's checks, before its outcome (which carries their verdict),
        with the part of the reset that needs the lease; the rest waits for ``finish_request``.

        Under the lease: the signal handlers and timers go back (none of the program's runs
        after this), the uploaded modules' namespaces are collected (a file only they held open
        is closed; a finalizer may use the GPU), then the in-process checks (imports, threads,
        audit hooks: once they pass, no code of the program can run any more), then the cache
        is emptied and the GPU drained, and the lease goes back. The file checks (descriptors
        and mappings into the workspace: reads of ``/proc``, no lease) wait for
        ``finish_request``, right after the answer: the seat stays busy until the child's
        ``clean``, so no request runs in a child that still holds a workspace file
        (docs/decisions/sandboxed-reuse-checks.md). A leak found there, or a check that cannot
        run (a descriptor limit the program lowered, say), retires the child, which takes the lease again first: its
        exit stays under it.
        """
        try:
            if self.state is not None:
                self.state.posix.restore_signals([])
            self.modules.forget()
            gc.collect()
            detail = sandbox_state.clean_and_check_process(workspace)
        except Exception as exc:
            detail = f"sandbox checks failed: {type(exc).__name__}: {exc}"
            return self._retiring("sandbox_cleanup", detail)
        if detail is not None:
            return self._retiring("sandbox_cleanup", detail)
        try:
            self.backend.empty_cache()
            self.lease.release()
        except Exception as exc:
            return self._retiring("poisoned_context", f"reset failed: {type(exc).__name__}: {exc}")
        self._files_due = sandbox_state  # the file checks: right after the answer
        return None, None

    @staticmethod
    def _retiring(reason: str, detail: str) -> Tuple[Optional[str], Optional[str]]:
        log(f"retiring: {detail}")
        return reason, detail

    def _reset_and_check(
        self, sandbox_state: Optional[SandboxState], workspace: str
    ) -> Tuple[Optional[str], Optional[str]]:
        """The whole reset and the sandbox checks before the outcome, under the lease (a server
        that does not send ``reply_before_reset``)."""
        retire, detail = self._reset_verdict(self._reset)
        if retire is not None or sandbox_state is None:
            return retire, detail
        try:
            detail = sandbox_state.clean_and_check(workspace)
        except Exception as exc:
            detail = f"sandbox checks failed: {type(exc).__name__}: {exc}"
        if detail is None:
            return None, None
        return self._retiring("sandbox_cleanup", detail)

    def _reset_verdict(self, step: Callable[[], None]) -> Tuple[Optional[str], Optional[str]]:
        """Runs a reset step: (None, None), or the reason and detail to retire for."""
        try:
            step()
        except StateNotRestored as exc:
            return self._retiring("process_state", str(exc))
        except Exception as exc:
            return self._retiring("poisoned_context", f"reset failed: {type(exc).__name__}: {exc}")
        return None, None

    def _reset(self) -> None:
        """Reuse hygiene (under the lease): undo process-state changes, free memory, drain."""
        if self.state is not None:
            self.state.restore()
        self.modules.forget()
        gc.collect()
        self.backend.empty_cache()
        self.backend.synchronize()

    # ------------------------------------------------------------------ instructions

    def _execute(self, ins: Dict[str, Any], request: _Request) -> None:
        op = ins["op"]
        env = request.env
        if op == "upload":
            kind = ins["kind"]
            if kind == "module":
                value: Any = self.modules.load(ins["source"])
            elif kind == "tensor":
                value = self.backend.load_tensor(request.blob(ins["blob"]), ins["dtype"], ins["shape"])
            elif kind == "bytes":
                value = files.read_blob_bytes(request.blob(ins["blob"]))
            elif kind == "library":
                sha = ins["blob"]
                value = self.backend.libraries.load(
                    request.blob(sha), sha, request.sandbox, request.workspace
                )
            elif kind == "file":
                value = files.materialize_file(
                    request.workspace, ins["path"], request.blob(ins["blob"]), request.sandbox
                )
            else:
                raise ExecutionError("engine", f"unknown upload kind {kind!r}")
            env[ins["id"]] = value
        elif op == "get_function":
            env[ins["id"]] = self.backend.get_function(env[ins["module"]["$ref"]], ins["name"])
        elif op == "run":
            env[ins["id"]] = self._invoke(ins, request)
        elif op == "return":
            if "kind" in ins:
                self._return_path(ins, request)
            else:
                request.results.return_value(ins["key"], env[ins["value"]["$ref"]])
        else:
            raise ExecutionError("engine", f"unknown op {op!r}")

    def _invoke(self, ins: Dict[str, Any], request: _Request) -> Any:
        """Call in its own frame, so the function and arguments die with the instruction."""
        fn_id = ins["fn"]["$ref"]
        env = request.env
        fn = env[fn_id]
        if not callable(fn):
            raise ExecutionError("runtime", f"handle {fn_id!r} is not callable")
        args = [env[arg["$ref"]] if is_ref(arg) else arg for arg in ins.get("args", [])]
        if fn_id in request.cpu_only:
            return self.backend.run_cpu_only(fn, args)
        if ins.get("id") in request.gated_runs:
            return self._run_gated(fn, args, request)
        return fn(*args)

    def _run_gated(self, fn: Callable[..., Any], args: List[Any], request: _Request) -> Any:
        """A gated tool run, without the lease. In a child's first request that loaded no code
        but the tool's, nothing else ever ran in this process: directly. Otherwise under the CUDA
        guard where there is one, as a ``cpu_only`` function (code a program left in this process
        that calls CUDA is caught as a ``gpu_access`` error); when the guard cannot start, with
        the whole-run lease."""
        if self.requests == 1 and not request.foreign_code:
            return fn(*args)
        if self.backend.context_pending:  # the guard watches a context: create it first
            self._context_under_lease()
            self.lease.release()
        started = False

        def body(*call_args: Any) -> Any:
            nonlocal started
            started = True
            return fn(*call_args)

        try:
            return self.backend.run_cpu_only(body, args)
        except ExecutionError as exc:
            if started or exc.kind != "unavailable":
                raise
        log("the CUDA guard is unavailable: this tool run holds the lease throughout")
        self.lease.acquire()
        self._ensure_context()
        return fn(*args)

    def _return_path(self, ins: Dict[str, Any], request: _Request) -> None:
        kind = ins["kind"]
        raw = ins["path"]
        results = request.results
        try:
            path = request.env[raw["$ref"]] if is_ref(raw) else raw
            budget = request.max_return_bytes - results.store.binary_bytes
            results.add(
                ins["key"],
                lambda: files.collect(results.store, request.workspace, path, kind, budget),
            )
        except Exception as exc:
            raise ExecutionError(
                "serialization", f"cannot return {kind}: {type(exc).__name__}: {exc}"
            ) from exc


RESULTS_INLINE_CHARS = 1 << 20
"""Results JSON longer than this goes to ``results.json`` beside the parts, not in the frame."""


def _ref_id(value: Any) -> Optional[str]:
    """The id a ``{"$ref": id}`` names, else ``None``."""
    return value["$ref"] if is_ref(value) else None


def _write_results(results_dir: str, data: bytes) -> Optional[Dict[str, Any]]:
    """Writes ``data`` to ``results.json`` in ``results_dir``: its path and size, or ``None``
    when it cannot be written (the results then stay in the frame)."""
    path = os.path.join(results_dir, "results.json")
    try:
        with open(path, "wb") as f:
            f.write(data)
    except OSError:
        try:
            os.unlink(path)
        except OSError:
            pass
        return None
    return {"path": path, "size": len(data)}


def _utf8(text: str) -> Optional[bytes]:
    """``text`` in UTF-8, or ``None`` when it holds lone surrogates (the frame escapes those)."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return None


def _utf8_length(text: str) -> int:
    """Bytes of ``text`` in UTF-8 (without encoding it when it is ASCII)."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def _open_cwd() -> int:
    try:
        return os.open(".", _DIR_FLAGS)
    except OSError:
        return os.open("/", _DIR_FLAGS)
