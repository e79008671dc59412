"""The GPU-state receipt of one request (docs/timing.md, "The receipt of every request"):
which GPU(s) its lease covered and one NVML reading of each when the request first held the
lease and one when it last gave it back (or answered, still holding it).

``RequestReceipt.for_worker`` opens the worker's GPUs once (``CUDA_VISIBLE_DEVICES``: ``GPU-``
or ``MIG-`` UUIDs on a GPU server; ``sim-<k>`` on a simulated one stands for NVML index ``k``)
and reads what does not change (name, UUID, driver and CUDA driver versions), lease-free, as
the child is prepared. Per request the lease (``lease.py``) calls ``begin``, ``acquired`` (a
reading, the first time only), ``releasing`` (a reading, each time: the last one stays) and
``take`` as the outcome is built: the receipt (``None`` when the request never held the lease),
reset for the next request. A reading is five NVML calls per GPU (``gpu_state.GpuDevice.sample``).

Where NVML cannot be loaded or a GPU not opened, the receipt still names the GPUs (their ids as
the worker sees them) and says why in ``nvml_error``; nothing here raises. The server adds each
GPU's index and sends the receipt as the ``X-KCoral-GPU-Receipt`` header
(``protocol/gpu_receipt.ts``).

A worker that died or was killed reports nothing: the server then reads the GPUs itself, in a
short-lived process, ``python -m kcoral_runtime.gpu_receipt ID...`` (``read_once``; the ids as in
``CUDA_VISIBLE_DEVICES``), which prints one receipt whose ``released`` is that reading and whose
``acquired`` is ``null`` (the worker's died with it); docs/decisions/dead-worker-receipt.md.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from typing import Any, Dict, List, Optional, Sequence

from . import gpu_state

_IDENTITY_KEYS = ("name", "uuid", "driver_version", "cuda_driver_version")


def visible_device_ids(spec: Optional[str]) -> List[str]:
    """The entries of a ``CUDA_VISIBLE_DEVICES`` value, in order (empty when unset or blank)."""
    if not spec:
        return []
    return [entry.strip() for entry in spec.split(",") if entry.strip()]


def _sim_index(device_id: str) -> Optional[int]:
    digits = device_id[4:] if device_id.startswith("sim-") else ""
    return int(digits) if digits.isdigit() else None


def _reading(sample: gpu_state.Sample) -> Dict[str, Any]:
    return {
        "sm_clock_mhz": sample.sm_clock_mhz,
        "mem_clock_mhz": sample.mem_clock_mhz,
        "temperature_c": sample.temperature_c,
        "power_w": sample.power_w,
        "reasons": gpu_state.reason_names(sample.reasons),
        "throttled": gpu_state.is_throttled(sample.reasons),
    }


class _Gpu:
    """One GPU of the worker: its open NVML device (``None`` without NVML) and identity."""

    def __init__(self, device_id: str) -> None:
        self.device_id = device_id
        self.device: Optional[gpu_state.GpuDevice] = None
        self.identity: Dict[str, Any] = {key: None for key in _IDENTITY_KEYS}
        self.identity["uuid"] = device_id if _sim_index(device_id) is None else None

    def open(self, library: Optional[str]) -> Optional[str]:
        """Opens the device and reads its identity; the error text, or ``None``."""
        sim = _sim_index(self.device_id)
        try:
            if sim is not None:
                device = gpu_state.open_device(index=sim, library=library)
            else:
                device = gpu_state.open_device(uuid=self.device_id, library=library)
        except gpu_state.NvmlUnavailable as exc:
            return str(exc)
        except Exception as exc:  # noqa: BLE001 - a receipt never fails the worker
            return f"{type(exc).__name__}: {exc}"
        try:
            identity = device.identity()
        except Exception as exc:  # noqa: BLE001
            device.close()
            return f"{type(exc).__name__}: {exc}"
        self.device = device
        for key in _IDENTITY_KEYS:
            if identity.get(key) is not None:
                self.identity[key] = identity[key]
        return None


class RequestReceipt:
    """The receipt of the worker's current request (module docstring). Thread-safe: the engine's
    thread and the GPU gate's take and give back the lease."""

    def __init__(self, device_ids: Sequence[str], library: Optional[str] = None) -> None:
        self._gpus = [_Gpu(device_id) for device_id in device_ids]
        self._library = library
        self._lock = threading.Lock()
        self.nvml_error: Optional[str] = None
        self._opened = False
        self._acquired: Optional[List[Optional[Dict[str, Any]]]] = None
        self._released: Optional[List[Optional[Dict[str, Any]]]] = None

    @classmethod
    def for_worker(cls, library: Optional[str] = None) -> Optional["RequestReceipt"]:
        """The receipt of a worker that sees ``CUDA_VISIBLE_DEVICES``, opened; ``None`` when the
        variable names no GPU."""
        ids = visible_device_ids(os.environ.get("CUDA_VISIBLE_DEVICES"))
        if not ids:
            return None
        receipt = cls(ids, library)
        receipt.open()
        return receipt

    def open(self) -> None:
        """Opens every GPU and reads its identity (once; lease-free: call it before requests)."""
        with self._lock:
            if self._opened:
                return
            self._opened = True
            errors = [error for error in (gpu.open(self._library) for gpu in self._gpus) if error]
            if errors:
                self.nvml_error = errors[0]

    def _readings(self) -> List[Optional[Dict[str, Any]]]:
        out: List[Optional[Dict[str, Any]]] = []
        for gpu in self._gpus:
            if gpu.device is None:
                out.append(None)
                continue
            try:
                out.append(_reading(gpu.device.sample()))
            except Exception as exc:  # noqa: BLE001
                out.append(None)
                if self.nvml_error is None:
                    self.nvml_error = f"sample: {type(exc).__name__}: {exc}"
        return out

    def begin(self) -> None:
        """A new request: nothing held yet."""
        with self._lock:
            self._acquired = self._released = None

    def acquired(self) -> None:
        """The request holds the lease: the acquisition reading, the first time only."""
        with self._lock:
            if self._acquired is None:
                self._acquired = self._readings()
                self._released = None

    def releasing(self) -> None:
        """The request is about to give the lease back (or answers holding it): the release
        reading (the last one taken stays)."""
        with self._lock:
            if self._acquired is not None:
                self._released = self._readings()

    def take(self) -> Optional[Dict[str, Any]]:
        """The request's receipt (``None`` when it never held the lease); resets for the next
        one. Call ``releasing`` first if the lease is still held."""
        with self._lock:
            acquired, released = self._acquired, self._released
            self._acquired = self._released = None
        if acquired is None:
            return None
        gpus: List[Dict[str, Any]] = []
        any_throttled = False
        for k, gpu in enumerate(self._gpus):
            first = acquired[k]
            last = released[k] if released is not None else None
            throttled = any(r is not None and r["throttled"] for r in (first, last))
            any_throttled = any_throttled or throttled
            gpus.append({**gpu.identity, "acquired": first, "released": last,
                         "throttled": throttled})
        return {"gpus": gpus, "throttled": any_throttled, "nvml_error": self.nvml_error}

    def close(self) -> None:
        """Gives back the NVML references."""
        for gpu in self._gpus:
            if gpu.device is not None:
                gpu.device.close()
                gpu.device = None


def read_once(device_ids: Sequence[str], library: Optional[str] = None) -> Dict[str, Any]:
    """One receipt of ``device_ids`` read now by a process that never held their lease: the
    identity, ``acquired`` ``None`` and ``released`` the reading (``None`` without NVML, with
    ``nvml_error`` saying why). NVML is opened and closed again; nothing here raises."""
    receipt = RequestReceipt(device_ids, library)
    try:
        receipt.open()
        readings = receipt._readings()
        gpus: List[Dict[str, Any]] = []
        for gpu, reading in zip(receipt._gpus, readings):
            throttled = reading is not None and reading["throttled"]
            gpus.append({**gpu.identity, "acquired": None, "released": reading,
                         "throttled": throttled})
        return {"gpus": gpus, "throttled": any(g["throttled"] for g in gpus),
                "nvml_error": receipt.nvml_error}
    finally:
        receipt.close()


if __name__ == "__main__":
    json.dump(read_once(sys.argv[1:]), sys.stdout, separators=(",", ":"))
    sys.stdout.write("\n")
