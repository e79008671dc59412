"""kcoral eval's worker side without a server: bundles, comparison, timing rotation, verdicts,
and the three steps run in one process on the fixture problems of tests/fixtures/eval/.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

torch = pytest.importorskip("torch")

from kcoral_runtime import eval_worker  # noqa: E402
from kcoral_runtime import eval_compare  # noqa: E402
from kcoral_runtime.errors import ExecutionError  # noqa: E402
from kcoral_runtime.eval_bundle import (  # noqa: E402
    Bundle,
    BundleError,
    BundleWriter,
    sha256_many,
    sha256_tensor,
    verify_tensors,
)
from kcoral_runtime.eval_compare import (  # noqa: E402
    DEFAULT_TOLERANCES,
    compare_tensors,
    compare_values,
    tolerance_for,
)
from kcoral_runtime.eval_physics import floor_ms, peaks_for  # noqa: E402
from kcoral_runtime.eval_timing import (  # noqa: E402
    CPU_SLOTS, SLOTS, Rotation, same_value, time_model)
from kcoral_runtime.eval_verdict import FLAGS, bracket_report, build_verdict, speedup_of  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "eval"


# --------------------------------------------------------------------------- bundles


def test_bundle_round_trip_every_dtype_and_structure() -> None:
    writer = BundleWriter()
    values = [
        torch.randn(3, 4),
        torch.randn(2, 2).to(torch.bfloat16),
        torch.randn(5).half(),
        torch.arange(6, dtype=torch.int64).reshape(2, 3),
        torch.tensor([True, False]),
        torch.zeros(0, 3),
        torch.tensor(2.5),
        (torch.ones(2), 7, 1.5, None, "s"),
        float("nan"),
    ]
    desc = writer.describe_value(values)
    data = writer.finish({"kind": "test", "value": desc})
    bundle = Bundle(data)
    back = bundle.value(bundle.header["value"])
    for original, decoded in zip(values[:7], back[:7]):
        assert decoded.dtype == original.dtype and decoded.shape == original.shape
        assert torch.equal(decoded, original)
    assert torch.equal(back[7][0], torch.ones(2)) and back[7][1:] == (7, 1.5, None, "s")
    assert back[8] != back[8]  # NaN survives as a float
    # each tensor's SHA-256 is the SHA-256 of its raw bytes
    assert bundle.entries[0]["sha256"] == sha256_tensor(values[0])
    assert bundle.entries[0]["sha256"] == hashlib.sha256(values[0].numpy().tobytes()).hexdigest()


def test_bundle_marks_subclasses_and_objects_and_is_never_pickle() -> None:
    class Sub(torch.Tensor):
        pass

    writer = BundleWriter()
    sub = torch.ones(2).as_subclass(Sub)
    desc = writer.describe_value([sub, object()])
    assert desc["items"][0]["plain"] is False and desc["items"][0]["type"] == "Sub"
    assert desc["items"][1] == {"t": "other", "type": "object"}
    class Lying(torch.Tensor):  # its own view of itself through __torch_function__
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            return torch.zeros(2)

    lying = torch.full((2,), 7.0).as_subclass(Lying)
    described = writer.describe_value(lying)
    assert described["plain"] is False
    data = writer.finish({})
    assert b"pickle" not in data and data.startswith(b"KCEVAL1\n")
    assert torch.equal(Bundle(data).tensor(described["i"]), torch.full((2,), 7.0))
    assert type(Bundle(data).tensor(0)) is torch.Tensor


def test_bundle_hashes_every_tensor_and_verifies_them() -> None:
    writer = BundleWriter()
    values = [torch.randn(64, 32), torch.arange(10), torch.randn(5).half(), torch.zeros(0)]
    desc = writer.describe_value(values)
    bundle = Bundle(writer.finish({"value": desc}))
    for entry, value in zip(bundle.entries, values):
        assert entry["sha256"] == sha256_tensor(value)
    assert verify_tensors(bundle)
    blobs = [b"a", b"b" * 5000, b"c" * 70000]
    assert sha256_many(blobs) == [hashlib.sha256(b).hexdigest() for b in blobs]
    # One changed byte of any tensor fails the check.
    data = bytearray(writer.finish({"value": desc}))
    data[len(bundle.prefix) + bundle.entries[1]["offset"]] ^= 1
    assert not verify_tensors(Bundle(data))
    # A bundle written without hashes is never verified.
    plain = BundleWriter(hashes=False)
    plain.describe_value(torch.ones(3))
    assert not verify_tensors(Bundle(plain.finish({})))


def test_bundle_reads_in_place_when_not_writable() -> None:
    import numpy

    writer = BundleWriter(hashes=False)
    desc = writer.describe_value([torch.randn(8, 4), torch.arange(3)])
    data = bytes(writer.finish({}))
    bundle = Bundle(data)
    view = bundle.value(desc, writable=False)
    copy = bundle.value(desc)
    for i, (a, b) in enumerate(zip(view, copy)):
        assert torch.equal(a, b)
        start = numpy.frombuffer(bundle.raw(i), dtype=numpy.uint8).ctypes.data
        assert a.data_ptr() == start  # the bundle's own bytes
        assert b.data_ptr() != start  # a copy of them


def test_bundle_tensors_straight_to_another_device() -> None:
    # "meta" stands in for CUDA: the bytes go to the device without a host copy first.
    writer = BundleWriter(hashes=False)
    desc = writer.describe_value([torch.randn(3, 5).to(torch.bfloat16), torch.zeros(0, 2), 4])
    bundle = Bundle(writer.finish({}))
    assert bundle.entries[0]["sha256"] is None
    moved = bundle.value(desc, "meta")
    assert moved[0].device.type == "meta" and moved[0].dtype == torch.bfloat16
    assert moved[0].shape == (3, 5) and moved[1].device.type == "meta" and moved[2] == 4


@pytest.mark.parametrize("mutate, message", [
    (lambda d: b"NOTEVAL\n" + d[8:], "bad magic"),
    (lambda d: d[:-1], "outside the data"),
    (lambda d: d[:20], "runs past the end"),
])
def test_bundle_rejects_damage(mutate: Any, message: str) -> None:
    writer = BundleWriter()
    writer.describe_value(torch.ones(4))
    data = writer.finish({})
    with pytest.raises(BundleError, match=message):
        Bundle(mutate(data))


def test_bundle_checks_sizes_against_dtype_and_shape() -> None:
    writer = BundleWriter()
    writer.describe_value(torch.ones(4))
    data = writer.finish({})
    header = Bundle(data).header
    header["tensors"][0]["shape"] = [5]
    text = json.dumps(header).encode()
    forged = data[:8] + len(text).to_bytes(8, "little") + text + Bundle(data).raw(0).tobytes()
    with pytest.raises(BundleError, match="is not 16 bytes"):
        Bundle(forged)


def _segments_writer() -> Tuple[BundleWriter, Dict[str, Any]]:
    writer = BundleWriter()
    tensors = [torch.full((k + 1, 1000), float(k)) for k in range(6)]  # 4, 8, ... 24 kB
    return writer, {"kind": "test", "value": writer.describe_value(tensors)}


def test_bundle_segments_cut_between_pieces_and_read_as_the_whole() -> None:
    writer, header = _segments_writer()
    whole = bytes(writer.finish(header))
    for count in (1, 3, 4, 8, 20):
        segments = writer.segments(header, count, min_bytes=1)
        assert 1 <= len(segments) <= min(count, 7)  # the prefix and six tensors: 7 pieces
        assert b"".join(bytes(s.joined()) for s in segments) == whole
        assert bytes(segments[0].parts[0]) == bytes(Bundle(whole).prefix)
        joined = [s.joined() for s in segments]
        bundle = Bundle(joined)
        assert bundle.header == Bundle(whole).header and bundle.sha256() == _sha(whole)
        assert verify_tensors(bundle)
        for k, value in enumerate(bundle.value(bundle.header["value"])):
            assert torch.equal(value, torch.full((k + 1, 1000), float(k)))
    # Each segment near an equal share: four of 84 kB and a prefix: none over ~half.
    sizes = [s.nbytes for s in writer.segments(header, 4, min_bytes=1)]
    assert len(sizes) == 4 and max(sizes) <= len(whole) // 2
    # Shares under min_bytes: fewer segments, down to one for a small bundle.
    assert len(writer.segments(header, 8, min_bytes=40_000)) == 2
    assert len(writer.segments(header)) == 1


def test_bundle_segments_refuse_a_tensor_across_two_and_a_missing_header() -> None:
    writer, header = _segments_writer()
    whole = bytes(writer.finish(header))
    prefix = len(Bundle(whole).prefix)
    with pytest.raises(BundleError, match="spans two segments"):
        Bundle([whole[: prefix + 2000], whole[prefix + 2000:]])  # inside the first tensor
    with pytest.raises(BundleError, match="runs past the end of its first segment"):
        Bundle([whole[:prefix - 1], whole[prefix - 1:]])
    with pytest.raises(BundleError, match="no segments"):
        Bundle([])
    assert Bundle([whole[:prefix], whole[prefix:]]).header == Bundle(whole).header


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --------------------------------------------------------------------------- comparison


def test_default_tolerances_are_kernelbench_values() -> None:
    assert DEFAULT_TOLERANCES["float32"] == (1e-4, 1e-4)
    assert DEFAULT_TOLERANCES["float16"] == (1e-2, 1e-2)
    assert DEFAULT_TOLERANCES["bfloat16"] == (1e-2, 1e-2)
    assert tolerance_for("int32") == (0.0, 0.0)
    assert tolerance_for("float32", {"atol": 0.5}) == (0.5, 1e-4)
    assert tolerance_for("int64", {"atol": 0.5}) == (0.0, 0.0)  # integers stay exact


def test_compare_tensors_tolerance_edges() -> None:
    expected = torch.tensor([1.0, 100.0, 0.0])
    inside = expected + torch.tensor([1.9e-4, 1e-2, 9e-5])  # atol + rtol*|e| each
    outside = expected + torch.tensor([2.2e-4, 0.0, 0.0])
    assert compare_tensors(expected, inside, 1e-4, 1e-4)["match"]
    got = compare_tensors(expected, outside, 1e-4, 1e-4)
    assert not got["match"] and got["mismatched"] == 1 and got["first_mismatch"] == 0


def test_compare_tensors_nan_and_inf_aware() -> None:
    nan, inf = float("nan"), float("inf")
    expected = torch.tensor([nan, inf, -inf, 1.0])
    assert compare_tensors(expected, expected.clone(), 1e-4, 1e-4)["match"]
    for wrong in ([0.0, inf, -inf, 1.0], [nan, -inf, -inf, 1.0], [nan, inf, 1e30, 1.0],
                  [nan, inf, -inf, nan]):
        got = compare_tensors(expected, torch.tensor(wrong), 1e-4, 1e-4)
        assert not got["match"], wrong
        assert got["mismatched"] == 1


def _one_pass(expected: Any, actual: Any, atol: float, rtol: float) -> Dict[str, Any]:
    """compare_tensors' figures computed over whole tensors at once (the oracle)."""
    dtype = str(expected.dtype).replace("torch.", "")
    result: Dict[str, Any] = {}
    if expected.dtype.is_floating_point:
        e, a = expected.float(), actual.float()
        close = torch.isclose(a, e, rtol=rtol, atol=atol, equal_nan=True)
        finite = torch.isfinite(e) & torch.isfinite(a)
        diff = torch.where(finite, (a - e).abs(), torch.zeros_like(e))
        magnitude = e.abs()
        tiny = torch.finfo(torch.float32).tiny
        rel = torch.where(magnitude > 0, diff / magnitude.clamp_min(tiny), torch.zeros_like(e))
        result = {"max_abs_diff": float(diff.max()), "max_rel_diff": float(rel.max()),
                  "nan_expected": int(torch.isnan(e).sum()),
                  "nan_actual": int(torch.isnan(a).sum())}
    else:
        close = actual == expected
    mismatched = int((~close).sum())
    result.update({"dtype": dtype, "match": mismatched == 0, "mismatched": mismatched,
                   "elements": int(close.numel()), "atol": atol, "rtol": rtol})
    if mismatched:
        result["first_mismatch"] = int((~close).reshape(-1).nonzero()[0].item())
    return result


