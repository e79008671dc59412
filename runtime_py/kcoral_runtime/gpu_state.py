"""The GPU-state receipt's NVML side: what a GPU is and how its clocks, temperature, power and
clock-event reasons moved while something ran on it (ctypes, no CUDA context).

``open_device`` opens one GPU by UUID or NVML index and returns a ``GpuDevice``:
``identity()`` describes it (name, UUID, driver and CUDA driver versions, maximum clocks, power
limit, persistence and compute modes, application clocks), ``sample()`` takes one reading
(``Sample``: SM and memory clocks, temperature, power, clock-event reasons; five NVML calls).
A ``Sampler`` takes readings on a daemon thread between ``start()`` and ``stop()``, stamped by
the caller's clock (CUPTI's, so readings line up with GPU activity records).
``summarize`` reduces readings to min/median/max and the reasons seen; ``throttled_windows``
gives the intervals during which power or thermal limits lowered the clocks.

Which library: the ``library`` argument, else ``$KCORAL_NVML_LIBRARY`` (``LIBRARY_ENV``; the
tests point it at a stand-in), else ``libnvidia-ml.so.1`` then ``libnvidia-ml.so``.
``nvmlInit_v2`` runs once per process and library; every open device holds a reference, and
``nvmlShutdown`` runs when the last one is closed.

A quantity NVML cannot give (not supported on the device, symbol absent from an older driver)
reads as ``None`` (reasons as ``0``); only opening raises (``NvmlUnavailable``, with the reason).

NVML facts the readings depend on: ``nvmlDeviceGetPowerUsage`` is a one-second average on GPUs
newer than Ampere's GA100 (H100, H200), instantaneous on GA100 and older. The temperature is read
with ``nvmlDeviceGetTemperatureV`` (newer drivers) or ``nvmlDeviceGetTemperature`` (deprecated in
NVML 13), the reasons with ``nvmlDeviceGetCurrentClocksEventReasons`` or
``nvmlDeviceGetCurrentClocksThrottleReasons`` (its older name, deprecated in NVML 13): the first
that the driver has and that answers; one that fails is not asked again while another is left.
"""

from __future__ import annotations

import ctypes
import math
import os
import statistics
import threading
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

LIBRARY_ENV = "KCORAL_NVML_LIBRARY"
DEFAULT_LIBRARIES = ("libnvidia-ml.so.1", "libnvidia-ml.so")

# nvmlReturn_t values used by name.
NVML_SUCCESS = 0
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6

# nvmlClockType_t
_CLOCK_SM = 1
_CLOCK_MEM = 2
# nvmlTemperatureSensors_t
_TEMPERATURE_GPU = 0
# nvmlComputeMode_t
_COMPUTE_MODES = {0: "default", 1: "exclusive_thread", 2: "prohibited", 3: "exclusive_process"}

_STRING_BUFFER = 96  # NVML_DEVICE_NAME_V2_BUFFER_SIZE, NVML_DEVICE_UUID_V2_BUFFER_SIZE; > 80

REASON_NAMES: Dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}

THROTTLE_MASK = 0x4 | 0x8 | 0x20 | 0x40 | 0x80
"""The reasons that mean power or thermal limits lowered the clocks."""


class NvmlUnavailable(Exception):
    """NVML cannot be loaded or initialised, or the requested GPU is not there (the message says
    which)."""


def reason_names(mask: int) -> List[str]:
    """The names of the bits set in a clock-event reason mask, by bit; a bit NVML added after
    this table reads as ``unknown_0x...``."""
    out: List[str] = []
    bit = 1
    while bit <= mask:
        if mask & bit:
            out.append(REASON_NAMES.get(bit, f"unknown_{bit:#x}"))
        bit <<= 1
    return out


def is_throttled(mask: int) -> bool:
    """Whether a reason mask holds a power or thermal reason (``THROTTLE_MASK``)."""
    return bool(mask & THROTTLE_MASK)


# --------------------------------------------------------------------------- the library


