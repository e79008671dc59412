"""The small NVML surface the server needs to pin GPUs by identity (ctypes, no CUDA context).

``python -m kcoral_runtime.nvml`` prints ``[{"index", "uuid", "minor", "name"}, ...]`` as JSON
(``[]`` when NVML is absent), so the front-end can map ``--gpus`` indices to UUIDs for
``CUDA_VISIBLE_DEVICES`` and to ``/dev/nvidia<minor>`` nodes for the sandbox. The library is
found as ``gpu_state`` finds it (``$KCORAL_NVML_LIBRARY``, else the driver's ``libnvidia-ml``).
"""

from __future__ import annotations

import ctypes
import json
import sys
from typing import Any, Dict, List, Optional

from kcoral_runtime.gpu_state import NvmlUnavailable, load_library

_SUCCESS = 0
_BUFFER = 96  # NVML_DEVICE_UUID_V2_BUFFER_SIZE, also enough for names


def _load() -> Optional[ctypes.CDLL]:
    try:
        return load_library()
    except NvmlUnavailable:
        return None


def list_gpus() -> List[Dict[str, Any]]:
    """Every GPU NVML sees, in NVML index order; [] without NVML or a driver."""
    lib = _load()
    if lib is None:
        return []
    try:
        if lib.nvmlInit_v2() != _SUCCESS:
            return []
    except AttributeError:
        return []
    try:
        count = ctypes.c_uint()
        if lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) != _SUCCESS:
            return []
        out: List[Dict[str, Any]] = []
        for index in range(count.value):
            handle = ctypes.c_void_p()
            if lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.byref(handle)):
                continue
            entry: Dict[str, Any] = {"index": index, "uuid": None, "minor": None, "name": None}
            buf = ctypes.create_string_buffer(_BUFFER)
            if lib.nvmlDeviceGetUUID(handle, buf, ctypes.c_uint(_BUFFER)) == _SUCCESS:
                entry["uuid"] = buf.value.decode("utf-8", "replace")
            minor = ctypes.c_uint()
            if lib.nvmlDeviceGetMinorNumber(handle, ctypes.byref(minor)) == _SUCCESS:
                entry["minor"] = minor.value
            name = ctypes.create_string_buffer(_BUFFER)
            if lib.nvmlDeviceGetName(handle, name, ctypes.c_uint(_BUFFER)) == _SUCCESS:
                entry["name"] = name.value.decode("utf-8", "replace")
            out.append(entry)
        return out
    finally:
        lib.nvmlShutdown()


if __name__ == "__main__":
    json.dump(list_gpus(), sys.stdout)
    sys.stdout.write("\n")
