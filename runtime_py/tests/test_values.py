"""Unit tests of the result encoder (spec protocol §3.2) and its part files."""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from collections import OrderedDict
from pathlib import Path

import numpy
import pytest
import torch

from kcoral_runtime import values
from kcoral_runtime.errors import ExecutionError
from kcoral_runtime.values import DTYPE_ITEM_SIZES, PartStore, Results


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def results(tmp_path: Path) -> Results:
    return Results(str(tmp_path), torch.Tensor)


def part_bytes(res: Results, index: int) -> bytes:
    part = res.store.parts[index]
    assert part.path.endswith(f"part-{index}")
    data = Path(part.path).read_bytes()
    assert part.size == len(data) and part.sha256 == sha(data)
    return data


def test_scalars_and_nesting_exact_text(results: Results) -> None:
    results.return_value("a", None)
    results.return_value("b", True)
    results.return_value("c", -7)
    results.return_value("d", 1.5)
    results.return_value("e", "héllo ✓")
    results.return_value("f", [1, (2.0, "x"), {"k": [None]}])
    results.return_value("g", OrderedDict([("z", 1), ("a", False)]))
    assert results.text() == (
        '{"a":{"type":"null"},"b":{"type":"boolean","value":true},'
        '"c":{"type":"integer","value":-7},"d":{"type":"number","value":1.5},'
        '"e":{"type":"string","value":"héllo ✓"},'
        '"f":{"type":"array","value":[{"type":"integer","value":1},{"type":"array","value":'
        '[{"type":"number","value":2.0},{"type":"string","value":"x"}]},{"type":"object","value":'
        '{"k":{"type":"array","value":[{"type":"null"}]}}}]},'
        '"g":{"type":"object","value":{"z":{"type":"integer","value":1},'
        '"a":{"type":"boolean","value":false}}}}'
    )
    assert results.store.parts == []


def test_numpy_float64_is_a_number_but_numpy_int_is_not(results: Results) -> None:
    results.return_value("x", numpy.float64(0.25))
    assert json.loads(results.text())["x"] == {"type": "number", "value": 0.25}
    with pytest.raises(ExecutionError) as info:
        results.return_value("y", numpy.int64(3))
    assert (info.value.kind, info.value.message) == (
        "serialization", "cannot return value of type int64"
    )


def test_big_integers_keep_every_digit(results: Results) -> None:
    big = 3**20000  # more digits than Python's default int->str limit
    results.return_value("big", big)
    results.return_value("neg", -(2**70))
    text = results.text()
    limit = sys.get_int_max_str_digits()
    assert limit != 0  # the encoder restored the process-wide limit
    sys.set_int_max_str_digits(0)
    try:
        assert json.loads(text) == {
            "big": {"type": "integer", "value": big},
            "neg": {"type": "integer", "value": -(2**70)},
        }
    finally:
        sys.set_int_max_str_digits(limit)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_float_is_a_serialization_error(results: Results, bad: float) -> None:
    with pytest.raises(ExecutionError) as info:
        results.return_value("x", [1, bad])
    assert info.value.kind == "serialization"
    assert info.value.message == "cannot return a non-finite number"
    assert results.text() == "{}"


def test_non_str_keys_are_rejected(results: Results) -> None:
    with pytest.raises(ExecutionError) as info:
        results.return_value("x", {1: "a"})
    assert (info.value.kind, info.value.message) == (
        "serialization", "returned objects must have string keys"
    )


@pytest.mark.parametrize(
    "value, name",
    [(numpy.zeros(3), "ndarray"), (object(), "object"), (len, "builtin_function_or_method"),
     ({1, 2}, "set")],
)
def test_unsupported_types(results: Results, value: object, name: str) -> None:
    with pytest.raises(ExecutionError) as info:
        results.return_value("x", value)
    assert info.value.kind == "serialization"
    assert info.value.message == f"cannot return value of type {name}"


def test_lone_surrogate_string_is_rejected(results: Results) -> None:
    with pytest.raises(ExecutionError) as info:
        results.return_value("x", "bad\udc80")
    assert info.value.kind == "serialization"