def test_compare_tensors_in_passes_equals_one_pass(monkeypatch: Any) -> None:
    """The CPU compares in passes of _CPU_CHUNK elements: the figures are those of one pass."""
    nan, inf = float("nan"), float("inf")
    expected = torch.randn(5, 23, generator=torch.Generator().manual_seed(1234)) * 3
    expected[1, 3] = nan
    expected[4, 0] = inf
    expected[0, 5] = 0.0
    actual = expected.clone()
    actual[3, 7] += 5.0  # in a later pass; a mismatch as int32 too, whatever the value
    actual[4, 9] = nan
    actual[0, 5] = 1e-3  # against an expected zero: no relative figure
    actual[2, 2] *= 1.5
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.int32):
        floating = dtype.is_floating_point
        e = expected.to(dtype) if floating else expected.nan_to_num().to(dtype)
        a = actual.to(dtype) if floating else actual.nan_to_num().to(dtype)
        oracle = _one_pass(e, a, 1e-4, 1e-4)
        assert not oracle["match"]
        for chunk in (1 << 20, 7, 1):
            monkeypatch.setattr(eval_compare, "_CPU_CHUNK", chunk)
            assert compare_tensors(e, a, 1e-4, 1e-4) == oracle, (dtype, chunk)
            assert compare_tensors(e, e.clone(), 1e-4, 1e-4) == _one_pass(e, e.clone(), 1e-4, 1e-4)
    monkeypatch.setattr(eval_compare, "_CPU_CHUNK", 7)
    got = compare_tensors(expected, actual, 1e-4, 1e-4)
    assert got["mismatched"] == 4 and got["first_mismatch"] == 5
    assert got["nan_expected"] == 1 and got["nan_actual"] == 2
    empty = compare_tensors(torch.zeros(0, 3), torch.zeros(0, 3), 1e-4, 1e-4)
    assert empty["match"] and empty["elements"] == 0 and empty["max_abs_diff"] == 0.0


