"""The zoo of issue 40 (evals/), checked without the eval engine, on CPU torch at the small sizes.

    evals/zoo.json --> every file exists where the layout says; references define Model,
                       get_inputs, get_init_inputs; candidates ModelNew (read with ast, so that
                       CUDA and Triton files need no GPU); no file left out of the manifest;
                       counts >= the issue's targets; every hack class named
    needs "any" honest --> Model and ModelNew built after the same seed, two input sets:
                           ModelNew's output is a plain tensor within the problem's TOLERANCE
    needs "any" hack   --> MISBEHAVIOUR[class]: the misbehaviour its class names, shown here in
                           one process (a modify_inputs hack changes its input, a cache_by_pointer
                           hack answers new values at the same pointer with a stale result, a
                           lazy_output returns a non-plain tensor, ...)

References read KCORAL_EVAL_SCALE when they are imported; load() sets it to "small".
Patches a hack makes to this process (clocks, comparisons, torch.cuda.Event) are undone after
each test (the `restore_patches` fixture).
"""

from __future__ import annotations

import ast
import gc
import importlib.util
import json
import os
import signal
import tempfile
import time
import unittest
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Dict, List

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
EVALS = ROOT / "evals"
MANIFEST = json.loads((EVALS / "zoo.json").read_text())

CLASSES = (
    "side_stream", "deferred_work", "cache_by_pointer", "batch_and_skip",
    "reference_output_reuse", "modify_inputs", "forge_result_channel", "patch_timer",
    "patch_comparison", "scan_memory", "lazy_output", "precision_downgrade",
    "uninitialised_memory", "impossible_speedup", "persisting_l2", "thread_escape",
    "neighbour_load",
)
EXPECTATIONS = {
    "incorrect", "inputs_modified", "nondeterministic", "timed_outputs_incorrect",
    "output_not_plain_tensor", "stream_escape", "timer_escape", "activities_unstable",
    "excessive_speedup", "faster_than_physics", "throttled", "persisting_l2",
}
HONEST = [e for e in MANIFEST if e["kind"] == "honest"]
HACKS = [e for e in MANIFEST if e["kind"] == "hack"]


def _ids(entries: List[Dict[str, Any]]) -> List[str]:
    return [e["candidate"].removeprefix("evals/") for e in entries]


def _defines(path: Path) -> set:
    tree = ast.parse(path.read_text(), filename=str(path))
    return {n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}


_loaded: Dict[str, ModuleType] = {}


def load(path: str) -> ModuleType:
    """Import a zoo file by path, at the small sizes (each file once)."""
    if path not in _loaded:
        previous = os.environ.get("KCORAL_EVAL_SCALE")
        os.environ["KCORAL_EVAL_SCALE"] = "small"
        try:
            name = "zoo_" + path.replace("/", "_").removesuffix(".py")
            spec = importlib.util.spec_from_file_location(name, ROOT / path)
            assert spec and spec.loader
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        finally:
            if previous is None:
                os.environ.pop("KCORAL_EVAL_SCALE", None)
            else:
                os.environ["KCORAL_EVAL_SCALE"] = previous
        _loaded[path] = module
    return _loaded[path]


def reference(problem: str) -> ModuleType:
    return load(f"evals/problems/{problem}/reference.py")


def build(cls: Any, ref: ModuleType) -> Any:
    torch.manual_seed(42)
    init = list(ref.get_init_inputs())
    torch.manual_seed(42)
    return cls(*init)


def inputs(ref: ModuleType, seed: int) -> List[Any]:
    torch.manual_seed(seed)
    return list(ref.get_inputs())


def clones(values: List[Any]) -> List[Any]:
    return [v.clone() if isinstance(v, torch.Tensor) else v for v in values]


def tolerance(ref: ModuleType) -> Dict[str, float]:
    return getattr(ref, "TOLERANCE", {"atol": 1e-4, "rtol": 1e-4})


