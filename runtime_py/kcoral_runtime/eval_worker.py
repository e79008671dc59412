"""The three steps of ``kcoral eval``, each called in its own fresh worker by the client.

    client: secret seeds (new per evaluation)
      |
      |-- 1. generate_inputs(reference, request)       worker A, cpu_only: no GPU lease
      |        torch.manual_seed(seed); get_inputs()   per correctness seed and timing seed,
      |          side by side in forked processes (eval_inputs)
      |          and the bracket seed's set, whose outputs nobody checks
      |        -> inputs bundle (tensors, no seeds, no expected outputs)
      |
      |-- 2. run_candidate(candidate, inputs, request)  worker B: the only one that runs candidate code
      |        first, before any candidate code: Model timed on the bracket set (drift between
      |          workers, which widens the verdict's interval only)
      |        ModelNew(*init inputs) after torch.manual_seed(init_seed)
      |        each correctness set twice on fresh copies (allocator poisoned with NaN first),
      |          each output captured (copied) right after its call, before the next call:
      |          inputs still equal? both runs identical? output unchanged by a device synchronize?
      |        timing: every call on fresh copies of rotating timing sets (eval_timing)
      |        the timing and reporting code checked for patches (eval_integrity)
      |        -> outputs bundle: first-run outputs, the last timed output of each timing set,
      |           its own checks, its timing
      |
      '-- 3. judge(reference, inputs, outputs, request) worker C, after B has exited
               inputs bundle checked against what the client got from A: the SHA-256 of its
               header (which holds every tensor's SHA-256, checked on several threads)
               Model(*init inputs): expected outputs (they exist only now, only here),
               compared with B's (eval_compare); the reference timed as B was
               -> the verdict (eval_verdict) as JSON text

Neither seeds nor expected outputs nor the comparison ever exist in a process that ran
candidate code: the seeds stay in the client and worker A, the expected outputs are made after
the candidate's worker is gone. Every exchange is a bundle (eval_bundle): data, never pickle.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import tempfile
import time
import traceback
from typing import Any, Dict, List, Optional, Tuple

from .errors import ExecutionError
from .eval_bundle import (Bundle, BundleError, BundleWriter, capture_value, sha256_bytes,
                          verify_tensors)
from .eval_compare import compare_values, tolerance_for
from .eval_inputs import describe_seeds
from .eval_integrity import changed, snapshot
from .eval_physics import floor_ms
from .eval_timing import Rotation, clone_value, same_value, time_model
from .eval_verdict import DEFAULT_EXCESSIVE_SPEEDUP, build_verdict
from .values import Chunks

__all__ = ["generate_inputs", "run_candidate", "judge", "load_source"]


def _ms(start: float) -> float:
    return round((time.perf_counter() - start) * 1e3, 3)


def load_source(source: str, role: str) -> Any:
    """Import ``source`` as a module from a file of its own (Triton and tracebacks need one)."""
    if not isinstance(source, str):
        raise ExecutionError("runtime", f"the {role} source must be a string")
    folder = tempfile.mkdtemp(prefix=f"kcoral-eval-{role}-", dir=os.getcwd())
    path = os.path.join(folder, f"{role}.py")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(source)
    name = f"kcoral_eval_{role}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _require(module: Any, names: Tuple[str, ...], role: str) -> None:
    missing = [n for n in names if not hasattr(module, n)]
    if missing:
        raise ExecutionError("parse", f"the {role} file defines no {', '.join(missing)}")


def _device() -> str:
    """``cuda`` where the worker has a GPU; else ``cpu``, with torch on one thread so that the
    reference and the candidate are timed alike (a shared CPU's thread pools make any other
    setting noise)."""
    import torch

    if torch.cuda.is_available():
        return "cuda"
    torch.set_num_threads(1)
    return "cpu"


def _to_device(values: List[Any], device: str) -> List[Any]:
    import torch

    return [v.to(device) if isinstance(v, torch.Tensor) else v for v in values]


def _sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def _build_model(cls: Any, init_inputs: List[Any], init_seed: int, device: str) -> Any:
    import torch

    torch.manual_seed(init_seed)
    model = cls(*init_inputs)
    if hasattr(model, "to"):
        model = model.to(device)
    return model


def _problem_facts(module: Any) -> Dict[str, Any]:
    tolerance = getattr(module, "TOLERANCE", None)
    if tolerance is not None and not (isinstance(tolerance, dict) and all(
            k in ("atol", "rtol") and isinstance(v, (int, float)) for k, v in tolerance.items())):
        raise ExecutionError("parse", "TOLERANCE must be a dict with numbers under atol and rtol")
    facts = {
        "flops": getattr(module, "FLOPS", None),
        "bytes": getattr(module, "BYTES", None),
        "tolerance": tolerance,
        "deterministic": getattr(module, "DETERMINISTIC", True) is not False,
    }
    for key in ("flops", "bytes"):
        value = facts[key]
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or value < 0):
            raise ExecutionError("parse", f"{key.upper()} must be a number >= 0")
    return facts


def _tolerance(problem: Optional[Dict[str, float]], override: Optional[Dict[str, float]]
               ) -> Optional[Dict[str, float]]:
    """The atol/rtol that replace the dtype defaults: the caller's keys over the problem's."""
    if not problem and not override:
        return None
    return dict(problem or {}, **(override or {}))


# --------------------------------------------------------------------------- 1. inputs


def _listed(values: Any, name: str) -> List[Any]:
    """What ``get_inputs()``/``get_init_inputs()`` returned, as the list of arguments it must
    be (a list or tuple)."""
    if not isinstance(values, (list, tuple)):
        raise ExecutionError("runtime", f"{name}() must return a list or tuple of arguments, "
                                        f"not {type(values).__name__}")
    return list(values)


def generate_inputs(reference_source: str, request_json: str) -> Any:
    """Step 1 (module docstring): the inputs bundle for the secret seeds of ``request_json``
    (``correctness_seeds``, ``timing_seeds``: decimal strings; ``init_seed``). With
    ``header_digest`` true, ``[bundle, SHA-256 of its header]``: a client that has the server
    keep the bundle (docs/kept-returns.md) never holds its bytes, and the judge checks against
    that digest. ``input_processes`` (optional): how many sets are made at once (eval_inputs;
    default: the usable CPUs; 1 makes them one after another here)."""
    import torch

    started = time.perf_counter()
    # torch.cuda.is_available() (which problems may call to pick their sizes) asks NVML instead
    # of the CUDA runtime: this step runs cpu_only, where any CUDA call is a violation.
    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
    request = json.loads(request_json)
    correctness_seeds = [int(s) for s in request["correctness_seeds"]]
    timing_seeds = [int(s) for s in request["timing_seeds"]]
    # The bracket set: the reference is timed on it in the candidate's worker before the
    # candidate loads (step 2); no output of it is ever checked, so it is worth nothing there.
    bracket_seeds = [int(request["bracket_seed"])] if request.get("bracket_seed") is not None else []
    init_seed = int(request["init_seed"])
    module = load_source(reference_source, "reference")
    _require(module, ("Model", "get_inputs", "get_init_inputs"), "reference")
    facts = _problem_facts(module)
    writer = BundleWriter()
    # The CPU generator only: torch.manual_seed also seeds every CUDA device (a CUDA call at
    # once where the worker's context exists), which this cpu_only step must not make.
    torch.default_generator.manual_seed(init_seed)
    init_inputs = _listed(module.get_init_inputs(), "get_init_inputs")

    def inputs_of(seed: int) -> List[Any]:
        torch.default_generator.manual_seed(seed)
        values = _listed(module.get_inputs(), "get_inputs")
        for v in values:
            if isinstance(v, torch.Tensor) and v.device.type != "cpu":
                raise ExecutionError(
                    "runtime", "get_inputs() must make its tensors on the CPU (the evaluation "
                    "generates inputs without the GPU lease and moves them itself)")
        return values

    init_described = writer.describe_value(init_inputs)
    processes = request.get("input_processes")
    sets = describe_seeds(inputs_of, correctness_seeds + timing_seeds + bracket_seeds, writer,
                          int(processes) if processes is not None else None)
    timing_end = len(correctness_seeds) + len(timing_seeds)
    header = {
        "kind": "inputs",
        "version": 1,
        "init_seed": init_seed,
        "init_inputs": init_described,
        "correctness": sets[: len(correctness_seeds)],
        "timing": sets[len(correctness_seeds):timing_end],
        "bracket": sets[timing_end:],
        "deterministic": facts["deterministic"],
        "tolerance": facts["tolerance"],
    }
    writer.hash_tensors()  # the judge checks every tensor against these (in parallel)
    header["generate_ms"] = _ms(started)
    if request.get("header_digest"):
        # Segments of pieces, not joined: each kept segment is written from its pieces straight
        # to its file, and the server hashes the segments in parallel.
        segments = writer.segments(header)
        return [segments, sha256_bytes(segments[0].parts[0])]
    return writer.finish(header)


# --------------------------------------------------------------------------- 2. candidate


def _poison(device: str, nbytes: int) -> None:
    """Fill freed device memory with NaN so an output made of uninitialised memory is wrong."""
    if device != "cuda":
        return
    import torch

    count = max(min(nbytes, 1 << 30), 16 << 20) // 4
    block = torch.empty(count, dtype=torch.float32, device=device)
    block.fill_(float("nan"))
    del block


def _input_bytes(values: List[Any]) -> int:
    import torch

    return sum(v.numel() * v.element_size() for v in values if isinstance(v, torch.Tensor))


def _error(phase: str, exc: BaseException) -> Dict[str, Any]:
    message = str(exc)[:4000]
    if isinstance(exc, SystemExit):
        message = f"the candidate called sys.exit({exc.code!r})"
    return {"phase": phase, "type": type(exc).__name__, "message": message,
            "traceback": traceback.format_exc()[-8000:]}


# A verdict's timing on a GPU unless the request says otherwise: 10 warmup calls, then rounds of
# 20 until the median's 95 % CI half-width is within 0.5 % or a second has passed: a compute-bound
# kernel stops after one round, one whose time depends on where its inputs land at the second
# (decisions/eval-adaptive-timing.md).
EVAL_TIMING = {"warmup": 10, "repeat": 20, "adaptive": True, "target_rel_ci": 0.005,
               "budget_s": 1.0}


def timing_settings(timing: Optional[Dict[str, Any]], device: str) -> Dict[str, Any]:
    """The settings both models are timed with: on a GPU, adaptive (``EVAL_TIMING``, the
    request's keys over it) unless the request gives ``repeat`` without ``adaptive`` or sets
    ``adaptive`` false, which time that fixed count (the runtime's ``benchmark`` defaults for
    what it leaves out); on the CPU the request's settings as they are."""
    timing = dict(timing or {})
    if device != "cuda" or not timing.get("adaptive", "repeat" not in timing):
        return timing
    return {**EVAL_TIMING, **timing}


# The bracket's timing: at most this many warmup and timed calls (it bounds the verdict's
# interval, where its own interval counts as well; it need not be as long as the real ones).
BRACKET_WARMUP = 10
BRACKET_REPEAT = 50


def _bracket_settings(timing: Dict[str, Any], device: str) -> Dict[str, Any]:
    """The request's timing settings with a fixed count of at most BRACKET_WARMUP and
    BRACKET_REPEAT calls on a GPU (never adaptive); on the CPU, the request's or the defaults."""
    settings = {k: v for k, v in timing.items() if k not in ("adaptive", "target_rel_ci",
                                                             "budget_s")}
    if device == "cuda":
        settings["warmup"] = min(int(settings.get("warmup", BRACKET_WARMUP)), BRACKET_WARMUP)
        settings["repeat"] = min(int(settings.get("repeat", BRACKET_REPEAT)), BRACKET_REPEAT)
    return settings


def time_reference_bracket(reference_source: str, bundle: Bundle, request: Dict[str, Any],
                           device: str) -> Dict[str, Any]:
    """The reference timed on the bracket set, in the candidate's worker before the candidate's
    code is loaded: the same code in the same process as the candidate's timing, a second or two
    earlier. The judge times the reference again in its own worker; the two differ by what
    changed between workers and over time (clocks under a power cap, memory placement), which
    the verdict's interval then spans (eval_verdict.speedup_of). No output of the bracket set is
    checked anywhere, so nothing made here is worth anything to the candidate that loads next.
    ``{"timing": ...}`` or ``{"error": ...}``: a reference that fails here fails the judge too."""
    import torch

    head = bundle.header
    started = time.perf_counter()
    try:
        with torch.no_grad():
            module = load_source(reference_source, "reference_bracket")
            _require(module, ("Model",), "reference")
            model = _build_model(module.Model, bundle.value(head["init_inputs"]),
                                 int(head["init_seed"]), device)
            settings = _bracket_settings(timing_settings(request.get("timing"), device), device)
            rotation = Rotation(model, [bundle.value(d, device) for d in head["bracket"]])
            timing = time_model("reference_bracket", rotation, settings, device)
            del rotation, model
    except Exception as exc:
        return {"error": _error("reference_bracket", exc), "ms": _ms(started)}
    finally:
        sys.modules.pop("kcoral_eval_reference_bracket", None)
    if device == "cuda":
        torch.cuda.empty_cache()  # the candidate finds the allocator as it would without it
    timing.pop("receipt", None)  # the candidate's timing carries the receipt of this worker
    return {"timing": timing, "ms": _ms(started)}


def run_candidate(candidate_source: str, inputs: bytes, request_json: str,
                  *more_inputs: bytes) -> List[Chunks]:
    """Step 2 (module docstring): the outputs bundle, as its segments. ``inputs`` is the inputs
    bundle, or its first segment with the others in ``more_inputs`` (only a program's
    top-level arguments can be uploads). Exceptions of the candidate's code are reported in the
    bundle (``error``), so that the judge still gives a verdict. With ``bracket_reference``
    (the reference's source) in the request and a bracket set in the inputs, the reference is
    timed first (``time_reference_bracket``)."""
    import torch

    request = json.loads(request_json)
    bundle = Bundle([inputs, *more_inputs] if more_inputs else inputs)
    head = bundle.header
    device = _device()
    writer = BundleWriter(hashes=False)  # the judge reads the outputs' values, not their hashes
    phases: Dict[str, float] = {}
    result: Dict[str, Any] = {"kind": "candidate", "version": 1, "device": device,
                              "correctness": [], "timed": [], "timing": None,
                              "timed_calls": {}, "phases_ms": phases}
    tolerance = _tolerance(head.get("tolerance"), request.get("tolerance"))
    if isinstance(request.get("bracket_reference"), str) and head.get("bracket"):
        bracket = time_reference_bracket(request["bracket_reference"], bundle, request, device)
        phases["reference_bracket"] = bracket.pop("ms")
        result["reference_bracket"] = bracket
    phase = "load"
    watched = snapshot()
    try:
        with torch.no_grad():
            started = time.perf_counter()
            module = load_source(candidate_source, "candidate")
            # A file that defines only Model (the reference itself) is its own candidate.
            cls = getattr(module, "ModelNew", None) or getattr(module, "Model", None)
            if cls is None:
                raise ExecutionError("parse", "the candidate file defines no ModelNew")
            result["candidate_class"] = cls.__name__
            init_inputs = bundle.value(head["init_inputs"])
            model = _build_model(cls, init_inputs, int(head["init_seed"]), device)
            _sync(device)
            phases["candidate_load"] = _ms(started)

            phase = "correctness"
            started = time.perf_counter()
            for described in head["correctness"]:
                pristine = bundle.value(described, device)
                args = clone_value(pristine)
                _poison(device, 2 * _input_bytes(pristine))
                _sync(device)
                t0 = time.perf_counter()
                out = model(*args)
                # GPU: read on the caller's stream before any synchronize (stream_escape).
                early = capture_value(out) if device == "cuda" else None
                _sync(device)
                call_ms = _ms(t0)
                # Copied before any more candidate code runs: what the call returned is judged,
                # not what the candidate makes of that memory later (an alias it overwrites on
                # the next call, a lazy output finished afterwards).
                first = capture_value(out)
                del out
                stream_consistent = None if early is None else same_value(early, first)
                inputs_unchanged = same_value(args, pristine)
                first_output = writer.describe_value(first)
                again = clone_value(pristine)
                _poison(device, 2 * _input_bytes(pristine))
                out = model(*again)
                _sync(device)
                second = capture_value(out)
                del out
                result["correctness"].append({
                    "output": first_output,
                    "inputs_unchanged": inputs_unchanged and same_value(again, pristine),
                    "repeat_identical": same_value(first, second),
                    "stream_consistent": stream_consistent,
                    "call_ms": call_ms,
                })
                del early, first, second, args, again
            phases["candidate_correctness"] = _ms(started)

            phase = "timing"
            started = time.perf_counter()
            sets = [bundle.value(d, device) for d in head["timing"]]
            rotation = Rotation(model, sets, tolerance)
            result["timing"] = time_model("candidate", rotation,
                                          timing_settings(request.get("timing"), device), device)
            result["timed_calls"] = rotation.report()
            for k in range(len(sets)):
                if k in rotation.latest:
                    result["timed"].append({"set": k,
                                            "output": writer.describe_value(rotation.latest[k])})
            phases["candidate_timing"] = _ms(started)
    except (Exception, SystemExit) as exc:  # sys.exit() in the candidate's code: its failure
        result["error"] = _error(phase, exc)
    result["patched"] = changed(watched)
    # Assembling the bundle is the step's last work: its time cannot be in the bundle's own
    # header, so the client counts it in worker_start. Segments of its pieces, not joined: a
    # kept segment is written from them straight to its file (values.Chunks).
    return writer.segments(result)


# --------------------------------------------------------------------------- 3. judge


def _gpu_facts(device: str) -> Tuple[str, int]:
    import torch

    if device != "cuda":
        return "cpu", 0
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return str(props.name), int(getattr(props, "L2_cache_size", 0))


def _checked_inputs(inputs: Any, request: Dict[str, Any]) -> Bundle:
    """The inputs bundle (bytes, or its segments), if it is the one step 1 made: the SHA-256 of
    its header is ``inputs_header_sha256`` and every tensor has the SHA-256 the header states
    (checked on several threads); from a client that sends only ``inputs_sha256``, the whole
    bundle's."""
    refused = ExecutionError("correctness", "the inputs bundle is not the one the inputs step "
                                            "made (SHA-256 differs): refusing to judge")
    header_sha = request.get("inputs_header_sha256")
    try:
        bundle = Bundle(inputs)
    except BundleError:
        raise refused from None
    if header_sha is None:
        if bundle.sha256() != request.get("inputs_sha256"):
            raise refused
    elif sha256_bytes(bundle.prefix) != header_sha or not verify_tensors(bundle):
        raise refused
    return bundle


def judge(reference_source: str, inputs: bytes, outputs: bytes, request_json: str,
          *more: bytes) -> str:
    """Step 3 (module docstring): the verdict as JSON text. ``inputs`` and ``outputs`` are the
    two bundles, or their first segments: with ``inputs_segments`` (n) in the request,
    ``more`` holds the inputs' other n - 1 segments, then the outputs' others. ``request_json``:
    ``inputs_header_sha256`` (the SHA-256 of the header of what the client received from step
    1; or ``inputs_sha256``, of all of it), ``tolerance`` (atol/rtol override or null),
    ``determinism`` ("auto", "on", "off"), ``excessive_speedup``, ``timing`` settings."""
    import torch

    request = json.loads(request_json)
    phases: Dict[str, float] = {}
    started = time.perf_counter()
    if more:
        split = int(request.get("inputs_segments", 1)) - 1
        if not 0 <= split <= len(more):
            raise ExecutionError("parse", f"inputs_segments {split + 1} does not fit the "
                                          f"{len(more) + 2} bundle segments given")
        inputs = [inputs, *more[:split]] if split else inputs
        outputs = [outputs, *more[split:]] if split < len(more) else outputs
    bundle = _checked_inputs(inputs, request)
    candidate: Optional[Bundle] = None
    candidate_error: Optional[Dict[str, Any]] = request.get("candidate_failure")
    if candidate_error is None:
        try:
            candidate = Bundle(outputs)
        except BundleError as exc:
            candidate_error = {"phase": "outputs", "type": "BundleError", "message": str(exc),
                               "traceback": ""}
        else:
            candidate_error = candidate.header.get("error")
    head = bundle.header
    device = _device()
    phases["judge_decode"] = _ms(started)

    with torch.no_grad():
        started = time.perf_counter()
        module = load_source(reference_source, "reference")
        _require(module, ("Model", "get_inputs", "get_init_inputs"), "reference")
        facts = _problem_facts(module)
        model = _build_model(module.Model, bundle.value(head["init_inputs"]),
                             int(head["init_seed"]), device)
        _sync(device)
        phases["reference_load"] = _ms(started)
        override = _tolerance(facts["tolerance"], request.get("tolerance"))
        determinism = request.get("determinism", "auto")
        deterministic = facts["deterministic"] if determinism == "auto" else determinism == "on"

        started = time.perf_counter()
        expected_sets = []
        for described in head["correctness"]:
            expected_sets.append(model(*bundle.value(described, device)))
        timing_sets = [bundle.value(d, device) for d in head["timing"]]
        expected_timed = [model(*clone_value(s)) for s in timing_sets]
        _sync(device)
        phases["reference_outputs"] = _ms(started)

        started = time.perf_counter()
        correctness: List[Dict[str, Any]] = []
        timed: List[Dict[str, Any]] = []
        checks: List[Dict[str, Any]] = []
        chead: Dict[str, Any] = candidate.header if candidate is not None else {}
        for expected, got in zip(expected_sets, chead.get("correctness", [])):
            value = _value_or_none(candidate, got["output"], device)
            correctness.append(compare_values(expected, got["output"], value, override))
            checks.append(got)
        for entry in chead.get("timed", []):
            k = entry["set"]
            if isinstance(k, int) and 0 <= k < len(expected_timed):
                value = _value_or_none(candidate, entry["output"], device)
                timed.append(compare_values(expected_timed[k], entry["output"], value, override))
        if candidate_error is None and len(correctness) < len(expected_sets):
            candidate_error = {"phase": "outputs", "type": "MissingOutputs",
                               "message": f"{len(correctness)} of {len(expected_sets)} "
                                          "correctness outputs came back", "traceback": ""}
        phases["comparison"] = _ms(started)
        del expected_sets, expected_timed

        reference_timing = None
        candidate_timing = chead.get("timing")
        if candidate_timing is not None and candidate_error is None:
            started = time.perf_counter()
            rotation = Rotation(model, timing_sets, override)
            reference_timing = time_model("reference", rotation,
                                          timing_settings(request.get("timing"), device),
                                          device)
            phases["reference_timing"] = _ms(started)

    name, l2 = _gpu_facts(device)
    physics = floor_ms(name, l2, facts["flops"], facts["bytes"]) if device == "cuda" else None
    tolerances = {dt: tolerance_for(dt, override) for dt in _output_dtypes(correctness)}
    verdict = build_verdict(
        device=device,
        correctness=correctness,
        timed=timed,
        candidate_checks=checks,
        timed_calls=chead.get("timed_calls") or {},
        patched=chead.get("patched") or [],
        reference_timing=reference_timing,
        candidate_timing=candidate_timing,
        deterministic=deterministic,
        excessive_speedup=float(request.get("excessive_speedup", DEFAULT_EXCESSIVE_SPEEDUP)),
        physics=physics,
        tolerance={dt: {"atol": a, "rtol": r} for dt, (a, r) in tolerances.items()},
        error=candidate_error,
        # "missing": the client asked for a bracket and none came back (the report says so).
        bracket=chead.get("reference_bracket") or ("missing" if request.get("bracket") else None),
    )
    if candidate is not None and candidate.header.get("device") != device:
        verdict["correct"] = False
        verdict.setdefault("error", {"phase": "outputs", "type": "DeviceMismatch",
                                     "message": "the candidate ran on "
                                                f"{candidate.header.get('device')}, the judge on "
                                                f"{device}", "traceback": ""})
    verdict["worker_phases_ms"] = dict(
        generate=head.get("generate_ms"), **(chead.get("phases_ms") or {}), **phases)
    return json.dumps(_finite(verdict), allow_nan=False, default=str)


def _value_or_none(bundle: Optional[Bundle], described: Dict[str, Any], device: str) -> Any:
    """A candidate output to compare, on ``device`` (a CPU judge reads it in place: the
    comparison only reads it), or None when the bundle holds no such value."""
    if bundle is None:
        return None
    try:
        return bundle.value(described, device, writable=False)
    except BundleError:
        return None


def _output_dtypes(reports: List[Dict[str, Any]]) -> List[str]:
    seen: List[str] = []
    for report in reports:
        for tensor in report.get("tensors", []):
            dtype = tensor.get("dtype")
            if dtype and dtype not in seen:
                seen.append(dtype)
    return seen


def _finite(value: Any) -> Any:
    """The verdict with every NaN or infinity replaced by None (JSON has neither)."""
    if isinstance(value, float):
        return value if value == value and value not in (float("inf"), float("-inf")) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value