class _PciInfo(ctypes.Structure):
    """nvmlPciInfo_t (the layout of nvmlDeviceGetPciInfo_v3)."""

    _fields_ = [
        ("busIdLegacy", ctypes.c_char * 16),
        ("domain", ctypes.c_uint),
        ("bus", ctypes.c_uint),
        ("device", ctypes.c_uint),
        ("pciDeviceId", ctypes.c_uint),
        ("pciSubSystemId", ctypes.c_uint),
        ("busId", ctypes.c_char * 32),
    ]


class _Temperature(ctypes.Structure):
    """nvmlTemperature_v1_t (nvmlDeviceGetTemperatureV)."""

    _fields_ = [
        ("version", ctypes.c_uint),
        ("sensorType", ctypes.c_int),
        ("temperature", ctypes.c_int),
    ]


_TEMPERATURE_V1 = ctypes.sizeof(_Temperature) | (1 << 24)

_P = ctypes.POINTER
_HANDLE = ctypes.c_void_p
_SIGNATURES: Dict[str, Tuple[Any, List[Any]]] = {
    "nvmlInit_v2": (ctypes.c_int, []),
    "nvmlShutdown": (ctypes.c_int, []),
    "nvmlErrorString": (ctypes.c_char_p, [ctypes.c_int]),
    "nvmlDeviceGetCount_v2": (ctypes.c_int, [_P(ctypes.c_uint)]),
    "nvmlDeviceGetHandleByIndex_v2": (ctypes.c_int, [ctypes.c_uint, _P(_HANDLE)]),
    "nvmlDeviceGetHandleByUUID": (ctypes.c_int, [ctypes.c_char_p, _P(_HANDLE)]),
    "nvmlDeviceGetName": (ctypes.c_int, [_HANDLE, ctypes.c_char_p, ctypes.c_uint]),
    "nvmlDeviceGetUUID": (ctypes.c_int, [_HANDLE, ctypes.c_char_p, ctypes.c_uint]),
    "nvmlSystemGetDriverVersion": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_uint]),
    "nvmlSystemGetNVMLVersion": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_uint]),
    "nvmlSystemGetCudaDriverVersion_v2": (ctypes.c_int, [_P(ctypes.c_int)]),
    "nvmlSystemGetCudaDriverVersion": (ctypes.c_int, [_P(ctypes.c_int)]),
    "nvmlDeviceGetPciInfo_v3": (ctypes.c_int, [_HANDLE, _P(_PciInfo)]),
    "nvmlDeviceGetMaxClockInfo": (ctypes.c_int, [_HANDLE, ctypes.c_int, _P(ctypes.c_uint)]),
    "nvmlDeviceGetClockInfo": (ctypes.c_int, [_HANDLE, ctypes.c_int, _P(ctypes.c_uint)]),
    "nvmlDeviceGetApplicationsClock": (ctypes.c_int, [_HANDLE, ctypes.c_int, _P(ctypes.c_uint)]),
    "nvmlDeviceGetDefaultApplicationsClock": (
        ctypes.c_int, [_HANDLE, ctypes.c_int, _P(ctypes.c_uint)]),
    "nvmlDeviceGetTemperatureV": (ctypes.c_int, [_HANDLE, _P(_Temperature)]),
    "nvmlDeviceGetTemperature": (ctypes.c_int, [_HANDLE, ctypes.c_int, _P(ctypes.c_uint)]),
    "nvmlDeviceGetPowerUsage": (ctypes.c_int, [_HANDLE, _P(ctypes.c_uint)]),
    "nvmlDeviceGetEnforcedPowerLimit": (ctypes.c_int, [_HANDLE, _P(ctypes.c_uint)]),
    "nvmlDeviceGetPersistenceMode": (ctypes.c_int, [_HANDLE, _P(ctypes.c_int)]),
    "nvmlDeviceGetComputeMode": (ctypes.c_int, [_HANDLE, _P(ctypes.c_int)]),
    "nvmlDeviceGetCurrentClocksEventReasons": (ctypes.c_int, [_HANDLE, _P(ctypes.c_ulonglong)]),
    "nvmlDeviceGetCurrentClocksThrottleReasons": (
        ctypes.c_int, [_HANDLE, _P(ctypes.c_ulonglong)]),
}