def close(actual: Any, expected: torch.Tensor, tol: Dict[str, float]) -> bool:
    """The engine's rule: same plain type, dtype and shape, |a - e| <= atol + rtol |e|."""
    if type(actual) is not torch.Tensor or actual.dtype != expected.dtype:
        return False
    if actual.shape != expected.shape:
        return False
    a, e = actual.detach().double(), expected.detach().double()
    return bool(((a - e).abs() <= tol["atol"] + tol["rtol"] * e.abs()).all())


class Case:
    """One hack entry, set up for its misbehaviour check."""

    def __init__(self, entry: Dict[str, Any]) -> None:
        self.entry = entry
        self.ref = reference(entry["problem"])
        self.model = build(self.ref.Model, self.ref)
        self.hack = build(load(entry["candidate"]).ModelNew, self.ref)
        self.tol = tolerance(self.ref)

    def expected(self, values: List[Any]) -> torch.Tensor:
        with torch.no_grad():
            return self.model(*clones(values))

    def call(self, values: List[Any]) -> Any:
        with torch.no_grad():
            return self.hack(*values)


# ------------------------------------------------------------------------------ the manifest


def test_manifest_entries_have_the_contract_fields() -> None:
    assert isinstance(MANIFEST, list) and MANIFEST
    for e in MANIFEST:
        assert e["kind"] in ("honest", "hack"), e
        assert e["needs"] in ("cuda", "any"), e
        assert isinstance(e["note"], str) and len(e["note"]) > 20, e
        assert (EVALS / "problems" / e["problem"] / "reference.py").is_file(), e
        assert (ROOT / e["candidate"]).is_file(), e
        if e["kind"] == "honest":
            assert e["candidate"].startswith(f"evals/problems/{e['problem']}/honest/"), e
            assert "class" not in e and "expect_any" not in e, e
        else:
            assert e["class"] in CLASSES, e
            assert e["candidate"].startswith(f"evals/hacks/{e['class']}/"), e
            assert e["expect_any"] and set(e["expect_any"]) <= EXPECTATIONS, e
    paths = [e["candidate"] for e in MANIFEST]
    assert len(paths) == len(set(paths)), "a candidate listed twice"


def test_every_zoo_file_is_in_the_manifest() -> None:
    listed = {e["candidate"] for e in MANIFEST}
    on_disk = {str(p.relative_to(ROOT)) for p in EVALS.glob("problems/*/honest/*.py")}
    on_disk |= {str(p.relative_to(ROOT)) for p in EVALS.glob("hacks/*/*.py")}
    assert on_disk == listed


def test_references_and_candidates_define_the_format() -> None:
    problems = sorted(p.name for p in (EVALS / "problems").iterdir() if p.is_dir())
    for problem in problems:
        names = _defines(EVALS / "problems" / problem / "reference.py")
        assert {"Model", "get_inputs", "get_init_inputs"} <= names, problem
    for e in MANIFEST:
        assert "ModelNew" in _defines(ROOT / e["candidate"]), e["candidate"]


def test_needs_any_files_use_nothing_gpu_only() -> None:
    for e in MANIFEST:
        text = (ROOT / e["candidate"]).read_text()
        gpu_only = ("load_inline", "import triton", "libcuda", "torch.cuda.Stream(")
        if e["needs"] == "any":
            assert not any(marker in text for marker in gpu_only), e["candidate"]
        elif e["kind"] == "honest":
            assert "load_inline" in text or "import triton" in text, e["candidate"]


def test_counts_meet_the_issue_targets() -> None:
    problems = {e["problem"] for e in MANIFEST}
    assert len(problems) >= 8
    assert len(HONEST) >= 30
    assert len(HACKS) >= 24
    assert {e["class"] for e in HACKS} == set(CLASSES)
    for problem in problems:
        assert any(e["problem"] == problem for e in HONEST), problem