def test_compare_values_structure_dtype_shape_device() -> None:
    writer = BundleWriter()

    def check(expected: Any, actual: Any) -> Dict[str, Any]:
        desc = writer.describe_value(actual)
        return compare_values(expected, desc, actual)

    e = torch.ones(2, 3)
    assert check(e, torch.ones(2, 3))["match"]
    assert "dtype float64" in check(e, torch.ones(2, 3, dtype=torch.float64))["reason"]
    assert "shape [3, 2]" in check(e, torch.ones(3, 2))["reason"]
    assert "expected a tensor, got a list of 1" in check(e, [torch.ones(2, 3)])["reason"]
    # What came instead of a tensor, in words.
    assert check(e, None)["reason"] == "output: expected a tensor, got None"
    assert check(e, 2.5)["reason"] == "output: expected a tensor, got float 2.5"
    assert check(e, {"y": e})["reason"] == "output: expected a tensor, got dict"
    assert check((e, e), e)["reason"] == \
        "output: expected a sequence of 2, got a Tensor of shape [2, 3] (float32)"
    assert "sequence of 2" in check((e, e), (e,))["reason"]
    assert check((e, 3), (torch.ones(2, 3), 3))["match"]
    lazy = check(e, object())
    assert not lazy["match"] and lazy["not_plain"]

    class Sub(torch.Tensor):
        pass

    sub = check(e, torch.ones(2, 3).as_subclass(Sub))
    assert sub["match"] and sub["not_plain"]
    desc = writer.describe_value(torch.ones(2, 3))
    desc["device"] = "cuda"
    assert "on cuda" in compare_values(e, desc, torch.ones(2, 3))["reason"]
    # Data that disagrees with its own description (or none at all) does not match.
    desc = writer.describe_value(torch.ones(2, 3))
    for data in (torch.ones(3, 2), torch.ones(2, 3, dtype=torch.float64), None):
        assert "its description names" in compare_values(e, desc, data)["reason"]


def test_compare_uses_override_and_half_precision_defaults() -> None:
    e = torch.ones(4, dtype=torch.float16)
    a = e + 5e-3
    writer = BundleWriter()
    desc = writer.describe_value(a)
    assert compare_values(e, desc, a)["match"]  # 1e-2 for float16
    assert not compare_values(e, desc, a, {"atol": 1e-3, "rtol": 1e-3})["match"]


# --------------------------------------------------------------------------- timing rotation


def test_rotation_places_per_device(monkeypatch: Any) -> None:
    # Twelve places where the sets sit on a GPU, three on the CPU (decisions/eval-rotation-places.md).
    assert Rotation(lambda x: x, [[torch.ones(2)], [1]]).slots == CPU_SLOTS == 3
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    assert Rotation(lambda x: x, [[1, (torch.ones(2),)]]).slots == SLOTS == 12


def test_rotation_gives_fresh_copies_and_checks_every_call() -> None:
    sets = [[torch.full((4,), float(k))] for k in range(3)]
    seen = []

    def fn(x: Any) -> Any:
        seen.append((x.data_ptr(), int(x[0])))
        return x * 2

    rotation = Rotation(fn, sets)
    result = time_model("t", rotation, {"warmup": 1, "repeat": 8}, "cpu")
    assert result["timing"] == "cpu" and result["samples"] == 8
    order = [k for _, k in seen]
    # Every round of three calls is an order of all three sets; never the same set twice in a
    # row, never the same address twice in a row.
    assert [sorted(order[i:i + 3]) for i in (0, 3, 6)] == [[0, 1, 2]] * 3
    assert all(order[i] != order[i + 1] for i in range(len(order) - 1))
    assert all(seen[i][0] != seen[i + 1][0] for i in range(len(seen) - 1))
    assert rotation.slots == CPU_SLOTS and len({ptr for ptr, _ in seen}) <= CPU_SLOTS
    assert rotation.report() == {"calls": 9, "inputs_modified": 0, "outputs_inconsistent": 0}
    assert sorted(rotation.latest) == [0, 1, 2]
    assert torch.equal(rotation.latest[2].data, torch.full((4,), 4.0))


def test_rotation_orders_differ_between_rounds() -> None:
    sets = [[torch.full((1,), float(k))] for k in range(3)]
    order = []
    rotation = Rotation(lambda x: order.append(int(x[0])) or x, sets)
    time_model("t", rotation, {"warmup": 0, "repeat": 60}, "cpu")
    rounds = {tuple(order[i:i + 3]) for i in range(0, 60, 3)}
    assert len(rounds) > 1  # one fixed order in 20 rounds: about 3e-16 by chance


def _pointer_cache() -> Any:
    cache: Dict[Any, Any] = {}

    def cached(x: Any) -> Any:
        key = (x.data_ptr(), tuple(x.shape))
        if key not in cache:
            cache[key] = x * 2
        return cache[key]

    return cached