def test_bytes_parts_are_numbered_depth_first_in_execution_order(results: Results) -> None:
    results.return_value("first", {"a": b"one", "b": [bytearray(b"two"), memoryview(b"three")]})
    results.return_value("second", b"")
    nodes = json.loads(results.text())
    assert nodes == {
        "first": {"type": "object", "value": {
            "a": {"type": "bytes", "part": "return:0", "sha256": sha(b"one")},
            "b": {"type": "array", "value": [
                {"type": "bytes", "part": "return:1", "sha256": sha(b"two")},
                {"type": "bytes", "part": "return:2", "sha256": sha(b"three")},
            ]},
        }},
        "second": {"type": "bytes", "part": "return:3", "sha256": sha(b"")},
    }
    assert [part_bytes(results, i) for i in range(4)] == [b"one", b"two", b"three", b""]
    assert results.store.binary_bytes == 11


def test_failed_return_rolls_back_its_parts(results: Results, tmp_path: Path) -> None:
    results.return_value("ok", b"keep")
    with pytest.raises(ExecutionError):
        results.return_value("bad", [b"dropped", b"dropped too", float("nan")])
    results.return_value("next", b"after")
    assert json.loads(results.text()) == {
        "ok": {"type": "bytes", "part": "return:0", "sha256": sha(b"keep")},
        "next": {"type": "bytes", "part": "return:1", "sha256": sha(b"after")},
    }
    assert sorted(os.listdir(tmp_path)) == ["part-0", "part-1"]
    assert part_bytes(results, 1) == b"after"
    assert results.store.binary_bytes == 9


def test_non_contiguous_memoryview(results: Results) -> None:
    view = memoryview(bytes(range(10)))[::2]
    results.return_value("x", view)
    assert part_bytes(results, 0) == bytes(range(0, 10, 2))


@pytest.mark.parametrize("dtype_name", sorted(DTYPE_ITEM_SIZES))
def test_tensor_dtypes(results: Results, dtype_name: str) -> None:
    dtype = getattr(torch, dtype_name)
    base = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    tensor = (base > 2) if dtype_name == "bool" else base.to(dtype)
    results.return_value("t", tensor.t())  # non-contiguous on purpose
    node = json.loads(results.text())["t"]
    expected = tensor.t().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    assert node == {"type": "tensor", "part": "return:0", "sha256": sha(expected),
                    "dtype": dtype_name, "shape": [3, 2]}
    assert len(expected) == 6 * DTYPE_ITEM_SIZES[dtype_name]
    assert part_bytes(results, 0) == expected


def test_bfloat16_bytes_are_little_endian_bf16(results: Results) -> None:
    results.return_value("t", torch.tensor([1.0, -2.0], dtype=torch.bfloat16))
    assert part_bytes(results, 0) == bytes([0x80, 0x3F, 0x00, 0xC0])


def test_tensor_scalar_empty_and_grad(results: Results) -> None:
    results.return_value("s", torch.tensor(7, dtype=torch.int64))
    results.return_value("e", torch.empty(0, 4))
    results.return_value("g", torch.ones(2, requires_grad=True) * 2)
    nodes = json.loads(results.text())
    assert nodes["s"]["shape"] == [] and part_bytes(results, 0) == (7).to_bytes(8, "little")
    assert nodes["e"]["shape"] == [0, 4] and part_bytes(results, 1) == b""
    assert nodes["g"]["dtype"] == "float32" and part_bytes(results, 2) == numpy.full(2, 2, "<f4").tobytes()


def test_unsupported_tensor_dtype(results: Results) -> None:
    with pytest.raises(ExecutionError) as info:
        results.return_value("t", torch.zeros(2, dtype=torch.complex64))
    assert (info.value.kind, info.value.message) == (
        "serialization", "cannot return tensor dtype 'complex64'"
    )
    assert results.store.parts == []


def test_cpu_workers_cannot_return_tensors(tmp_path: Path) -> None:
    res = Results(str(tmp_path), None)
    with pytest.raises(ExecutionError) as info:
        res.return_value("t", torch.zeros(2))
    assert info.value.message == "cannot return value of type Tensor"


def test_large_part_streams_in_chunks(results: Results) -> None:
    data = os.urandom(3 * values.CHUNK + 12345)
    results.return_value("big", data)
    assert part_bytes(results, 0) == data