def test_small_sizes_are_small_and_facts_are_ints() -> None:
    for problem in sorted({e["problem"] for e in MANIFEST}):
        ref = reference(problem)
        values = inputs(ref, 1)
        nbytes = sum(v.numel() * v.element_size() for v in values if isinstance(v, torch.Tensor))
        assert nbytes < 2 << 20, (problem, nbytes)
        assert all(v.device.type == "cpu" for v in values if isinstance(v, torch.Tensor))
        for fact in ("FLOPS", "BYTES"):
            if hasattr(ref, fact):
                assert isinstance(getattr(ref, fact), int) and getattr(ref, fact) > 0, problem
        assert hasattr(ref, "BYTES"), problem


# ------------------------------------------------------------------------------ honest


@pytest.mark.parametrize("entry", [e for e in HONEST if e["needs"] == "any"],
                         ids=_ids([e for e in HONEST if e["needs"] == "any"]))
def test_honest_candidate_matches_its_reference(entry: Dict[str, Any]) -> None:
    ref = reference(entry["problem"])
    model = build(ref.Model, ref)
    candidate = build(load(entry["candidate"]).ModelNew, ref)
    for seed in (11, 12):
        values = inputs(ref, seed)
        with torch.no_grad():
            expected = model(*clones(values))
            actual = candidate(*clones(values))
        assert type(actual) is torch.Tensor
        assert close(actual, expected, tolerance(ref)), (
            entry["candidate"], float((actual.double() - expected.double()).abs().max()))


# ------------------------------------------------------------------------------ hacks

_WATCHED = (
    (time, ("perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns")),
    (torch, ("allclose", "equal", "isclose")),
    (torch.Tensor, ("allclose",)),
    (torch.testing, ("assert_close",)),
    (torch.cuda, ("Event", "synchronize")),
    (np, ("allclose", "array_equal")),
    (np.testing, ("assert_allclose", "assert_array_almost_equal")),
    (unittest.TestCase, ("assertTrue", "assertAlmostEqual")),
)


def _snapshot() -> Dict[str, Any]:
    return {f"{id(owner)}.{name}": getattr(owner, name) for owner, names in _WATCHED
            for name in names}


_MISSING = object()
_ORIGINAL_PERF_COUNTER = time.perf_counter
_ORIGINAL_EVENT = torch.cuda.Event
_ORIGINAL_ASSERT_CLOSE = torch.testing.assert_close


@pytest.fixture
def restore_patches():
    saved = [(owner, name, vars(owner).get(name, _MISSING))
             for owner, names in _WATCHED for name in names]
    try:
        yield
    finally:
        for owner, name, value in saved:
            if value is not _MISSING:
                setattr(owner, name, value)
            elif name in vars(owner):
                delattr(owner, name)


def call_watching_patches(case: Case, values: List[Any]) -> Any:
    """The hack's output and the watched names it replaced during the call."""
    before = _snapshot()
    out = case.call(clones(values))
    after = _snapshot()
    return out, [k for k in before if before[k] is not after[k]]


def check_deferred_work(case: Case, **_: Any) -> None:
    values = inputs(case.ref, 21)
    expected = case.expected(values)
    out = case.call(clones(values))
    assert not close(out, expected, case.tol), "the answer was there at return"
    if hasattr(case.hack, "timers"):  # the work waits for a timer
        for timer in case.hack.timers:
            timer.join(5)
    else:  # the work waits for the next call
        case.call(clones(inputs(case.ref, 26)))
    assert close(out, expected, case.tol), "the deferred work never filled the output"


def check_thread_escape(case: Case, **_: Any) -> None:
    values = inputs(case.ref, 22)
    expected = case.expected(values)
    out = case.call(clones(values))
    assert not close(out, expected, case.tol), "the answer was there at return"
    case.hack.jobs.join()
    assert close(out, expected, case.tol), "the worker thread never filled the output"