@pytest.mark.parametrize("count", [2, 3])
def test_rotation_a_cache_keyed_by_pointer_meets_other_sets(count: int) -> None:
    # Which set sits at which address is random: an answer looked up by address is another
    # set's often enough to be caught, with two sets as with three. Each hit is wrong with
    # probability about 1/3 or more; 60 calls leave a miss about (2/3)^50 likely.
    sets = [[torch.full((256,), float(k))] for k in range(count)]
    rotation = Rotation(_pointer_cache(), sets)
    time_model("t", rotation, {"warmup": 0, "repeat": 60}, "cpu")
    assert rotation.outputs_inconsistent > 0


@pytest.mark.parametrize("count", [2, 3])
def test_verdict_flags_a_pointer_keyed_cache(monkeypatch: Any, tmp_path: Path, count: int) -> None:
    verdict = _evaluate(monkeypatch, tmp_path, "scale_add_reference.py",
                        "scale_add_pointer_cache.py", timing_sets=count,
                        timing={"warmup": 0, "repeat": 60})
    assert "timed_outputs_incorrect" in verdict["flags"], verdict["checks"]


def test_rotation_notices_modified_inputs_and_stale_outputs() -> None:
    sets = [[torch.full((4,), float(k))] for k in range(2)]
    cache: Dict[str, Any] = {}

    def cached(x: Any) -> Any:  # keyed by shape: the other set's output comes back
        return cache.setdefault("out", x * 2)

    rotation = Rotation(cached, sets)
    time_model("t", rotation, {"warmup": 0, "repeat": 6}, "cpu")
    assert rotation.outputs_inconsistent == 0  # each set always gets the same (wrong) tensor
    # One set's output is the other's: the judge's re-check catches it.
    right = [torch.equal(rotation.latest[k].data, torch.full((4,), 2.0 * k)) for k in (0, 1)]
    assert sorted(right) == [False, True]

    def in_place(x: Any) -> Any:
        return x.add_(1)

    rotation = Rotation(in_place, sets)
    time_model("t", rotation, {"warmup": 0, "repeat": 4}, "cpu")
    assert rotation.inputs_modified == 4


def test_rotation_keeps_outputs_as_returned() -> None:
    # One buffer, overwritten by every call: each call's output is kept as that call left it.
    sets = [[torch.full((4,), float(k))] for k in range(3)]
    buffer = torch.zeros(4)

    def reused(x: Any) -> Any:
        return torch.mul(x, 2, out=buffer)

    rotation = Rotation(reused, sets)
    time_model("t", rotation, {"warmup": 0, "repeat": 9}, "cpu")
    assert rotation.outputs_inconsistent == 0
    assert [float(rotation.latest[k].data[0]) for k in range(3)] == [0.0, 2.0, 4.0]


def test_a_patched_host_clock_does_not_change_cpu_timings(monkeypatch) -> None:
    # A candidate's slow_clocks-style patch, made after the runtime was imported (as candidate
    # code always is): the CPU path keeps the clock it bound at import.
    sets = [[torch.full((4,), float(k))] for k in range(2)]

    def slow(x: Any) -> Any:
        time.sleep(0.002)
        return x * 2

    monkeypatch.setattr(time, "perf_counter_ns", lambda: 0)
    result = time_model("t", Rotation(slow, sets), {"warmup": 0, "repeat": 6}, "cpu")
    assert result["latency_ms_median"] >= 1.5, result


def test_same_value_tolerance_and_nan() -> None:
    a = torch.tensor([1.0, float("nan")])
    assert same_value(a, a.clone())
    assert not same_value(a, a + 1e-6)
    assert same_value(a, a + 1e-6, None, exact=False)
    assert not same_value(a, a + 1e-3, None, exact=False)
    assert same_value(a, a + 1e-3, {"atol": 1e-2}, exact=False)
    assert not same_value(torch.ones(2), [torch.ones(2)])
    # Dicts of tensors compare by key and value (a deterministic dict output is not
    # "nondeterministic").
    assert same_value({"y": torch.ones(2)}, {"y": torch.ones(2)})
    assert not same_value({"y": torch.ones(2)}, {"y": torch.zeros(2)})
    assert not same_value({"y": torch.ones(2)}, {"z": torch.ones(2)})
    # NaN in both compares equal with a tolerance too.
    b = torch.tensor([1.0, float("nan"), 2.0])
    assert same_value(b, b.clone(), None, exact=False)
    assert not same_value(b, torch.tensor([1.0, 0.0, 2.0]), None, exact=False)


def test_timing_settings_gpu_defaults_and_overrides() -> None:
    defaults = eval_worker.timing_settings(None, "cuda")
    assert defaults == eval_worker.EVAL_TIMING and defaults["adaptive"] is True
    # A request's keys win; `repeat` alone is a fixed count, as is adaptive false.
    assert eval_worker.timing_settings({"warmup": 3}, "cuda") == dict(eval_worker.EVAL_TIMING,
                                                                       warmup=3)
    assert eval_worker.timing_settings({"repeat": 100}, "cuda") == {"repeat": 100}
    assert eval_worker.timing_settings({"adaptive": False}, "cuda") == {"adaptive": False}
    assert eval_worker.timing_settings({"repeat": 50, "adaptive": True}, "cuda") == dict(
        eval_worker.EVAL_TIMING, repeat=50)
    # The CPU path times a fixed count, as the request says.
    assert eval_worker.timing_settings(None, "cpu") == {}
    assert eval_worker.timing_settings({"repeat": 4}, "cpu") == {"repeat": 4}
    # The bracket takes the defaults as a fixed count of at most its bounds.
    bracket = eval_worker._bracket_settings(defaults, "cuda")
    assert bracket == {"warmup": 10, "repeat": 20}


# --------------------------------------------------------------------------- verdict


def _timing(median: float, ci: Any = None, **extra: Any) -> Dict[str, Any]:
    return dict({"latency_ms_median": median, "ci95_ms": ci}, **extra)


_OK = {"match": True, "not_plain": False, "tensors": []}
_CLEAN = dict(inputs_unchanged=True, repeat_identical=True, stream_consistent=True)


