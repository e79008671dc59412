"""The plain C ABI loader (kcoral_runtime.cabi) against host-only C libraries built with cc."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import numpy as np
import pytest
import torch

RUNTIME_DIR = Path(__file__).resolve().parents[1]
if str(RUNTIME_DIR) not in sys.path:
    sys.path.insert(0, str(RUNTIME_DIR))

from kcoral_runtime import cabi  # noqa: E402
from kcoral_runtime.errors import ExecutionError  # noqa: E402

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "cabi"


def _compiler() -> str:
    for candidate in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if candidate and shutil.which(candidate):
            return candidate
    raise AssertionError("no C compiler (cc, gcc, clang or $CC) to build the test libraries")


def build(source: str, out_dir: Path, name: str) -> Path:
    out = out_dir / f"lib{name}.so"
    cmd = [_compiler(), "-shared", "-fPIC", "-O1", "-std=c11", "-Wall", "-Werror",
           f"-I{FIXTURES}", str(FIXTURES / source), "-o", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stdout}{proc.stderr}"
    return out


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Path]:
    out = tmp_path_factory.mktemp("cabi")
    return {
        "inspect": build("inspect.c", out, "inspect"),
        "plain": build("plain.c", out, "plain"),
        "unresolved": build("unresolved.c", out, "unresolved"),
    }


@pytest.fixture(scope="module")
def lib(built: Dict[str, Path]) -> cabi.CLibrary:
    return cabi.load_library(str(built["inspect"]))


def describe(lib: cabi.CLibrary, value: object) -> Dict[str, object]:
    out = torch.full((40,), -99, dtype=torch.int64)
    lib.get_function("describe")(value, out)
    o = out.tolist()
    ndim = o[2]
    return {
        "device_type": o[0],
        "device_id": o[1],
        "ndim": ndim,
        "code": o[3],
        "bits": o[4],
        "lanes": o[5],
        "byte_offset": o[6],
        "data": o[7] & ((1 << 64) - 1),
        "shape": o[8 : 8 + ndim],
        "strides": o[8 + ndim : 8 + 2 * ndim],
    }


def gather(lib: cabi.CLibrary, value: object, n: int) -> List[float]:
    out = torch.zeros(n, dtype=torch.float64)
    lib.get_function("gather")(value, out)
    return out.tolist()


def torch_dlpack_view(t: torch.Tensor) -> Dict[str, object]:
    """What PyTorch's own DLPack exporter says about ``t`` (the reference we follow)."""
    capsule = torch.utils.dlpack.to_dlpack(t)
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = ctypes.c_void_p
    get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    d = cabi.DLTensor.from_address(get(capsule, b"dltensor"))  # DLManagedTensor starts with it
    view = {
        "device_type": d.device.device_type,
        "device_id": d.device.device_id,
        "ndim": d.ndim,
        "code": d.dtype.code,
        "bits": d.dtype.bits,
        "lanes": d.dtype.lanes,
        "byte_offset": d.byte_offset,
        "data": d.data or 0,
        "shape": [d.shape[i] for i in range(d.ndim)],
        "strides": [d.strides[i] for i in range(d.ndim)],
    }
    del capsule
    return view


# --------------------------------------------------------------------------- tensors


@pytest.mark.parametrize(
    "dtype,code,bits",
    [
        (torch.float32, 2, 32),
        (torch.int64, 0, 64),
        (torch.bfloat16, 4, 16),
        (torch.float16, 2, 16),
        (torch.float64, 2, 64),
        (torch.int32, 0, 32),
        (torch.int8, 0, 8),
        (torch.int16, 0, 16),
        (torch.uint8, 1, 8),
        (torch.bool, 6, 8),
        (torch.float8_e4m3fn, 10, 8),
        (torch.float8_e5m2, 12, 8),
        (torch.complex64, 5, 64),
    ],
)
def test_tensor_dtype_codes_match_torch_dlpack(lib: cabi.CLibrary, dtype, code, bits) -> None:
    t = torch.zeros((3, 5), dtype=dtype)
    got = describe(lib, t)
    assert (got["code"], got["bits"], got["lanes"]) == (code, bits, 1)
    assert got == torch_dlpack_view(t)


def test_contiguous_float32_tensor(lib: cabi.CLibrary) -> None:
    t = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4)
    got = describe(lib, t)
    assert got["device_type"] == cabi.KDL_CPU and got["device_id"] == 0
    assert got["ndim"] == 3 and got["shape"] == [2, 3, 4] and got["strides"] == [12, 4, 1]
    assert got["data"] == t.data_ptr() and got["byte_offset"] == 0
    assert gather(lib, t, 24) == [float(v) for v in range(24)]