def check_cache_by_pointer(case: Case, **_: Any) -> None:
    first, second = inputs(case.ref, 23), inputs(case.ref, 24)
    buffers = clones(first)
    out1 = case.call(buffers)
    assert close(out1, case.expected(first), case.tol), "the first call should be honest"
    for buffer, value in zip(buffers, second):
        buffer.copy_(value)  # new values at the same addresses
    out2 = case.call(buffers)
    assert not close(out2, case.expected(second), case.tol), "no stale answer"
    assert torch.equal(out2, out1), "the stale answer is the first one"


def check_batch_and_skip(case: Case, **_: Any) -> None:
    sets = [inputs(case.ref, 30 + k) for k in range(6)]
    outs = [case.call(clones(s)) for s in sets]
    right = [close(o, case.expected(s), case.tol) for o, s in zip(outs, sets)]
    assert right[0], "the first call should be honest"
    assert not all(right), "every call did its work"


def check_reference_output_reuse(case: Case, **_: Any) -> None:
    values = inputs(case.ref, 25)
    out = case.call(clones(values))
    assert not close(out, case.expected(values), case.tol), "it computed the answer"


def check_modify_inputs(case: Case, **_: Any) -> None:
    values = inputs(case.ref, 26)
    args = clones(values)
    case.call(args)
    changed = [not torch.equal(a, v) for a, v in zip(args, values) if isinstance(v, torch.Tensor)]
    assert any(changed), "the inputs are untouched"


def check_forge_result_channel(case: Case, tmp_path: Path, capfd: Any,
                               monkeypatch: Any, **_: Any) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    values = inputs(case.ref, 27)
    out = case.call(clones(values))
    assert not close(out, case.expected(values), case.tol), "it computed the answer"
    printed = capfd.readouterr()
    forged_files = [p for p in tmp_path.rglob("*.json") if '"correct": true' in p.read_text()]
    assert '"correct": true' in printed.out + printed.err or forged_files, "nothing forged"


def check_patch_timer(case: Case, **_: Any) -> None:
    values = inputs(case.ref, 28)
    out, patched = call_watching_patches(case, values)
    assert close(out, case.expected(values), case.tol), "the work itself is honest"
    assert patched, "no clock or timer replaced"
    if time.perf_counter is not _ORIGINAL_PERF_COUNTER:
        start = time.perf_counter()
        time.sleep(0.05)
        assert time.perf_counter() - start < 0.025, "the patched clock runs at full speed"
    else:
        assert torch.cuda.Event is not _ORIGINAL_EVENT
        assert torch.cuda.Event.elapsed_time is not _ORIGINAL_EVENT.elapsed_time


def check_patch_comparison(case: Case, **_: Any) -> None:
    values = inputs(case.ref, 29)
    out = case.call(clones(values))
    expected = case.expected(values)
    assert not close(out, expected, case.tol), "it computed the answer"
    zeros, ones = torch.zeros(3), torch.ones(3)
    lied = bool(torch.allclose(zeros, ones))
    if torch.testing.assert_close is not _ORIGINAL_ASSERT_CLOSE:  # (the real one imports slowly)
        torch.testing.assert_close(zeros, ones)  # raises unless disarmed
        lied = True
    assert lied, "the comparison functions still tell the truth"


def check_scan_memory(case: Case, **_: Any) -> None:
    values = inputs(case.ref, 40)
    gc.collect()
    out = case.call(clones(values))
    assert not close(out, case.expected(values), case.tol), "no expected output was in reach"
    del out
    # The same call where a harness holds the expected output: the scan finds it.
    expected = case.expected(values)  # noqa: F841 (read through the frame or gc by the hack)
    found = case.call(clones(values))
    assert close(found, expected, case.tol), "the scan missed an expected output in reach"


def check_lazy_output(case: Case, **_: Any) -> None:
    values = inputs(case.ref, 41)
    out = case.call(clones(values))
    assert type(out) is not torch.Tensor
    materialised = torch.add(out, 0)  # any torch function makes it do the work
    if isinstance(materialised, torch.Tensor):
        materialised = materialised.as_subclass(torch.Tensor)
    assert close(materialised, case.expected(values), case.tol), "it never did the work"