def _clean_verdict_args(reference_ci: Any, candidate_ci: Any) -> Dict[str, Any]:
    """build_verdict's arguments for a correct, unflagged candidate timed at 1.0 ms like its
    reference, with these intervals."""
    return dict(device="cuda", correctness=[_OK] * 3, timed=[_OK], candidate_checks=[_CLEAN] * 3,
                timed_calls={"calls": 10}, reference_timing=_timing(1.0, reference_ci),
                candidate_timing=_timing(1.0, candidate_ci), deterministic=True)


def test_verdict_flags_each_condition() -> None:
    ok, clean = _OK, _CLEAN
    base = _clean_verdict_args([0.9, 1.1], [0.95, 1.05])
    verdict = build_verdict(**base)
    assert verdict["correct"] and verdict["flags"] == []
    assert verdict["speedup"] == 1.0
    assert verdict["speedup_ci95"] == pytest.approx([0.9 / 1.05, 1.1 / 0.95])
    cases = {
        "inputs_modified": dict(candidate_checks=[dict(clean, inputs_unchanged=False)]),
        "nondeterministic": dict(candidate_checks=[dict(clean, repeat_identical=False)]),
        "timed_outputs_incorrect": dict(timed=[dict(ok, match=False, reason="x")]),
        "output_not_plain_tensor": dict(correctness=[dict(ok, not_plain=True)] * 3),
        "stream_escape": dict(candidate_checks=[dict(clean, stream_consistent=False)]),
        "timer_escape": dict(candidate_timing=_timing(1.0, escaped_work=True)),
        "timer_escape ": dict(patched=["time.perf_counter_ns"]),
        "activities_unstable": dict(candidate_timing=_timing(1.0, activities_stable=False)),
        "excessive_speedup": dict(candidate_timing=_timing(0.05)),
        "faster_than_physics": dict(physics={"floor_ms": 2.0}),
        "throttled": dict(reference_timing=_timing(1.0, throttled_calls=3)),
        "persisting_l2": dict(candidate_timing=_timing(1.0, persisting_l2_calls=5)),
    }
    assert sorted({c.strip() for c in cases}) == sorted(FLAGS)
    for flag, change in cases.items():
        got = build_verdict(**dict(base, **change))
        assert got["flags"] == [flag.strip()], (flag, got["flags"])
    nondet_allowed = build_verdict(**dict(base, deterministic=False, **cases["nondeterministic"]))
    assert nondet_allowed["flags"] == []
    inconsistent = build_verdict(**dict(base, timed_calls={"outputs_inconsistent": 1}))
    assert inconsistent["flags"] == ["timed_outputs_incorrect"]
    wrong = build_verdict(**dict(base, correctness=[ok, dict(ok, match=False, reason="r"), ok]))
    assert not wrong["correct"] and wrong["checks"]["correctness"]["reasons"] == ["r"]
    failed = build_verdict(**dict(base, error={"phase": "load"}))
    assert not failed["correct"]


def test_bracket_widens_the_interval_and_moves_nothing_else() -> None:
    """The reference timed in the candidate's worker widens speedup_ci95 to hold the speedup
    against it; the speedup, the flags and correctness stay the judge's, whatever it says."""
    base = _clean_verdict_args([0.99, 1.01], [0.98, 1.02])
    plain = build_verdict(**base)
    assert "reference_bracket" not in plain
    sampling = [0.99 / 1.02, 1.01 / 0.98]
    assert plain["speedup_ci95"] == pytest.approx(sampling)

    drifted = build_verdict(**base, bracket={"timing": _timing(1.03, [1.02, 1.04], samples=50)})
    assert drifted["speedup"] == 1.0 and drifted["flags"] == [] and drifted["correct"]
    assert drifted["speedup_ci95"] == pytest.approx([0.99 / 1.02, 1.04 / 0.98])
    report = drifted["reference_bracket"]
    assert report["used"] is True and report["median_ms"] == 1.03 and report["samples"] == 50
    assert report["drift"] == pytest.approx(0.03)
    assert report["speedup"] == pytest.approx(1.03)
    assert report["speedup_ci95_sampling"] == pytest.approx(sampling)
    # Inside the judge's interval already: nothing to widen.
    inside = build_verdict(**base, bracket={"timing": _timing(1.0, [0.995, 1.005])})
    assert inside["speedup_ci95"] == pytest.approx(sampling)

    # A forged bracket only widens: a tiny reference time cannot raise or hide a flag.
    forged = build_verdict(**dict(base, candidate_timing=_timing(0.05, [0.049, 0.051])),
                           bracket={"timing": _timing(1e-6, [1e-7, 1e-5])})
    assert forged["flags"] == ["excessive_speedup"] and forged["speedup"] == 20.0
    assert forged["speedup_ci95"][0] < 1e-3 and forged["speedup_ci95"][1] == pytest.approx(
        1.01 / 0.049)

    unusable = {
        "missing": "no bracket timing came back",
        "{}": "no bracket timing came back",
        '{"error": {"message": "boom"}}': "the reference failed in the candidate's worker: boom",
        '{"timing": {"latency_ms_median": -1, "ci95_ms": [1, 2]}}': "not a positive median",
        '{"timing": {"latency_ms_median": 1, "ci95_ms": [2, 1]}}': "not a positive median",
        '{"timing": {"latency_ms_median": true, "ci95_ms": [1, 2]}}': "not a positive median",
        '{"timing": {"latency_ms_median": 1, "ci95_ms": [1, "2"]}}': "not a positive median",
        '{"timing": "fast"}': "not a positive median",
    }
    for raw, reason in unusable.items():
        bracket = raw if raw == "missing" else json.loads(raw)
        if bracket == {}:
            bracket = None
        report, interval = bracket_report(bracket, base["reference_timing"],
                                          base["candidate_timing"], sampling)
        assert report["used"] is False and reason in report["reason"], (raw, report)
        assert interval == sampling
    # No timings (the candidate failed): no bracket part at all.
    failed = build_verdict(**dict(base, candidate_timing=None),
                           bracket={"timing": _timing(1.0, [0.9, 1.1])})
    assert "reference_bracket" not in failed


def test_speedup_without_intervals() -> None:
    assert speedup_of(_timing(2.0), _timing(1.0)) == (2.0, None)
    assert speedup_of({}, _timing(1.0)) == (None, None)


