"""Uploaded libraries through a documented plain C ABI, for workers without ``tvm_ffi``.

The ABI is specified in ``docs/c-abi.md``. In short: every exported function has the C
signature ``int name(<args>)``; each argument of the ``run`` call is passed as

* ``torch.Tensor`` / ``numpy.ndarray``  -> ``DLTensor*`` (DLPack; valid only during the call),
* ``bool`` / ``int`` (and numpy integer/bool scalars) -> ``int64_t``,
* ``float`` (and numpy floating scalars) -> ``double``,
* ``str`` -> ``const char*`` (UTF-8, NUL-terminated), ``bytes`` -> ``const char*`` (no length),
* ``None`` -> ``NULL``;

a non-zero return is an error whose text comes from the optional export
``const char* kcoral_last_error(void)``.

Tensors are described exactly like PyTorch's own DLPack export: ``data`` is the address of the
first element (``tensor.data_ptr()``), ``byte_offset`` is 0, ``strides`` are in elements and
never ``NULL``, ``shape``/``strides`` are never ``NULL`` (even for 0-d tensors).

This module imports neither numpy nor torch: a value can only be a tensor or an array if its
library is already imported.
"""

from __future__ import annotations

import ctypes
import os
import sys
from typing import Any, Dict, List, Optional, Tuple

from .errors import ExecutionError

__all__ = [
    "DLDevice",
    "DLDataType",
    "DLTensor",
    "KDL_CPU",
    "KDL_CUDA",
    "CLibrary",
    "CFunction",
    "load_library",
    "marshal_argument",
]

# DLDeviceType (dlpack.h)
KDL_CPU = 1
KDL_CUDA = 2

# DLDataTypeCode (dlpack.h, v1.x)
KDL_INT = 0
KDL_UINT = 1
KDL_FLOAT = 2
KDL_BFLOAT = 4
KDL_COMPLEX = 5
KDL_BOOL = 6
KDL_FLOAT8_E4M3FN = 10
KDL_FLOAT8_E4M3FNUZ = 11
KDL_FLOAT8_E5M2 = 12
KDL_FLOAT8_E5M2FNUZ = 13
KDL_FLOAT8_E8M0FNU = 14

INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1
LAST_ERROR_SYMBOL = "kcoral_last_error"


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


# torch dtype name (str(dtype) without "torch.") -> (DLDataTypeCode, bits). Looked up by name so
# that dtypes an older torch lacks simply never match.
_TORCH_DTYPES = {
    "bool": (KDL_BOOL, 8),
    "uint8": (KDL_UINT, 8),
    "uint16": (KDL_UINT, 16),
    "uint32": (KDL_UINT, 32),
    "uint64": (KDL_UINT, 64),
    "int8": (KDL_INT, 8),
    "int16": (KDL_INT, 16),
    "int32": (KDL_INT, 32),
    "int64": (KDL_INT, 64),
    "float16": (KDL_FLOAT, 16),
    "bfloat16": (KDL_BFLOAT, 16),
    "float32": (KDL_FLOAT, 32),
    "float64": (KDL_FLOAT, 64),
    "complex32": (KDL_COMPLEX, 32),
    "complex64": (KDL_COMPLEX, 64),
    "complex128": (KDL_COMPLEX, 128),
    "float8_e4m3fn": (KDL_FLOAT8_E4M3FN, 8),
    "float8_e4m3fnuz": (KDL_FLOAT8_E4M3FNUZ, 8),
    "float8_e5m2": (KDL_FLOAT8_E5M2, 8),
    "float8_e5m2fnuz": (KDL_FLOAT8_E5M2FNUZ, 8),
    "float8_e8m0fnu": (KDL_FLOAT8_E8M0FNU, 8),
}

# numpy dtype.kind -> DLDataTypeCode; allowed item sizes in bytes.
_NUMPY_KINDS = {
    "b": (KDL_BOOL, (1,)),
    "i": (KDL_INT, (1, 2, 4, 8)),
    "u": (KDL_UINT, (1, 2, 4, 8)),
    "f": (KDL_FLOAT, (2, 4, 8)),
    "c": (KDL_COMPLEX, (8, 16)),
}


class _Unsupported(Exception):
    """An argument that has no C ABI representation (message without the argument index)."""


# --------------------------------------------------------------------------- marshalling