def test_non_contiguous_views(lib: cabi.CLibrary) -> None:
    base = torch.arange(60, dtype=torch.int64).reshape(6, 10)
    view = base[1:5:2, 3::3]  # storage offset 13, strides (20, 3)
    got = describe(lib, view)
    assert got["shape"] == [2, 3] and got["strides"] == [20, 3]
    assert got["data"] == base.data_ptr() + 13 * 8 == view.data_ptr()
    assert got["byte_offset"] == 0
    assert got == torch_dlpack_view(view)
    assert gather(lib, view, 6) == [float(v) for v in view.flatten().tolist()]

    transposed = torch.arange(12, dtype=torch.float32).reshape(3, 4).t()
    got = describe(lib, transposed)
    assert got["shape"] == [4, 3] and got["strides"] == [1, 4]
    assert gather(lib, transposed, 12) == transposed.flatten().tolist()


def test_bfloat16_values(lib: cabi.CLibrary) -> None:
    values = [1.0, -2.5, 3.140625, 1024.0, -0.0078125, 0.5]
    t = torch.tensor(values, dtype=torch.bfloat16).reshape(2, 3)[:, 1:]
    got = describe(lib, t)
    assert (got["code"], got["bits"]) == (cabi.KDL_BFLOAT, 16)
    assert got["strides"] == [3, 1]
    assert gather(lib, t, 4) == [-2.5, 3.140625, -0.0078125, 0.5]


def test_zero_dim_and_empty_tensors(lib: cabi.CLibrary) -> None:
    scalar = torch.tensor(7.5, dtype=torch.float64)
    got = describe(lib, scalar)
    assert got["ndim"] == 0 and got["shape"] == [] and got["strides"] == []
    assert gather(lib, scalar, 1) == [7.5]
    empty = torch.empty((0, 4), dtype=torch.float32)
    got = describe(lib, empty)
    assert got["ndim"] == 2 and got["shape"] == [0, 4]
    assert gather(lib, empty, 1) == [0.0]  # nothing copied


def test_in_place_writes_are_visible(lib: cabi.CLibrary) -> None:
    add_one = lib.get_function("add_one_inplace")
    t = torch.zeros((4, 6), dtype=torch.float32)
    assert add_one(t) is None
    assert torch.equal(t, torch.ones((4, 6)))
    view = t[::2, 1::2]  # only these elements change
    add_one(view)
    expected = torch.ones((4, 6))
    expected[::2, 1::2] = 2.0
    assert torch.equal(t, expected)


def test_tensor_that_requires_grad_passes_its_storage(lib: cabi.CLibrary) -> None:
    t = torch.zeros(3, requires_grad=True)
    got = describe(lib, t)
    assert got["data"] == t.data_ptr()


def test_unsupported_tensors(lib: cabi.CLibrary) -> None:
    describe_fn = lib.get_function("describe")
    out = torch.zeros(40, dtype=torch.int64)
    with pytest.raises(ExecutionError) as info:
        describe_fn(torch.zeros(2, 2).to_sparse(), out)
    assert info.value.kind == "runtime" and "argument 0 of 'describe'" in info.value.message
    with pytest.raises(ExecutionError) as info:
        describe_fn(torch.zeros(2, dtype=torch.complex64).conj(), out)
    assert info.value.kind == "runtime" and "resolve_conj" in info.value.message
    with pytest.raises(ExecutionError) as info:
        describe_fn(torch.zeros(2, device="meta"), out)
    assert info.value.kind == "runtime" and "meta" in info.value.message


# --------------------------------------------------------------------------- numpy


@pytest.mark.parametrize(
    "dtype,code,bits",
    [
        (np.float32, 2, 32),
        (np.float64, 2, 64),
        (np.float16, 2, 16),
        (np.int64, 0, 64),
        (np.int32, 0, 32),
        (np.uint8, 1, 8),
        (np.bool_, 6, 8),
        (np.complex128, 5, 128),
    ],
)
def test_numpy_dtype_codes(lib: cabi.CLibrary, dtype, code, bits) -> None:
    a = np.zeros((2, 3), dtype=dtype)
    got = describe(lib, a)
    assert (got["device_type"], got["code"], got["bits"], got["lanes"]) == (1, code, bits, 1)
    assert got["shape"] == [2, 3] and got["strides"] == [3, 1]
    assert got["data"] == a.ctypes.data