def test_boundary_is_redrawn_when_a_part_contains_its_delimiter(tmp_path: Path) -> None:
    store = PartStore(str(tmp_path))
    first = store.boundary
    delim = values.delimiter(first)
    # Straddle a chunk border so the overlap logic has to find it.
    data = b"x" * (values.CHUNK - 5) + delim + b"tail"
    store.add_buffer(memoryview(data))
    store.add_buffer(memoryview(b"no delimiter here"))
    assert [p.collides for p in store.parts] == [True, False]
    final = store.final_boundary()
    assert final != first and final.startswith("kcoral-") and len(final) == 7 + 32
    assert all(c in "0123456789abcdef" for c in final[7:])
    for part in store.parts:
        assert values.delimiter(final) not in Path(part.path).read_bytes()


def test_boundary_is_kept_without_collision(tmp_path: Path) -> None:
    store = PartStore(str(tmp_path))
    first = store.boundary
    store.add_buffer(memoryview(b"--" + first.encode()))  # no CRLF before it: no delimiter
    assert store.final_boundary() == first


@pytest.mark.parametrize("where", ["start", "middle", "end", "none"])
def test_large_buffers_hash_write_and_scan_in_parallel(tmp_path: Path, where: str) -> None:
    store = PartStore(str(tmp_path))
    delim = values.delimiter(store.boundary)
    body = bytearray(os.urandom(values.PARALLEL_MIN_BYTES + 777))
    at = {"start": 0, "middle": len(body) // 2 - 3, "end": len(body) - len(delim)}.get(where)
    if at is not None:
        body[at : at + len(delim)] = delim
    data = bytes(body)  # a read-only buffer, as a returned bytes object
    index, part = store.add_buffer(memoryview(data))
    assert index == 0 and part.size == len(data) and part.sha256 == sha(data)
    assert Path(part.path).read_bytes() == data
    assert part.collides == (where != "none")


def test_parallel_writer_reports_write_errors_and_leaves_no_file(tmp_path: Path) -> None:
    store = PartStore(str(tmp_path / "missing-dir"))
    with pytest.raises(FileNotFoundError):
        store.add_buffer(memoryview(bytes(values.PARALLEL_MIN_BYTES)))
    assert store.parts == []


def test_large_tensor_return_round_trips(results: Results) -> None:
    tensor = torch.arange(values.PARALLEL_MIN_BYTES // 4 + 3, dtype=torch.float32)
    node = results.encoder.encode(tensor)
    data = part_bytes(results, 0)
    assert node["sha256"] == sha(data) and node["shape"] == [tensor.numel()]
    assert numpy.frombuffer(data, dtype=numpy.float32).tolist() == tensor.tolist()


class _BadStr(str):
    def __str__(self) -> str:
        raise RuntimeError("no text for you")


def test_values_that_fail_while_encoded_are_serialization_errors(results: Results) -> None:
    cycle: list = [1]
    cycle.append(cycle)
    for value, name in [(cycle, "RecursionError"), (_BadStr("x"), "RuntimeError")]:
        with pytest.raises(ExecutionError) as info:
            results.return_value("x", value)
        assert info.value.kind == "serialization"
        assert info.value.message.startswith(f"cannot return value: {name}: ")
    assert results.text() == "{}"


def test_kept_returns_are_written_apart_and_not_numbered(tmp_path: Path) -> None:
    res = Results(str(tmp_path), torch.Tensor, values.KeepPolicy(min_bytes=4, max_bytes=12))
    tensor = torch.arange(3, dtype=torch.int32)
    res.return_value("small", b"abc")  # under min_bytes: sent
    res.return_value("big", b"abcdefgh")  # kept
    res.return_value("tensor", tensor)  # kept: 12 bytes, but only 4 left of max_bytes -> sent
    res.return_value("last", b"wxyz")  # kept: fills max_bytes exactly
    nodes = json.loads(res.text())
    assert nodes["small"] == {"type": "bytes", "part": "return:0", "sha256": sha(b"abc")}
    big, last = res.store.kept
    # The server writes each value's digest over its placeholder (it hashes the bytes anyway).
    assert nodes["big"] == {"type": "kept", "kind": "bytes", "sha256": big.placeholder, "size": 8}
    assert nodes["tensor"]["type"] == "tensor" and nodes["tensor"]["part"] == "return:1"
    assert nodes["last"] == {"type": "kept", "kind": "bytes", "sha256": last.placeholder, "size": 4}
    assert big.placeholder != last.placeholder and res.text().count(big.placeholder) == 1
    assert re.fullmatch(r"kcoral-kept-[0-9a-f]{32}", big.placeholder)
    assert [k.wire() for k in res.store.kept] == [
        {"path": big.path, "size": 8, "placeholder": big.placeholder},
        {"path": last.path, "size": 4, "placeholder": last.placeholder},
    ]
    assert [Path(p.path).read_bytes() for p in res.store.kept] == [b"abcdefgh", b"wxyz"]
    assert [Path(p.path).name for p in res.store.kept] == ["kept-0", "kept-1"]
    assert res.store.binary_bytes == 3 + 12 and res.store.kept_bytes == 12


def test_chunks_are_one_bytes_value_kept_from_their_pieces_or_sent_joined(tmp_path: Path) -> None:
    res = Results(str(tmp_path), None, values.KeepPolicy(min_bytes=6, max_bytes=1 << 20))
    pieces = [b"head", memoryview(b""), bytearray(b"-body-"), memoryview(b"tail")]
    res.return_value("kept", values.Chunks(pieces))
    res.return_value("sent", values.Chunks([b"ab", b"c"]))  # under min_bytes
    nodes = json.loads(res.text())
    assert nodes["kept"] == {"type": "kept", "kind": "bytes",
                             "sha256": res.store.kept[0].placeholder, "size": 14}
    assert Path(res.store.kept[0].path).read_bytes() == b"head-body-tail"
    assert nodes["sent"] == {"type": "bytes", "part": "return:0", "sha256": sha(b"abc")}
    assert Path(res.store.parts[0].path).read_bytes() == b"abc"


def test_chunks_of_more_pieces_than_one_writev_takes(tmp_path: Path) -> None:
    res = Results(str(tmp_path), None, values.KeepPolicy(min_bytes=0, max_bytes=1 << 20))
    pieces = [bytes([k % 251]) * (k % 5) for k in range(3000)]
    res.return_value("kept", values.Chunks(pieces))
    assert Path(res.store.kept[0].path).read_bytes() == b"".join(pieces)
    assert res.store.kept[0].size == len(b"".join(pieces))


def test_kept_tensor_node_carries_dtype_and_shape(tmp_path: Path) -> None:
    res = Results(str(tmp_path), torch.Tensor, values.KeepPolicy(min_bytes=0, max_bytes=1 << 20))
    res.return_value("t", torch.ones(2, 3, dtype=torch.float16))
    data = torch.ones(2, 3, dtype=torch.float16).numpy().tobytes()
    assert json.loads(res.text())["t"] == {
        "type": "kept", "kind": "tensor", "sha256": res.store.kept[0].placeholder, "size": 12,
        "dtype": "float16", "shape": [2, 3],
    }
    assert Path(res.store.kept[0].path).read_bytes() == data


def test_failed_return_rolls_back_its_kept_parts(tmp_path: Path) -> None:
    res = Results(str(tmp_path), None, values.KeepPolicy(min_bytes=0, max_bytes=100))
    with pytest.raises(ExecutionError):
        res.return_value("bad", [b"kept then dropped", float("inf")])
    res.return_value("ok", b"kept")
    assert json.loads(res.text())["ok"]["type"] == "kept"
    assert sorted(os.listdir(tmp_path)) == ["kept-0"] and res.store.kept_bytes == 4


def test_large_chunks_sent_joined_are_the_pieces_in_order(tmp_path: Path) -> None:
    # 80 MiB in two pieces: the part file holds them in order.
    first, second = bytes([1]) * (40 << 20), bytes([2]) * (40 << 20)
    res = Results(str(tmp_path), None)
    res.return_value("sent", values.Chunks([first, memoryview(second)]))
    data = Path(res.store.parts[0].path).read_bytes()
    assert len(data) == 80 << 20 and data[: 40 << 20] == first and data[40 << 20:] == second
    assert json.loads(res.text())["sent"]["sha256"] == sha(first + second)