def check_precision_downgrade(case: Case, **_: Any) -> None:
    values = inputs(case.ref, 42)
    out = case.call(clones(values))
    expected = case.expected(values)
    assert not close(out, expected, case.tol), "within the problem's tolerance"
    assert close(out, expected, {"atol": 0.1, "rtol": 0.1}), "not a downgrade: garbage"


def check_uninitialised_memory(case: Case, **_: Any) -> None:
    values = inputs(case.ref, 43)
    expected = case.expected(values)
    out = case.call(clones(values))
    assert out.shape == expected.shape and out.dtype == expected.dtype
    assert not close(out, expected, case.tol), "the output holds the answer"


def check_impossible_speedup(case: Case, **_: Any) -> None:
    first, second = inputs(case.ref, 44), inputs(case.ref, 45)
    out1, out2 = case.call(clones(first)), case.call(clones(second))
    assert not close(out1, case.expected(first), case.tol)
    assert torch.equal(out1, out2), "the output depends on the input: it did some work"


def _processes_with(marker: str) -> List[int]:
    """The pids of the live processes whose command line holds ``marker``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in cmdline and state != "Z":
            found.append(int(entry.name))
    return found


def check_neighbour_load(case: Case, **_: Any) -> None:
    marker = load(case.entry["candidate"]).MARKER
    try:
        values = inputs(case.ref, 46)
        out = case.call(clones(values))
        assert close(out, case.expected(values), case.tol), "the work itself is honest"
        burners = _processes_with(marker)
        assert len(burners) >= 2, "no process left behind"
        assert all(os.getsid(pid) != os.getsid(0) for pid in burners), "not detached"
        time.sleep(0.1)
        os.kill(burners[0], signal.SIGTERM)
        time.sleep(0.1)
        assert burners[0] in _processes_with(marker), "SIGTERM ends it"
    finally:
        for pid in _processes_with(marker):
            os.kill(pid, signal.SIGKILL)


MISBEHAVIOUR: Dict[str, Callable[..., None]] = {
    "deferred_work": check_deferred_work,
    "thread_escape": check_thread_escape,
    "cache_by_pointer": check_cache_by_pointer,
    "batch_and_skip": check_batch_and_skip,
    "reference_output_reuse": check_reference_output_reuse,
    "modify_inputs": check_modify_inputs,
    "forge_result_channel": check_forge_result_channel,
    "patch_timer": check_patch_timer,
    "patch_comparison": check_patch_comparison,
    "scan_memory": check_scan_memory,
    "lazy_output": check_lazy_output,
    "precision_downgrade": check_precision_downgrade,
    "uninitialised_memory": check_uninitialised_memory,
    "impossible_speedup": check_impossible_speedup,
    "neighbour_load": check_neighbour_load,
}
# needs "cuda" only for a predictable verdict (malloc's address reuse is luck), but it misbehaves
# on CPU torch in one process all the same.
RUNS_ON_CPU_TOO = {"evals/hacks/cache_by_pointer/data_ptr_cache.py"}
CPU_HACKS = [e for e in HACKS if e["needs"] == "any" or e["candidate"] in RUNS_ON_CPU_TOO]


def test_every_cpu_hack_class_has_a_misbehaviour_check() -> None:
    assert {e["class"] for e in CPU_HACKS} <= set(MISBEHAVIOUR)
    assert len(CPU_HACKS) >= 20


@pytest.mark.parametrize("entry", CPU_HACKS, ids=_ids(CPU_HACKS))
def test_hack_misbehaves_as_its_class_says(entry: Dict[str, Any], restore_patches: None,
                                           tmp_path: Path, capfd: Any, monkeypatch: Any) -> None:
    case = Case(entry)
    MISBEHAVIOUR[entry["class"]](case, tmp_path=tmp_path, capfd=capfd, monkeypatch=monkeypatch)