def test_numpy_views_and_writes(lib: cabi.CLibrary) -> None:
    a = np.arange(30, dtype=np.int64).reshape(5, 6)
    view = a[1::2, ::-2]  # negative strides
    got = describe(lib, view)
    assert got["shape"] == [2, 3] and got["strides"] == [12, -2]
    assert got["data"] == view.__array_interface__["data"][0]
    assert gather(lib, view, 6) == [float(v) for v in view.ravel()]

    f = np.zeros((3, 4), dtype=np.float32)
    lib.get_function("add_one_inplace")(f[:, 1:3])
    expected = np.zeros((3, 4), dtype=np.float32)
    expected[:, 1:3] = 1
    assert np.array_equal(f, expected)


def test_numpy_unsupported(lib: cabi.CLibrary) -> None:
    out = torch.zeros(40, dtype=torch.int64)
    fn = lib.get_function("describe")
    for bad in (
        np.zeros(3, dtype=">f4"),  # non-native byte order
        np.array(["a", "b"]),  # unicode
        np.zeros(3, dtype=[("x", "<i4"), ("y", "<f4")]),  # structured
        np.array([object()]),
        np.zeros(2, dtype=np.longdouble),
    ):
        with pytest.raises(ExecutionError) as info:
            fn(bad, out)
        assert info.value.kind == "runtime", bad.dtype
        assert "numpy array" in info.value.message


def test_numpy_field_view_is_a_plain_strided_array(lib: cabi.CLibrary) -> None:
    structured = np.zeros(4, dtype=[("x", "<i4"), ("y", "<i4")])
    structured["y"] = [1, 2, 3, 4]
    got = describe(lib, structured["y"])
    assert got["code"] == cabi.KDL_INT and got["bits"] == 32 and got["strides"] == [2]
    assert gather(lib, structured["y"], 4) == [1.0, 2.0, 3.0, 4.0]
    packed = np.zeros(3, dtype=[("a", "u1"), ("b", "<i4")])  # b: byte stride 5
    with pytest.raises(ExecutionError) as info:
        describe(lib, packed["b"])
    assert "multiples of its item size" in info.value.message


# --------------------------------------------------------------------------- scalars


def test_scalars_in_order(lib: cabi.CLibrary) -> None:
    out = torch.zeros(6, dtype=torch.float64)
    lib.get_function("scalars")(3, 2.5, True, -1e300, None, False, out)
    assert out.tolist() == [3.0, 2.5, 1.0, -1e300, 1.0, 0.0]
    lib.get_function("scalars")(np.int32(-7), np.float32(0.25), np.bool_(True), 4.0, None, 9, out)
    assert out.tolist() == [-7.0, 0.25, 1.0, 4.0, 1.0, 9.0]


def test_scalar_non_null_pointer(lib: cabi.CLibrary) -> None:
    out = torch.zeros(6, dtype=torch.float64)
    lib.get_function("scalars")(0, 0.0, 0, 0.0, b"x", 0, out)
    assert out.tolist()[4] == 0.0  # bytes are a non-NULL pointer


@pytest.mark.parametrize("value", [0, 1, -1, 2**62, 2**63 - 1, -(2**63)])
def test_int64_range(lib: cabi.CLibrary, value: int) -> None:
    out = torch.zeros(1, dtype=torch.int64)
    lib.get_function("echo_int")(value, out)
    assert out.item() == value


def test_int_out_of_range(lib: cabi.CLibrary) -> None:
    out = torch.zeros(1, dtype=torch.int64)
    for value in (2**63, -(2**63) - 1):
        with pytest.raises(ExecutionError) as info:
            lib.get_function("echo_int")(value, out)
        assert info.value.kind == "runtime" and "int64_t" in info.value.message


@pytest.mark.parametrize("value", ["hello", "", "ünïcødé ✓", b"raw\xffbytes"])
def test_strings_and_bytes(lib: cabi.CLibrary, value) -> None:
    out = torch.zeros(64, dtype=torch.uint8)
    n = torch.zeros(1, dtype=torch.int64)
    lib.get_function("echo_string")(value, out, n)
    expected = value.encode("utf-8") if isinstance(value, str) else value
    assert bytes(out[: n.item()].tolist()) == expected


def test_bytes_stop_at_nul(lib: cabi.CLibrary) -> None:
    out = torch.zeros(64, dtype=torch.uint8)
    n = torch.zeros(1, dtype=torch.int64)
    lib.get_function("echo_string")(b"ab\x00cd", out, n)
    assert n.item() == 2  # documented: no length is passed