def _dltensor(
    data: int,
    device_type: int,
    device_id: int,
    code: int,
    bits: int,
    shape: Tuple[int, ...],
    strides: Tuple[int, ...],
    keep: List[Any],
) -> Any:
    array_type = ctypes.c_int64 * max(len(shape), 1)  # never NULL, even for 0-d tensors
    shape_array = array_type(*shape)
    strides_array = array_type(*strides)
    tensor = DLTensor(
        data or None,
        DLDevice(device_type, device_id),
        len(shape),
        DLDataType(code, bits, 1),
        shape_array,
        strides_array,
        0,
    )
    keep.extend((shape_array, strides_array, tensor))
    return ctypes.byref(tensor)


_torch_dtype_cache: Dict[Any, Tuple[int, int]] = {}


def _torch_dtype(torch: Any, dtype: Any) -> Optional[Tuple[int, int]]:
    if not _torch_dtype_cache:
        for name, entry in _TORCH_DTYPES.items():
            value = getattr(torch, name, None)
            if isinstance(value, torch.dtype):
                _torch_dtype_cache[value] = entry
    return _torch_dtype_cache.get(dtype)


def _torch_tensor(torch: Any, value: Any, keep: List[Any]) -> Any:
    if value.layout != torch.strided:
        raise _Unsupported(f"a tensor with layout {value.layout} (only strided tensors)")
    if value.is_conj() or value.is_neg():
        raise _Unsupported(
            "a tensor with a lazy conjugate/negative bit (call .resolve_conj()/.resolve_neg())"
        )
    entry = _torch_dtype(torch, value.dtype)
    if entry is None:
        raise _Unsupported(f"a tensor of dtype {value.dtype}")
    if value.is_cuda:
        device_type, device_id = KDL_CUDA, value.get_device()
    elif value.is_cpu:
        device_type, device_id = KDL_CPU, 0
    else:
        raise _Unsupported(f"a tensor on device {value.device} (only cpu and cuda)")
    try:
        data = value.data_ptr()
    except Exception as exc:  # tensor subclasses without storage
        raise _Unsupported(f"a tensor without accessible storage ({exc})") from exc
    keep.append(value)
    return _dltensor(
        data, device_type, device_id, entry[0], entry[1], tuple(value.shape), value.stride(), keep
    )


