"""The CUDA driver API through ctypes, for what a GPU worker does without a context.

``cuInit`` (``GpuBackend.prepare``, before the lease) and, for a worker whose context is
deferred (``GpuBackend.init`` with ``context=False``), the visible devices' count, compute
capability and UUIDs. None of these calls creates a context or touches a device's engines: they
read what the driver learnt in ``cuInit``.

```
  Driver.load() ──▶ init() (cuInit) ──▶ device_count() / capability(k) / uuid(k)
```
"""

from __future__ import annotations

import ctypes
from typing import Any, Optional, Tuple

LIBRARY = "libcuda.so.1"
"""The driver library (tests point it at a stand-in)."""

CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76


class DriverError(RuntimeError):
    """A driver call answered something other than ``CUDA_SUCCESS``."""


def format_uuid_bytes(raw: bytes) -> str:
    """A device UUID's 16 bytes as torch prints them (8-4-4-4-12 lowercase hex), after ``GPU-``
    as ``devices.format_uuid`` writes torch's text."""
    if len(raw) != 16:
        raise ValueError(f"a CUDA UUID has 16 bytes, not {len(raw)}")
    text = raw.hex()
    return f"GPU-{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"


class Driver:
    """The driver library, loaded once per process."""

    def __init__(self, lib: Any) -> None:
        self._lib = lib
        self.initialized = False  # cuInit answered CUDA_SUCCESS in this process

    @classmethod
    def load(cls, name: Optional[str] = None) -> "Driver":
        """Loads ``name`` (default: :data:`LIBRARY`); raises ``OSError`` when it cannot."""
        return cls(ctypes.CDLL(name or LIBRARY))

    def init(self) -> int:
        """``cuInit(0)``; returns its result (0: the driver is initialised in this process)."""
        code = int(self._lib.cuInit(0))
        if code == 0:
            self.initialized = True
        return code

    def device_count(self) -> int:
        count = ctypes.c_int(0)
        self._call("cuDeviceGetCount", ctypes.byref(count))
        return count.value

    def capability(self, ordinal: int) -> Tuple[int, int]:
        """The compute capability (major, minor) of visible device ``ordinal``."""
        device = self._device(ordinal)
        major, minor = ctypes.c_int(0), ctypes.c_int(0)
        self._call("cuDeviceGetAttribute", ctypes.byref(major),
                   CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device)
        self._call("cuDeviceGetAttribute", ctypes.byref(minor),
                   CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device)
        return major.value, minor.value

    def uuid(self, ordinal: int) -> str:
        """Visible device ``ordinal``'s UUID, as torch's device properties print it after
        ``GPU-`` (``cuDeviceGetUuid_v2``, else ``cuDeviceGetUuid`` on drivers before 11.4)."""
        device = self._device(ordinal)
        raw = (ctypes.c_ubyte * 16)()
        name = "cuDeviceGetUuid_v2" if hasattr(self._lib, "cuDeviceGetUuid_v2") else "cuDeviceGetUuid"
        self._call(name, ctypes.byref(raw), device)
        return format_uuid_bytes(bytes(raw))

    def _device(self, ordinal: int) -> ctypes.c_int:
        device = ctypes.c_int(0)
        self._call("cuDeviceGet", ctypes.byref(device), ctypes.c_int(ordinal))
        return device

    def _call(self, name: str, *args: Any) -> None:
        code = int(getattr(self._lib, name)(*args))
        if code != 0:
            raise DriverError(f"{name} returned {self._error_name(code)} ({code})")

    def _error_name(self, code: int) -> str:
        text = ctypes.c_char_p()
        try:
            if int(self._lib.cuGetErrorName(code, ctypes.byref(text))) == 0 and text.value:
                return text.value.decode("ascii", "replace")
        except AttributeError:
            pass
        return "CUDA error"