def test_physics_floor() -> None:
    assert peaks_for("NVIDIA H100 80GB HBM3") == (3.35e12, 3958e12)
    assert peaks_for("NVIDIA H100 PCIe")[0] == 2.0e12
    assert peaks_for("Some Other GPU") is None
    gemm = floor_ms("NVIDIA H200", 50 << 20, flops=2 * 4096**3, nbytes=3 * 4096 * 4096 * 4)
    assert gemm["floor_ms"] == pytest.approx(max(2 * 4096**3 / 3958e12,
                                                 (3 * 4096 * 4096 * 4 - (50 << 20)) / 4.8e12) * 1e3)
    assert floor_ms("unknown", 0, 1e9, None)["floor_ms"] is None


# --------------------------------------------------------------------------- the three steps


def _evaluate(monkeypatch: Any, tmp_path: Path, reference: str, candidate: str,
              timing_sets: int = 3, timing: Any = None, **judge: Any) -> Dict[str, Any]:
    monkeypatch.chdir(tmp_path)
    ref = (FIXTURES / reference).read_text()
    cand = (FIXTURES / candidate).read_text()
    seeds = {"correctness_seeds": ["101", "202", "303"],
             "timing_seeds": [str(404 + 101 * k) for k in range(timing_sets)], "init_seed": 42}
    inputs = eval_worker.generate_inputs(ref, json.dumps(seeds))
    settings = {"timing": timing or {"warmup": 1, "repeat": 6}}
    clock = time.perf_counter_ns  # a candidate may replace it; the judge is another process
    try:
        outputs = _run_candidate(cand, inputs, json.dumps(settings))
    finally:
        time.perf_counter_ns = clock
    request = dict(settings, inputs_header_sha256=_header_sha(inputs), **judge)
    return json.loads(eval_worker.judge(ref, inputs, outputs, json.dumps(request)))


def test_the_steps_pass_bundles_as_segments(monkeypatch: Any, tmp_path: Path) -> None:
    """As the client runs them with kept bundles: step 1 returns its segments and its header's
    digest, each segment is a separate upload (a top-level argument) of steps 2 and 3."""
    from kcoral_runtime import eval_bundle

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(eval_bundle, "SEGMENT_MIN_BYTES", 4096)  # the fixture's sets are small
    ref = (FIXTURES / "scale_add_reference.py").read_text()
    cand = (FIXTURES / "scale_add_honest.py").read_text()
    seeds = {"correctness_seeds": ["1", "2", "3"], "timing_seeds": ["4", "5"], "init_seed": 42,
             "header_digest": True}
    segments, header_sha = eval_worker.generate_inputs(ref, json.dumps(seeds))
    inputs = [segment.joined() for segment in segments]
    assert len(inputs) > 2 and header_sha == _sha(bytes(segments[0].parts[0]))
    settings = {"timing": {"warmup": 1, "repeat": 6}}
    outputs = _run_candidate(cand, inputs[0], json.dumps(settings), *inputs[1:])
    assert len(outputs) > 1
    request = dict(settings, inputs_header_sha256=header_sha, inputs_segments=len(inputs))
    verdict = json.loads(eval_worker.judge(ref, inputs[0], outputs[0], json.dumps(request),
                                           *inputs[1:], *outputs[1:]))
    assert verdict["correct"] is True and verdict["flags"] == []
    # A segment of the inputs swapped for another: not the bundle step 1 made.
    swapped = [inputs[0], inputs[2], inputs[1], *inputs[3:]]
    with pytest.raises(ExecutionError, match="not the one the inputs step made"):
        eval_worker.judge(ref, swapped[0], outputs[0], json.dumps(request), *swapped[1:],
                          *outputs[1:])
    with pytest.raises(ExecutionError, match="inputs_segments 99 does not fit"):
        eval_worker.judge(ref, inputs[0], outputs[0], json.dumps(dict(request, inputs_segments=99)),
                          *inputs[1:], *outputs[1:])


def _run_candidate(*args: Any) -> List[memoryview]:
    """Step 2's outputs bundle as the judge gets it: its segments, each one's pieces
    (values.Chunks) joined as uploads are."""
    return [segment.joined() for segment in eval_worker.run_candidate(*args)]


def _header_sha(inputs: Any) -> str:
    """What the client sends the judge: the SHA-256 of the bundle up to its header's end."""
    length = int.from_bytes(bytes(inputs[8:16]), "little")
    return hashlib.sha256(bytes(inputs[: 16 + length])).hexdigest()