def library_candidates(library: Optional[str] = None) -> List[str]:
    """The library names or paths tried, in order: ``library``, else ``$KCORAL_NVML_LIBRARY``,
    else the driver's sonames."""
    if library:
        return [library]
    env = os.environ.get(LIBRARY_ENV)
    if env:
        return [env]
    return list(DEFAULT_LIBRARIES)


def load_library(library: Optional[str] = None) -> ctypes.CDLL:
    """A fresh ``ctypes.CDLL`` of the first candidate that loads (``library_candidates``), with
    no signatures set; raises ``NvmlUnavailable`` naming every candidate and why it failed."""
    failures: List[str] = []
    for name in library_candidates(library):
        try:
            return ctypes.CDLL(name)
        except OSError as exc:
            failures.append(f"{name}: {exc}")
    raise NvmlUnavailable("cannot load NVML (" + "; ".join(failures) + ")")


class _Nvml:
    """One loaded library: its bound functions (``None`` where the symbol is absent)."""

    def __init__(self, lib: ctypes.CDLL, name: str) -> None:
        self.lib = lib
        self.name = name
        self._bound: Dict[str, Optional[Any]] = {}

    def fn(self, name: str) -> Optional[Any]:
        if name not in self._bound:
            try:
                func = getattr(self.lib, name)
            except AttributeError:
                func = None
            if func is not None:
                restype, argtypes = _SIGNATURES[name]
                func.restype = restype
                func.argtypes = argtypes
            self._bound[name] = func
        return self._bound[name]

    def error(self, code: int) -> str:
        """``NVML_ERROR_...`` text for a return code (``nvmlErrorString``, and the number)."""
        text = None
        func = self.fn("nvmlErrorString")
        if func is not None:
            try:
                raw = func(code)
                text = raw.decode("utf-8", "replace") if raw else None
            except Exception:  # noqa: BLE001 - an error string must not fail the report
                text = None
        return f"{text} ({code})" if text else f"NVML error {code}"


class _Session:
    """nvmlInit_v2 once, shared by every open device of one library in one process."""

    def __init__(self, nvml: _Nvml) -> None:
        self.nvml = nvml
        self.refs = 0
        self.pid = os.getpid()


_SESSIONS: Dict[str, _Session] = {}
_SESSIONS_LOCK = threading.Lock()


def _acquire(library: Optional[str]) -> _Session:
    candidates = library_candidates(library)
    key = "\0".join(candidates)
    with _SESSIONS_LOCK:
        session = _SESSIONS.get(key)
        if session is not None and session.pid != os.getpid():
            session = None  # inherited through fork: this process has not initialised NVML
        if session is None:
            lib = load_library(library)
            nvml = _Nvml(lib, getattr(lib, "_name", candidates[0]))
            init = nvml.fn("nvmlInit_v2")
            if init is None or nvml.fn("nvmlShutdown") is None:
                raise NvmlUnavailable(
                    f"{nvml.name} is not NVML: it has no nvmlInit_v2/nvmlShutdown")
            rc = init()
            if rc != NVML_SUCCESS:
                raise NvmlUnavailable(f"nvmlInit_v2 failed: {nvml.error(rc)}")
            session = _Session(nvml)
            _SESSIONS[key] = session
        session.refs += 1
        return session


def _release(session: _Session) -> None:
    with _SESSIONS_LOCK:
        session.refs -= 1
        if session.refs > 0:
            return
        for key, value in list(_SESSIONS.items()):
            if value is session:
                del _SESSIONS[key]
        if session.pid == os.getpid():
            shutdown = session.nvml.fn("nvmlShutdown")
            if shutdown is not None:
                shutdown()


# --------------------------------------------------------------------------- devices


@dataclass(frozen=True)
class Sample:
    """One reading of a GPU. ``None``: NVML could not give that quantity."""

    t_ns: int
    """The caller's clock at the reading (midpoint of the clock read before and after it)."""
    sm_clock_mhz: Optional[int]
    mem_clock_mhz: Optional[int]
    temperature_c: Optional[int]
    power_w: Optional[float]
    reasons: int
    """Clock-event reason mask (``REASON_NAMES``); 0 when NVML could not give it."""