def _numpy_array(value: Any, keep: List[Any]) -> Any:
    dtype = value.dtype
    entry = _NUMPY_KINDS.get(dtype.kind)
    if entry is None or dtype.itemsize not in entry[1] or dtype.fields is not None:
        raise _Unsupported(f"a numpy array of dtype {dtype}")
    if not dtype.isnative:
        raise _Unsupported(f"a numpy array of non-native byte order ({dtype})")
    itemsize = dtype.itemsize
    if any(s % itemsize for s in value.strides):
        raise _Unsupported("a numpy array whose strides are not multiples of its item size")
    code = entry[0]
    data = value.__array_interface__["data"][0]
    keep.append(value)
    strides = tuple(s // itemsize for s in value.strides)
    return _dltensor(data, KDL_CPU, 0, code, itemsize * 8, tuple(value.shape), strides, keep)


def _int64(value: int) -> Any:
    if not INT64_MIN <= value <= INT64_MAX:
        raise _Unsupported(f"the integer {value}, which does not fit int64_t")
    return ctypes.c_int64(value)


def marshal_argument(value: Any, keep: List[Any]) -> Any:
    """The ctypes object passed for ``value``; appends what must stay alive to ``keep``.

    Raises ``_Unsupported`` for values the ABI has no representation for.
    """
    if value is None:
        return ctypes.c_void_p(None)
    if isinstance(value, bool):
        return ctypes.c_int64(int(value))
    if isinstance(value, int):
        return _int64(value)
    if isinstance(value, float):
        return ctypes.c_double(value)
    if isinstance(value, str):
        try:
            encoded = value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise _Unsupported(f"a string that is not valid UTF-8 ({exc})") from exc
        keep.append(encoded)
        return ctypes.c_char_p(encoded)
    if isinstance(value, bytes):
        keep.append(value)
        return ctypes.c_char_p(value)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        return _torch_tensor(torch, value, keep)
    np = sys.modules.get("numpy")
    if np is not None:
        if isinstance(value, np.ndarray):
            return _numpy_array(value, keep)
        if isinstance(value, (np.bool_, np.integer)):
            return _int64(int(value))
        if isinstance(value, np.floating):
            return ctypes.c_double(float(value))
    raise _Unsupported(f"a value of type {type(value).__module__}.{type(value).__qualname__}")


# --------------------------------------------------------------------------- library


def load_library(path: str) -> "CLibrary":
    """``dlopen(path, RTLD_NOW | RTLD_LOCAL)``. The caller may unlink ``path`` right after.

    RTLD_NOW makes unresolved symbols a load error instead of a crash at the first call.
    """
    absolute = os.path.abspath(path)  # never a search by name
    try:
        handle = ctypes.CDLL(absolute, mode=os.RTLD_NOW | os.RTLD_LOCAL)
    except OSError as exc:
        raise ExecutionError("compile", f"cannot load library: {exc}") from exc
    return CLibrary(handle, absolute)


class CLibrary:
    """A loaded plain-C-ABI library. The mapping lives until ``close()`` or process exit."""

    def __init__(self, handle: ctypes.CDLL, path: str) -> None:
        self._handle: Optional[ctypes.CDLL] = handle
        self.path = path
        self._last_error: Any = None
        self._last_error_looked_up = False

    @property
    def closed(self) -> bool:
        return self._handle is None

    def _require_open(self) -> ctypes.CDLL:
        handle = self._handle
        if handle is None:
            raise ExecutionError("runtime", "the uploaded library was closed")
        return handle

    def _symbol(self, name: str) -> Optional[Any]:
        handle = self._require_open()
        if not isinstance(name, str) or not name or "\0" in name:
            return None
        try:
            return handle[name]  # __getitem__: a fresh function pointer, no attribute caching
        except (AttributeError, ValueError, TypeError):
            return None

    def get_function(self, name: str) -> "CFunction":
        symbol = self._symbol(name)
        if symbol is None:
            message = f"library exports no function {name!r}"
            if isinstance(name, str) and name and self._symbol(f"__tvm_ffi_{name}") is not None:
                message += (
                    f" (it exports '__tvm_ffi_{name}', a TVM-FFI function; this worker has no"
                    " tvm_ffi and calls only the plain C ABI)"
                )
            raise ExecutionError("compile", message)
        symbol.restype = ctypes.c_int
        symbol.argtypes = None
        return CFunction(self, name, symbol)

    def last_error(self) -> Optional[str]:
        """The text of the optional ``kcoral_last_error()`` export, or None."""
        if not self._last_error_looked_up:
            symbol = self._symbol(LAST_ERROR_SYMBOL)
            if symbol is not None:
                symbol.restype = ctypes.c_char_p
                symbol.argtypes = []
            self._last_error = symbol
            self._last_error_looked_up = True
        if self._last_error is None:
            return None
        raw = self._last_error()
        if not raw:
            return None
        return raw.decode("utf-8", "replace")

    def close(self) -> None:
        """``dlclose`` the library. Functions bound from it refuse to run afterwards.

        Only call this when no kernel of the library can still be running or be launched.
        """
        handle = self._handle
        if handle is None:
            return
        self._handle = None
        self._last_error = None
        self._last_error_looked_up = True
        import _ctypes

        _ctypes.dlclose(handle._handle)

    def __repr__(self) -> str:
        return f"<CLibrary {self.path!r}{' closed' if self.closed else ''}>"


class CFunction:
    """An exported ``int name(...)``; calling it returns None or raises ``ExecutionError``."""

    __slots__ = ("library", "name", "_symbol")

    def __init__(self, library: CLibrary, name: str, symbol: Any) -> None:
        self.library = library
        self.name = name
        self._symbol = symbol

    def __call__(self, *args: Any) -> None:
        self.library._require_open()
        keep: List[Any] = []
        c_args = []
        for index, value in enumerate(args):
            try:
                c_args.append(marshal_argument(value, keep))
            except _Unsupported as exc:
                raise ExecutionError(
                    "runtime",
                    f"argument {index} of '{self.name}': cannot pass {exc} through the C ABI"
                    " (tensors, numpy arrays, bool, int, float, str, bytes and None only)",
                ) from None
        code = self._symbol(*c_args)
        del keep  # the callee may not keep pointers past the call (docs/c-abi.md)
        if code != 0:
            text = self.library.last_error()
            raise ExecutionError("runtime", text if text else f"'{self.name}' returned {code}")
        return None

    def __repr__(self) -> str:
        return f"<CFunction {self.name!r} of {self.library.path!r}>"