def test_unsupported_arguments(lib: cabi.CLibrary) -> None:
    fn = lib.get_function("echo_int")
    for bad in ([1, 2], {"a": 1}, (1,), bytearray(b"x"), 1j, object(), "\ud800"):
        with pytest.raises(ExecutionError) as info:
            fn(bad, torch.zeros(1, dtype=torch.int64))
        assert info.value.kind == "runtime"
        assert info.value.message.startswith("argument 0 of 'echo_int': cannot pass")


# --------------------------------------------------------------------------- errors


def test_non_zero_return_with_last_error(lib: cabi.CLibrary) -> None:
    with pytest.raises(ExecutionError) as info:
        lib.get_function("fail_with_message")(7)
    assert info.value.kind == "runtime"
    assert info.value.message == "fail_with_message: code 7"
    with pytest.raises(ExecutionError) as info:  # the library's own validation message
        lib.get_function("gather")(torch.zeros(3), torch.zeros(3, dtype=torch.float32))
    assert info.value.message == "gather: out must be a contiguous float64 vector"


def test_non_zero_return_with_null_last_error(lib: cabi.CLibrary) -> None:
    with pytest.raises(ExecutionError) as info:
        lib.get_function("fail_without_text")(3)
    assert info.value.message == "'fail_without_text' returned 3"


def test_non_zero_return_without_last_error_export(built: Dict[str, Path]) -> None:
    plain = cabi.load_library(str(built["plain"]))
    assert plain.get_function("plain_ok")() is None
    with pytest.raises(ExecutionError) as info:
        plain.get_function("plain_fail")(-2)
    assert info.value.kind == "runtime" and info.value.message == "'plain_fail' returned -2"


def test_missing_symbol(lib: cabi.CLibrary, built: Dict[str, Path]) -> None:
    with pytest.raises(ExecutionError) as info:
        lib.get_function("no_such_function")
    assert info.value.kind == "compile"
    assert info.value.message == "library exports no function 'no_such_function'"
    for bad in ("", "a\0b", "__init__"):
        with pytest.raises(ExecutionError) as info:
            lib.get_function(bad)
        assert info.value.kind == "compile"
    plain = cabi.load_library(str(built["plain"]))
    with pytest.raises(ExecutionError) as info:
        plain.get_function("packed_only")
    assert "__tvm_ffi_packed_only" in info.value.message and "tvm_ffi" in info.value.message


def test_non_elf_blob(tmp_path: Path) -> None:
    blob = tmp_path / "blob.so"
    blob.write_bytes(b"this is not an ELF shared object\n" * 10)
    with pytest.raises(ExecutionError) as info:
        cabi.load_library(str(blob))
    assert info.value.kind == "compile"
    assert info.value.message.startswith("cannot load library: ")
    assert "ELF" in info.value.message or "too short" in info.value.message


def test_empty_file_and_missing_file(tmp_path: Path) -> None:
    empty = tmp_path / "empty.so"
    empty.write_bytes(b"")
    for path in (empty, tmp_path / "does-not-exist.so"):
        with pytest.raises(ExecutionError) as info:
            cabi.load_library(str(path))
        assert info.value.kind == "compile"


def test_unresolved_symbol_fails_at_load(built: Dict[str, Path]) -> None:
    with pytest.raises(ExecutionError) as info:
        cabi.load_library(str(built["unresolved"]))
    assert info.value.kind == "compile"
    assert "kcoral_test_function_that_does_not_exist" in info.value.message


def test_unlink_after_load(built: Dict[str, Path], tmp_path: Path) -> None:
    copy = tmp_path / "copy.so"
    shutil.copyfile(built["inspect"], copy)
    loaded = cabi.load_library(str(copy))
    os.unlink(copy)
    t = torch.zeros(5)
    loaded.get_function("add_one_inplace")(t)
    assert t.tolist() == [1.0] * 5


def test_close(built: Dict[str, Path], tmp_path: Path) -> None:
    copy = tmp_path / "closing.so"
    shutil.copyfile(built["plain"], copy)
    loaded = cabi.load_library(str(copy))
    fn = loaded.get_function("plain_ok")
    loaded.close()
    loaded.close()  # idempotent
    assert loaded.closed
    with pytest.raises(ExecutionError) as info:
        fn()
    assert info.value.kind == "runtime"
    with pytest.raises(ExecutionError):
        loaded.get_function("plain_ok")