def normalize_uuid(uuid: Any) -> str:
    """``GPU-<hex>`` from a UUID with or without the prefix (torch's
    ``get_device_properties(d).uuid`` has none); ``MIG-`` UUIDs pass as they are."""
    text = str(uuid).strip()
    if not text:
        raise ValueError("open_device: empty GPU UUID")
    if text[:4].upper() in ("GPU-", "MIG-"):
        return text[:4].upper() + text[4:]
    return "GPU-" + text


def open_device(uuid: Optional[str] = None, index: Optional[int] = None,
                library: Optional[str] = None) -> "GpuDevice":
    """Opens the GPU with this UUID (with or without ``GPU-``) or NVML index; exactly one of
    the two. Raises ``NvmlUnavailable`` (with the reason) when NVML cannot be loaded or
    initialised or the GPU is not there."""
    if (uuid is None) == (index is None):
        raise ValueError("open_device needs exactly one of uuid= and index=")
    if index is not None and (isinstance(index, bool) or not isinstance(index, int) or index < 0):
        raise ValueError(f"open_device: index must be a non-negative int, not {index!r}")
    wanted = normalize_uuid(uuid) if uuid is not None else None
    session = _acquire(library)
    try:
        nvml = session.nvml
        handle = _HANDLE()
        if wanted is not None:
            by_uuid = nvml.fn("nvmlDeviceGetHandleByUUID")
            if by_uuid is None:
                raise NvmlUnavailable(f"{nvml.name} has no nvmlDeviceGetHandleByUUID")
            rc = by_uuid(wanted.encode("ascii", "replace"), ctypes.byref(handle))
            if rc != NVML_SUCCESS:
                raise NvmlUnavailable(f"no GPU with UUID {wanted}: {nvml.error(rc)}")
        else:
            by_index = nvml.fn("nvmlDeviceGetHandleByIndex_v2")
            if by_index is None:
                raise NvmlUnavailable(f"{nvml.name} has no nvmlDeviceGetHandleByIndex_v2")
            rc = by_index(index, ctypes.byref(handle))
            if rc != NVML_SUCCESS:
                count = ctypes.c_uint()
                get_count = nvml.fn("nvmlDeviceGetCount_v2")
                seen = ""
                if get_count is not None and get_count(ctypes.byref(count)) == NVML_SUCCESS:
                    seen = f" (NVML sees {count.value})"
                raise NvmlUnavailable(f"no GPU at NVML index {index}{seen}: {nvml.error(rc)}")
        return GpuDevice(session, handle)
    except BaseException:
        _release(session)
        raise