def test_inputs_bundle_holds_no_seed_and_differs_per_seed(monkeypatch: Any, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    ref = (FIXTURES / "scale_add_reference.py").read_text()
    seeds = {"correctness_seeds": ["123456789123", "2", "3"], "timing_seeds": ["4"],
             "init_seed": 42}
    data = eval_worker.generate_inputs(ref, json.dumps(seeds))
    bundle = Bundle(data)
    assert b"123456789123" not in data
    sets = [bundle.value(d) for d in bundle.header["correctness"]]
    assert not torch.equal(sets[0][0], sets[1][0])
    torch.manual_seed(2)
    assert torch.equal(sets[1][0], torch.randn(64, 128))
    again = Bundle(eval_worker.generate_inputs(ref, json.dumps(seeds)))
    assert [e["sha256"] for e in again.entries] == [e["sha256"] for e in bundle.entries]


def test_inputs_step_seeds_only_the_cpu_generator(monkeypatch: Any, tmp_path: Path) -> None:
    """The step runs cpu_only: seeding the CUDA generators is a CUDA call where the worker's
    context exists (torch.manual_seed makes it at once then), a GPU access violation."""
    monkeypatch.chdir(tmp_path)

    def cuda_seed(*_: Any) -> None:
        raise AssertionError("the inputs step seeded a CUDA generator")

    monkeypatch.setattr(torch.cuda, "manual_seed_all", cuda_seed)
    monkeypatch.setattr(torch.cuda, "manual_seed", cuda_seed)
    ref = (FIXTURES / "scale_add_reference.py").read_text()
    seeds = {"correctness_seeds": ["1", "2", "3"], "timing_seeds": ["4"], "init_seed": 42}
    bundle = Bundle(eval_worker.generate_inputs(ref, json.dumps(seeds)))
    assert len(bundle.header["correctness"]) == 3


@pytest.mark.parametrize("reference, candidate, correct, flags", [
    ("scale_add_reference.py", "scale_add_honest.py", True, []),
    ("scale_add_reference.py", "scale_add_reference.py", True, []),
    ("scale_add_reference.py", "scale_add_wrong.py", False, ["timed_outputs_incorrect"]),
    ("scale_add_reference.py", "scale_add_in_place.py", True, ["inputs_modified"]),
    ("scale_add_reference.py", "scale_add_jitter.py", True, ["nondeterministic"]),
    ("scale_add_reference.py", "scale_add_shape_cache.py", False, ["timed_outputs_incorrect"]),
    ("scale_add_reference.py", "scale_add_late_cache.py", True, ["timed_outputs_incorrect"]),
    ("scale_add_reference.py", "scale_add_subclass.py", True, ["output_not_plain_tensor"]),
    # One output buffer for every call: each output is judged as its call returned it.
    ("scale_add_reference.py", "scale_add_reused_buffer.py", True, []),
    # Returns zeros, fills them in on the next call: judged as returned.
    ("scale_add_reference.py", "scale_add_fill_on_next_call.py", False,
     ["nondeterministic", "timed_outputs_incorrect"]),
    ("scale_add_slow_reference.py", "scale_add_honest.py", True, ["excessive_speedup"]),
    ("linear_reference.py", "linear_honest.py", True, []),
    ("linear_reference.py", "linear_own_weights.py", False, ["timed_outputs_incorrect"]),
    # The patch is flagged; the CPU timer bound its clock at import, so the time stays honest.
    ("scale_add_reference.py", "scale_add_patch_timer.py", True, ["timer_escape"]),
])
def test_steps_on_fixtures(monkeypatch: Any, tmp_path: Path, reference: str, candidate: str, correct: bool,
                           flags: list) -> None:
    verdict = _evaluate(monkeypatch, tmp_path, reference, candidate)
    assert verdict["correct"] is correct, verdict["checks"]
    assert verdict["flags"] == flags
    assert verdict["device"] == "cpu" and verdict["candidate"]["timing"] == "cpu"
    assert verdict["checks"]["correctness"]["sets"] == 3


def test_judge_refuses_swapped_inputs(monkeypatch: Any, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    ref = (FIXTURES / "scale_add_reference.py").read_text()
    seeds = {"correctness_seeds": ["1", "2", "3"], "timing_seeds": ["4"], "init_seed": 42}
    inputs = eval_worker.generate_inputs(ref, json.dumps(seeds))
    header_sha = _header_sha(inputs)
    with pytest.raises(Exception, match="SHA-256 differs"):
        eval_worker.judge(ref, inputs, b"", json.dumps({"inputs_sha256": "0" * 64}))
    with pytest.raises(Exception, match="SHA-256 differs"):
        eval_worker.judge(ref, inputs, b"", json.dumps({"inputs_header_sha256": "0" * 64}))
    # A tensor's bytes changed after step 1 (the header, and so its digest, unchanged).
    tampered = bytearray(inputs)
    tampered[-1] ^= 1
    assert _header_sha(tampered) == header_sha
    with pytest.raises(Exception, match="SHA-256 differs"):
        eval_worker.judge(ref, bytes(tampered), b"",
                          json.dumps({"inputs_header_sha256": header_sha}))
    with pytest.raises(Exception, match="SHA-256 differs"):
        eval_worker.judge(ref, b"not a bundle", b"",
                          json.dumps({"inputs_header_sha256": header_sha}))
    # The bundle as made passes both checks (a candidate failure still gives a verdict).
    failure = {"phase": "candidate", "type": "runtime", "message": "died", "traceback": ""}
    for check in ({"inputs_header_sha256": header_sha},
                  {"inputs_sha256": hashlib.sha256(inputs).hexdigest()}):
        verdict = json.loads(eval_worker.judge(ref, inputs, b"", json.dumps(
            dict(check, candidate_failure=failure))))
        assert verdict["correct"] is False and verdict["error"]["message"] == "died"


@pytest.mark.parametrize("returns", ["None", "torch.randn(4)", "3"])
def test_inputs_step_refuses_get_inputs_that_is_no_list(monkeypatch: Any, tmp_path: Path,
                                                          returns: str) -> None:
    monkeypatch.chdir(tmp_path)
    ref = (FIXTURES / "scale_add_reference.py").read_text().replace(
        "    return [torch.randn(64, 128), torch.randn(64, 128)]", f"    return {returns}")
    seeds = {"correctness_seeds": ["1", "2", "3"], "timing_seeds": ["4"], "init_seed": 42}
    with pytest.raises(ExecutionError, match=r"get_inputs\(\) must return a list or tuple of "
                                             r"arguments, not (NoneType|Tensor|int)$"):
        eval_worker.generate_inputs(ref, json.dumps(seeds))


# The fixture's reference, each call appending its first input's first value to a file.
_COUNTING_REFERENCE = (FIXTURES / "scale_add_reference.py").read_text().replace(
    "        return x * self.alpha + y",
    "        with open('reference_calls', 'a') as f:\n"
    "            f.write(f'{float(x[0, 0])}\\n')\n"
    "        return x * self.alpha + y")

# Imported by the candidate's worker after the bracket: what the reference had run by then.
_CANDIDATE_SEEING_CALLS = """
import os
CALLS_AT_IMPORT = open("reference_calls").read().split() if os.path.exists("reference_calls") else []
with open("candidate_saw", "w") as f:
    f.write(" ".join(CALLS_AT_IMPORT))
""" + (FIXTURES / "scale_add_honest.py").read_text()


def test_bracket_times_the_reference_on_its_own_set_before_the_candidate_loads(
        monkeypatch: Any, tmp_path: Path) -> None:
    import sys

    monkeypatch.chdir(tmp_path)
    seeds = {"correctness_seeds": ["1", "2", "3"], "timing_seeds": ["4", "5"], "init_seed": 42,
             "bracket_seed": "6"}
    inputs = eval_worker.generate_inputs(_COUNTING_REFERENCE, json.dumps(seeds))
    head = Bundle(inputs).header
    assert len(head["bracket"]) == 1 and len(head["timing"]) == 2
    bundle = Bundle(inputs)
    bracket_set = bundle.value(head["bracket"][0])
    torch.manual_seed(6)
    assert torch.equal(bracket_set[0], torch.randn(64, 128))  # its own seed, made like the others
    for d in head["correctness"] + head["timing"]:
        assert not torch.equal(bundle.value(d)[0], bracket_set[0])
    no_bracket = dict(seeds)
    del no_bracket["bracket_seed"]
    assert Bundle(eval_worker.generate_inputs(_COUNTING_REFERENCE, json.dumps(no_bracket))
                  ).header["bracket"] == []

    request = {"timing": {"warmup": 1, "repeat": 6}, "bracket_reference": _COUNTING_REFERENCE}
    outputs = _run_candidate(_CANDIDATE_SEEING_CALLS, inputs, json.dumps(request))
    # 7 calls (1 warmup + 6 timed), every one on the bracket set, all before the candidate
    # was imported; the reference's module is gone from sys.modules by then.
    seen = (tmp_path / "candidate_saw").read_text().split()
    assert seen == [str(float(bracket_set[0][0, 0]))] * 7
    assert "kcoral_eval_reference_bracket" not in sys.modules
    chead = Bundle(outputs).header
    assert chead["reference_bracket"]["timing"]["samples"] == 6
    assert "receipt" not in chead["reference_bracket"]["timing"]
    assert chead["phases_ms"]["reference_bracket"] > 0

    # The counting reference writes a file per call, so on a loaded CPU it can read 10x slower
    # than the candidate: the bracket is checked here, not that flag.
    verdict = json.loads(eval_worker.judge(_COUNTING_REFERENCE, inputs, outputs, json.dumps(
        dict(request, inputs_header_sha256=_header_sha(inputs), bracket=True,
             excessive_speedup=1e6))))
    assert verdict["correct"] and verdict["flags"] == []
    report = verdict["reference_bracket"]
    assert report["used"] is True and report["median_ms"] > 0
    low, high = verdict["speedup_ci95"]
    assert low <= report["speedup_ci95_sampling"][0] and high >= report["speedup_ci95_sampling"][1]
    assert low <= report["speedup_ci95"][0] and high >= report["speedup_ci95"][1]

    # Asked for and not delivered (a candidate worker that dropped it): the verdict says so.
    forged = Bundle(outputs)
    header = dict(forged.header)
    del header["reference_bracket"]
    writer = BundleWriter(hashes=False)
    header["correctness"] = [dict(c, output=writer.describe_value(forged.value(c["output"])))
                             for c in header["correctness"]]
    header["timed"] = [dict(t, output=writer.describe_value(forged.value(t["output"])))
                       for t in header["timed"]]
    dropped = json.loads(eval_worker.judge(_COUNTING_REFERENCE, inputs, writer.finish(header),
                                           json.dumps(dict(request, bracket=True,
                                                           inputs_header_sha256=_header_sha(inputs)))))
    assert dropped["reference_bracket"] == {"used": False, "reason": "no bracket timing came back"}
    assert dropped["speedup_ci95"] == pytest.approx(
        speedup_of(dropped["reference"], dropped["candidate"])[1])  # sampling alone


def test_a_failing_reference_in_the_bracket_leaves_the_candidate_judged(
        monkeypatch: Any, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    ref = (FIXTURES / "scale_add_reference.py").read_text()
    seeds = {"correctness_seeds": ["1", "2", "3"], "timing_seeds": ["4"], "init_seed": 42,
             "bracket_seed": "5"}
    inputs = eval_worker.generate_inputs(ref, json.dumps(seeds))
    broken = ref.replace("return x * self.alpha + y", "raise ValueError('bracket only')")
    request = {"timing": {"warmup": 1, "repeat": 3}, "bracket_reference": broken}
    outputs = _run_candidate((FIXTURES / "scale_add_honest.py").read_text(), inputs,
                                        json.dumps(request))
    verdict = json.loads(eval_worker.judge(ref, inputs, outputs, json.dumps(
        dict(request, bracket=True, inputs_header_sha256=_header_sha(inputs)))))
    assert verdict["correct"] and verdict["flags"] == []
    assert verdict["reference_bracket"]["used"] is False
    assert "bracket only" in verdict["reference_bracket"]["reason"]


def test_candidate_errors_become_incorrect_verdicts(monkeypatch: Any, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    ref = (FIXTURES / "scale_add_reference.py").read_text()
    seeds = {"correctness_seeds": ["1", "2", "3"], "timing_seeds": ["4"], "init_seed": 42}
    inputs = eval_worker.generate_inputs(ref, json.dumps(seeds))
    sha = hashlib.sha256(inputs).hexdigest()
    for source, phase in [("raise RuntimeError('boom')\n", "load"),
                          ("class ModelNew:\n    def __init__(self, a): pass\n"
                           "    def __call__(self, x, y): raise ValueError('no')\n", "correctness"),
                          ("x = 1\n", "load"),
                          ("import sys\nsys.exit(0)\n", "load"),
                          ("class ModelNew:\n    def __init__(self, a): pass\n"
                           "    def __call__(self, x, y): raise SystemExit(3)\n", "correctness")]:
        outputs = _run_candidate(source, inputs, "{}")
        verdict = json.loads(eval_worker.judge(ref, inputs, outputs,
                                               json.dumps({"inputs_sha256": sha})))
        assert verdict["correct"] is False and verdict["error"]["phase"] == phase
        if "exit" in source or "SystemExit" in source:
            assert verdict["error"]["type"] == "SystemExit"
            assert verdict["error"]["message"].startswith("the candidate called sys.exit(")
        assert verdict["candidate"] is None and verdict["reference"] is None
    crashed = json.loads(eval_worker.judge(ref, inputs, b"", json.dumps({
        "inputs_sha256": sha,
        "candidate_failure": {"phase": "candidate", "type": "runtime", "message": "died",
                              "traceback": ""}})))
    assert crashed["correct"] is False and crashed["error"]["message"] == "died"


def test_integrity_notices_replaced_functions_and_code(monkeypatch: Any) -> None:
    from kcoral_runtime import benchmarking, eval_integrity

    before = eval_integrity.snapshot()
    assert "kcoral_runtime.benchmarking.measure" in before and "time.perf_counter" in before
    assert eval_integrity.changed(before) == []
    monkeypatch.setattr(time, "perf_counter", lambda: 0.0)
    monkeypatch.setattr(benchmarking.measure, "__code__", (lambda *a, **k: {}).__code__)
    monkeypatch.setattr(torch.Tensor, "clone", lambda self: self)
    assert eval_integrity.changed(before) == ["kcoral_runtime.benchmarking.measure",
                                              "time.perf_counter", "torch.Tensor.clone"]