class GpuDevice:
    """One open GPU. ``close()`` (or leaving a ``with`` block) gives back its NVML reference."""

    def __init__(self, session: _Session, handle: ctypes.c_void_p) -> None:
        self._session: Optional[_Session] = session
        self._nvml = session.nvml
        self._handle = handle
        self._close_lock = threading.Lock()
        self._temperature_fns = [n for n in ("nvmlDeviceGetTemperatureV",
                                             "nvmlDeviceGetTemperature")
                                 if self._nvml.fn(n) is not None]
        self._reason_fns = [n for n in ("nvmlDeviceGetCurrentClocksEventReasons",
                                        "nvmlDeviceGetCurrentClocksThrottleReasons")
                            if self._nvml.fn(n) is not None]

    @property
    def closed(self) -> bool:
        return self._session is None

    def _check_open(self) -> None:
        if self._session is None:
            raise ValueError("GpuDevice is closed")

    def _uint(self, name: str, *args: Any) -> Optional[int]:
        func = self._nvml.fn(name)
        if func is None:
            return None
        out = ctypes.c_uint()
        if func(self._handle, *args, ctypes.byref(out)) != NVML_SUCCESS:
            return None
        return out.value

    def _int(self, name: str) -> Optional[int]:
        func = self._nvml.fn(name)
        if func is None:
            return None
        out = ctypes.c_int()
        if func(self._handle, ctypes.byref(out)) != NVML_SUCCESS:
            return None
        return out.value

    def _device_string(self, name: str) -> Optional[str]:
        func = self._nvml.fn(name)
        if func is None:
            return None
        buf = ctypes.create_string_buffer(_STRING_BUFFER)
        if func(self._handle, buf, _STRING_BUFFER) != NVML_SUCCESS:
            return None
        return buf.value.decode("utf-8", "replace")

    def _system_string(self, name: str) -> Optional[str]:
        func = self._nvml.fn(name)
        if func is None:
            return None
        buf = ctypes.create_string_buffer(_STRING_BUFFER)
        if func(buf, _STRING_BUFFER) != NVML_SUCCESS:
            return None
        return buf.value.decode("utf-8", "replace")

    def _cuda_driver_version(self) -> Optional[str]:
        for name in ("nvmlSystemGetCudaDriverVersion_v2", "nvmlSystemGetCudaDriverVersion"):
            func = self._nvml.fn(name)
            if func is None:
                continue
            out = ctypes.c_int()
            if func(ctypes.byref(out)) == NVML_SUCCESS:
                return f"{out.value // 1000}.{(out.value % 1000) // 10}"
        return None

    def _pci_bus_id(self) -> Optional[str]:
        func = self._nvml.fn("nvmlDeviceGetPciInfo_v3")
        if func is None:
            return None
        info = _PciInfo()
        if func(self._handle, ctypes.byref(info)) != NVML_SUCCESS:
            return None
        return info.busId.decode("ascii", "replace") or None

    def _application_clocks(self) -> Optional[Dict[str, Any]]:
        clocks = {
            "applications_sm_mhz": self._uint("nvmlDeviceGetApplicationsClock", _CLOCK_SM),
            "applications_mem_mhz": self._uint("nvmlDeviceGetApplicationsClock", _CLOCK_MEM),
            "default_applications_sm_mhz":
                self._uint("nvmlDeviceGetDefaultApplicationsClock", _CLOCK_SM),
            "default_applications_mem_mhz":
                self._uint("nvmlDeviceGetDefaultApplicationsClock", _CLOCK_MEM),
        }
        if all(value is None for value in clocks.values()):
            return None
        pairs = [(clocks["applications_sm_mhz"], clocks["default_applications_sm_mhz"]),
                 (clocks["applications_mem_mhz"], clocks["default_applications_mem_mhz"])]
        known = [(a, d) for a, d in pairs if a is not None and d is not None]
        clocks["applications_clocks_changed"] = any(a != d for a, d in known) if known else None
        return clocks

    def identity(self) -> Dict[str, Any]:
        """What the GPU is: ``name``, ``uuid``, ``driver_version``, ``cuda_driver_version``
        (``"13.0"``), ``nvml_version``, ``pci_bus_id``, ``sm_clock_max_mhz``,
        ``mem_clock_max_mhz``, ``power_limit_w`` (enforced), ``persistence_mode`` (bool),
        ``compute_mode`` (``default``, ``exclusive_thread``, ``prohibited``,
        ``exclusive_process``) and ``clocks_locked``: the application clocks
        (``applications_sm_mhz``, ``applications_mem_mhz``, their ``default_...`` values and
        ``applications_clocks_changed``: set away from the defaults), or ``None`` where NVML has
        none. NVML has no getter for clocks locked by ``nvidia-smi --lock-gpu-clocks``; their
        effect shows in the samples' clocks. A field NVML cannot give is ``None``."""
        self._check_open()
        power_limit = self._uint("nvmlDeviceGetEnforcedPowerLimit")
        persistence = self._int("nvmlDeviceGetPersistenceMode")
        compute = self._int("nvmlDeviceGetComputeMode")
        return {
            "name": self._device_string("nvmlDeviceGetName"),
            "uuid": self._device_string("nvmlDeviceGetUUID"),
            "driver_version": self._system_string("nvmlSystemGetDriverVersion"),
            "cuda_driver_version": self._cuda_driver_version(),
            "nvml_version": self._system_string("nvmlSystemGetNVMLVersion"),
            "pci_bus_id": self._pci_bus_id(),
            "sm_clock_max_mhz": self._uint("nvmlDeviceGetMaxClockInfo", _CLOCK_SM),
            "mem_clock_max_mhz": self._uint("nvmlDeviceGetMaxClockInfo", _CLOCK_MEM),
            "power_limit_w": None if power_limit is None else power_limit / 1000.0,
            "persistence_mode": None if persistence is None else bool(persistence),
            "compute_mode": None if compute is None else _COMPUTE_MODES.get(compute, str(compute)),
            "clocks_locked": self._application_clocks(),
        }

    def _temperature(self) -> Optional[int]:
        while self._temperature_fns:
            name = self._temperature_fns[0]
            func = self._nvml.fn(name)
            if name == "nvmlDeviceGetTemperatureV":
                reading = _Temperature(_TEMPERATURE_V1, _TEMPERATURE_GPU, 0)
                if func(self._handle, ctypes.byref(reading)) == NVML_SUCCESS:
                    return reading.temperature
            else:
                out = ctypes.c_uint()
                if func(self._handle, _TEMPERATURE_GPU, ctypes.byref(out)) == NVML_SUCCESS:
                    return out.value
            if len(self._temperature_fns) == 1:
                return None  # the last way left: it may answer later
            self._temperature_fns = self._temperature_fns[1:]
        return None

    def _reasons(self) -> int:
        while self._reason_fns:
            out = ctypes.c_ulonglong()
            if self._nvml.fn(self._reason_fns[0])(self._handle, ctypes.byref(out)) == NVML_SUCCESS:
                return out.value
            if len(self._reason_fns) == 1:
                return 0
            self._reason_fns = self._reason_fns[1:]
        return 0

    def sample(self, clock: Callable[[], int] = time.monotonic_ns) -> Sample:
        """One reading, stamped by ``clock`` (int ns): SM and memory clocks, temperature, power,
        reasons; five NVML calls, each releasing the GIL."""
        self._check_open()
        before = clock()
        sm = self._uint("nvmlDeviceGetClockInfo", _CLOCK_SM)
        mem = self._uint("nvmlDeviceGetClockInfo", _CLOCK_MEM)
        temperature = self._temperature()
        power_mw = self._uint("nvmlDeviceGetPowerUsage")
        reasons = self._reasons()
        after = clock()
        return Sample(
            t_ns=(before + after) // 2,
            sm_clock_mhz=sm,
            mem_clock_mhz=mem,
            temperature_c=temperature,
            power_w=None if power_mw is None else power_mw / 1000.0,
            reasons=reasons,
        )

    def close(self) -> None:
        """Gives back this device's NVML reference (``nvmlShutdown`` with the last one); again
        is a no-op."""
        with self._close_lock:
            session, self._session = self._session, None
        if session is not None:
            _release(session)

    def __enter__(self) -> "GpuDevice":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------- sampling


class Sampler:
    """Readings of a ``GpuDevice`` every ``interval_s`` on a daemon thread between ``start()``
    and ``stop()``, stamped by ``clock`` (int ns; CUPTI's timestamp function lines them up with
    activity records), plus one reading taken in ``start()`` and one in ``stop()``.

    Bounded: ``stop()`` returns at most ``max_samples`` readings. When the thread's readings
    reach ``max_samples - 1`` (one place stays for the stop reading) it thins them: every other
    reading is dropped (the start reading stays), each kept reading's ``reasons`` takes in the
    reasons of the one dropped after it (so a throttle seen only in a dropped reading still marks
    the interval its neighbour now stands for), and the interval doubles. ``thinned`` counts
    those passes; readings are never stopped early for space.

    The thread never raises: an exception ends it and is kept in ``error`` (``stop()`` still
    takes its reading). ``stop()`` joins the thread. A Sampler runs once.
    """

    def __init__(self, device: GpuDevice, interval_s: float = 0.002,
                 clock: Callable[[], int] = time.monotonic_ns, max_samples: int = 100_000) -> None:
        if not isinstance(interval_s, (int, float)) or not math.isfinite(interval_s) \
                or interval_s <= 0:
            raise ValueError(f"Sampler: interval_s must be a positive number, not {interval_s!r}")
        if isinstance(max_samples, bool) or not isinstance(max_samples, int) or max_samples < 4:
            raise ValueError(
                f"Sampler: max_samples must be an int of at least 4, not {max_samples!r}")
        if not callable(clock):
            raise ValueError("Sampler: clock must be a callable returning int nanoseconds")
        self.device = device
        self.interval_s = float(interval_s)
        self.clock = clock
        self.max_samples = max_samples
        self.thinned = 0
        self.error: Optional[str] = None
        self._samples: List[Sample] = []
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._state = "new"

    def start(self) -> None:
        """Takes the start reading and starts the thread."""
        if self._state != "new":
            raise RuntimeError(f"Sampler.start(): the sampler is {self._state} (it runs once)")
        self._samples = [self.device.sample(self.clock)]
        self._thread = threading.Thread(target=self._run, name="kcoral-gpu-sampler", daemon=True)
        self._state = "running"
        self._thread.start()

    def stop(self) -> List[Sample]:
        """Stops and joins the thread, takes the stop reading, returns every reading in order."""
        if self._state != "running":
            raise RuntimeError(f"Sampler.stop(): the sampler is {self._state}, not running")
        self._stop.set()
        assert self._thread is not None
        self._thread.join()
        self._state = "stopped"
        self._samples.append(self.device.sample(self.clock))
        return list(self._samples)

    def _run(self) -> None:
        try:
            interval = self.interval_s
            deadline = time.monotonic() + interval
            while not self._stop.wait(max(0.0, deadline - time.monotonic())):
                if len(self._samples) >= self.max_samples - 1:
                    self._samples = _thin(self._samples)
                    self.thinned += 1
                    interval *= 2
                self._samples.append(self.device.sample(self.clock))
                deadline = max(deadline + interval, time.monotonic())
        except BaseException as exc:  # noqa: BLE001 - the thread must not raise out
            self.error = f"{type(exc).__name__}: {exc}"


def _thin(samples: Sequence[Sample]) -> List[Sample]:
    out: List[Sample] = []
    for i in range(0, len(samples), 2):
        kept = samples[i]
        if i + 1 < len(samples):
            kept = replace(kept, reasons=kept.reasons | samples[i + 1].reasons)
        out.append(kept)
    return out


# --------------------------------------------------------------------------- summaries


def _spread(values: List[Any]) -> Optional[Dict[str, Any]]:
    if not values:
        return None
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def summarize(samples: Sequence[Sample]) -> Dict[str, Any]:
    """``{"samples", "sm_clock_mhz", "mem_clock_mhz", "temperature_c", "power_w"`` (each
    ``{"min", "median", "max"}`` over the readings that have it, ``None`` when none has),
    ``"reasons_seen"`` (names, by bit), ``"throttled_samples"}``."""
    seen = 0
    for s in samples:
        seen |= s.reasons
    return {
        "samples": len(samples),
        "sm_clock_mhz": _spread([s.sm_clock_mhz for s in samples if s.sm_clock_mhz is not None]),
        "mem_clock_mhz": _spread([s.mem_clock_mhz for s in samples if s.mem_clock_mhz is not None]),
        "temperature_c": _spread([s.temperature_c for s in samples if s.temperature_c is not None]),
        "power_w": _spread([s.power_w for s in samples if s.power_w is not None]),
        "reasons_seen": reason_names(seen),
        "throttled_samples": sum(1 for s in samples if is_throttled(s.reasons)),
    }


def throttled_windows(samples: Sequence[Sample]) -> List[Tuple[int, int]]:
    """``(start_ns, end_ns)`` intervals during which the GPU was throttled: from each throttled
    reading to the next reading (the last reading's own instant when it is the last), merged
    where they touch or overlap. A timed call whose ``[start, end]`` overlaps one ran (partly)
    on lowered clocks."""
    ordered = sorted(samples, key=lambda s: s.t_ns)
    windows: List[Tuple[int, int]] = []
    for i, s in enumerate(ordered):
        if not is_throttled(s.reasons):
            continue
        end = ordered[i + 1].t_ns if i + 1 < len(ordered) else s.t_ns
        if windows and s.t_ns <= windows[-1][1]:
            windows[-1] = (windows[-1][0], max(windows[-1][1], end))
        else:
            windows.append((s.t_ns, end))
    return windows
