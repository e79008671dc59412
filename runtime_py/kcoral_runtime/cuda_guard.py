"""The ``cpu_only`` guard: watches CUDA runtime and driver API entry through CUPTI (ctypes only).

While a ``CudaGuard`` is active, CUPTI calls back on every runtime (``cuda*``) and driver
(``cu*``) API entry in this process, from any thread. The FIRST entry is recorded as a
``Violation``: the API function's name, ``time.monotonic_ns()`` at the callback (spec server §3:
the pool maps it to ``interfered_request_id``), a location and the Python stack at that moment.
The call itself proceeds (CUPTI cannot refuse it); the caller decides what to do after the
guarded function returns (``cpu_only_guard`` raises ``GPUAccessViolation``).

Location rule (first that applies, walking the calling thread's Python stack innermost first):

1. the innermost frame whose file name starts with ``<uploaded:`` (code of an uploaded module);
2. the innermost frame that is not internal: internal are files of this package
   (``kcoral_runtime``), of ``torch``, of the Python standard library (not site-packages) and
   ``<frozen ...>`` modules; so a workspace file imported by the program, or a third-party
   package, is named;
3. the innermost frame at all;
4. ``<no Python frame>`` when the call came from a thread that never ran Python code.

Formatted ``"<file>:<line> in <function>"``.

CUPTI allows one subscriber per process: ``start()`` subscribes and enables the runtime and
driver domains, ``stop()`` always unsubscribes (call it in a ``finally``; the context manager and
``cpu_only_guard`` do). Only one guard can be active at a time; a CUPTI subscriber of someone else
(profiler, Nsight) makes ``start()`` raise ``GuardUnavailable``, as does a missing or unusable
libcupti (the engine maps it to kind ``unavailable``).

Which libcupti (``cupti_candidates``): ``$KCORAL_CUPTI_LIBRARY`` alone if set; else one already
mapped into the process (e.g. by torch), the ``nvidia-cuda-cupti`` wheel in site-packages
(``nvidia/cu13/lib``, ``nvidia/cuda_cupti/lib``), ``$CUDA_HOME``/``$CUDA_PATH``/
``/usr/local/cuda`` ``extras/CUPTI/lib64`` and ``lib64``, then ``ctypes.util.find_library``.
The first that loads and has the needed symbols is used for the life of the process.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import ctypes.util
import glob
import os
import re
import site
import sys
import sysconfig
import threading
import time
import traceback
from dataclasses import dataclass
from types import FrameType, TracebackType
from typing import Dict, Iterator, List, Optional, Tuple, Type

from .errors import ExecutionError, GPUAccessViolation

__all__ = [
    "CudaGuard",
    "GuardUnavailable",
    "Violation",
    "cpu_only_guard",
    "cupti_candidates",
    "frame_location",
    "stop_active",
]

LIBRARY_ENV = "KCORAL_CUPTI_LIBRARY"
NO_PYTHON_FRAME = "<no Python frame>"
MAX_DISTINCT_CALLS = 8

# Device queries that libraries make before real work (torch asks cuCtxGetDevice/cudaGetDevice
# before it synchronizes). They still violate cpu_only, but the error names the first other call
# if there is one. A query is a `...Get...`/`...Peek...` entry point (version suffixes ignored).
_QUERY = re.compile(r"^cu(da)?[A-Za-z]*?(Get|Peek)[A-Z]")
_VERSION_SUFFIX = re.compile(r"(_v\d+)?(_ptsz|_ptds)?$")


def is_query_call(name: str) -> bool:
    """Whether a CUDA API name is a query (e.g. cudaGetDevice, cuCtxGetDevice_v2)."""
    return _QUERY.match(_VERSION_SUFFIX.sub("", name)) is not None

CUPTI_SUCCESS = 0
CUPTI_CB_DOMAIN_DRIVER_API = 1
CUPTI_CB_DOMAIN_RUNTIME_API = 2
CUPTI_API_ENTER = 0
CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED = 39

_DOMAINS = (CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_CB_DOMAIN_DRIVER_API)


class GuardUnavailable(Exception):
    """CUPTI cannot be loaded or subscribed: the guard cannot watch (kind ``unavailable``)."""


@dataclass(frozen=True)
class Violation:
    cuda_call: str  # e.g. "cudaDeviceSynchronize", "cuCtxSynchronize"
    location: str  # "<file>:<line> in <function>" (see the module docstring)
    detected_at_ns: int  # time.monotonic_ns() when the API was entered
    traceback: str  # the calling thread's Python stack at that moment, traceback-formatted
    call_count: int = 1  # API entries seen while the guard was active (>= 1)
    calls: Tuple[str, ...] = ()  # the first MAX_DISTINCT_CALLS distinct API names, in order


class _CallbackData(ctypes.Structure):
    """``CUpti_CallbackData`` (cupti_callbacks.h), for the runtime and driver API domains."""

    _fields_ = [
        ("callbackSite", ctypes.c_int),
        ("functionName", ctypes.c_char_p),
        ("functionParams", ctypes.c_void_p),
        ("functionReturnValue", ctypes.c_void_p),
        ("symbolName", ctypes.c_char_p),
        ("context", ctypes.c_void_p),
        ("contextUid", ctypes.c_uint32),
        ("correlationData", ctypes.POINTER(ctypes.c_uint64)),
        ("correlationId", ctypes.c_uint32),
    ]


# void CUPTIAPI (*CUpti_CallbackFunc)(void*, CUpti_CallbackDomain, CUpti_CallbackId, const void*)
_CALLBACK_TYPE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p)


# --------------------------------------------------------------------------- library discovery


def _mapped_cupti() -> List[str]:
    """libcupti files already mapped into this process (another copy must not be loaded)."""
    found: List[str] = []
    try:
        with open("/proc/self/maps", "r", encoding="utf-8", errors="replace") as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) == 6:
                    path = parts[5].strip()
                    if os.path.basename(path).startswith("libcupti.so") and path not in found:
                        found.append(path)
    except OSError:
        pass
    return found


def _site_dirs() -> List[str]:
    dirs: List[str] = []
    try:
        dirs.extend(site.getsitepackages())
    except Exception:
        pass
    try:
        dirs.append(site.getusersitepackages())
    except Exception:
        pass
    dirs.extend(p for p in sys.path if p and os.path.isdir(p))
    seen: List[str] = []
    for d in dirs:
        if d not in seen:
            seen.append(d)
    return seen


def _sorted_versions(pattern: str) -> List[str]:
    # libcupti.so.13 before libcupti.so.2025.x before libcupti.so: versioned sonames first.
    return sorted(glob.glob(pattern), key=lambda p: (p.endswith(".so"), p))


def cupti_candidates() -> List[str]:
    """Where libcupti may be, best first (see the module docstring)."""
    explicit = os.environ.get(LIBRARY_ENV)
    if explicit:
        return [explicit]
    candidates: List[str] = list(_mapped_cupti())
    for base in _site_dirs():
        for sub in ("nvidia/cu13/lib", "nvidia/cuda_cupti/lib", "nvidia/cu12/lib"):
            candidates.extend(_sorted_versions(os.path.join(base, sub, "libcupti.so*")))
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    for root in roots:
        if root:
            for sub in ("extras/CUPTI/lib64", "lib64"):
                candidates.extend(_sorted_versions(os.path.join(root, sub, "libcupti.so*")))
    name = ctypes.util.find_library("cupti")
    if name:
        candidates.append(name)
    unique: List[str] = []
    for c in candidates:
        if c not in unique:
            unique.append(c)
    return unique


class _Cupti:
    """The few CUPTI entry points the guard uses, with their C signatures."""

    def __init__(self, lib: ctypes.CDLL, path: str) -> None:
        self.path = path
        self.lib = lib  # CDLL: the GIL is released during these calls
        self.subscribe_fn = lib.cuptiSubscribe
        self.subscribe_fn.argtypes = [ctypes.POINTER(ctypes.c_void_p), _CALLBACK_TYPE, ctypes.c_void_p]
        self.subscribe_fn.restype = ctypes.c_int
        self.enable_domain_fn = lib.cuptiEnableDomain
        self.enable_domain_fn.argtypes = [ctypes.c_uint32, ctypes.c_void_p, ctypes.c_int]
        self.enable_domain_fn.restype = ctypes.c_int
        self.unsubscribe_fn = lib.cuptiUnsubscribe
        self.unsubscribe_fn.argtypes = [ctypes.c_void_p]
        self.unsubscribe_fn.restype = ctypes.c_int
        try:
            self.result_string_fn = lib.cuptiGetResultString
            self.result_string_fn.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
            self.result_string_fn.restype = ctypes.c_int
        except AttributeError:
            self.result_string_fn = None

    def describe(self, code: int) -> str:
        if self.result_string_fn is not None:
            text = ctypes.c_char_p()
            if self.result_string_fn(code, ctypes.byref(text)) == CUPTI_SUCCESS and text.value:
                return f"{text.value.decode('ascii', 'replace')} ({code})"
        return f"CUPTI error {code}"

    def subscribe(self) -> ctypes.c_void_p:
        handle = ctypes.c_void_p()
        code = self.subscribe_fn(ctypes.byref(handle), _CALLBACK, None)
        if code != CUPTI_SUCCESS:
            hint = ""
            if code == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED:
                hint = "; another CUPTI client (a profiler?) is subscribed in this process"
            raise GuardUnavailable(
                f"cannot subscribe to CUPTI callbacks ({self.path}): {self.describe(code)}{hint}"
            )
        try:
            for domain in _DOMAINS:
                code = self.enable_domain_fn(1, handle, domain)
                if code != CUPTI_SUCCESS:
                    raise GuardUnavailable(
                        f"cannot enable CUPTI callback domain {domain} ({self.path}):"
                        f" {self.describe(code)}"
                    )
        except BaseException:
            self.unsubscribe_fn(handle)
            raise
        return handle

    def unsubscribe(self, handle: ctypes.c_void_p) -> int:
        return int(self.unsubscribe_fn(handle))


_load_lock = threading.Lock()
_cupti_by_path: Dict[str, _Cupti] = {}
_chosen: Optional[_Cupti] = None


def load_cupti(path: Optional[str] = None) -> _Cupti:
    """The CUPTI library (cached); ``path`` forces one file. Raises ``GuardUnavailable``."""
    global _chosen
    with _load_lock:
        if path is None and _chosen is not None:
            return _chosen
        candidates = [path] if path else cupti_candidates()
        if not candidates:
            raise GuardUnavailable(
                "no libcupti found (searched already mapped libraries, site-packages nvidia/*,"
                " $CUDA_HOME, $CUDA_PATH, /usr/local/cuda extras/CUPTI/lib64 and lib64, ldconfig)"
            )
        problems: List[str] = []
        for candidate in candidates:
            cupti = _cupti_by_path.get(candidate)
            if cupti is None:
                try:
                    cupti = _Cupti(ctypes.CDLL(candidate), candidate)
                except OSError as exc:
                    problems.append(str(exc))
                    continue
                except AttributeError as exc:
                    problems.append(f"{candidate}: not a usable libcupti ({exc})")
                    continue
                _cupti_by_path[candidate] = cupti
            if path is None:
                _chosen = cupti
            return cupti
        raise GuardUnavailable("cannot load libcupti: " + "; ".join(problems))


# --------------------------------------------------------------------------- locations


def _internal_prefixes() -> Tuple[List[str], List[str], List[str]]:
    """(packages internal wherever they live, stdlib dirs, site-packages dirs), as prefixes."""
    packages = [os.path.dirname(os.path.abspath(__file__)) + os.sep]
    torch = sys.modules.get("torch")
    torch_file = getattr(torch, "__file__", None) if torch is not None else None
    if torch_file:
        packages.append(os.path.dirname(os.path.abspath(torch_file)) + os.sep)
    paths = sysconfig.get_paths()
    stdlib = [os.path.abspath(paths[k]) + os.sep for k in ("stdlib", "platstdlib") if paths.get(k)]
    site_dirs = [os.path.abspath(paths[k]) + os.sep for k in ("purelib", "platlib") if paths.get(k)]
    return packages, stdlib, site_dirs


def _is_internal(
    filename: str, packages: List[str], stdlib: List[str], site_dirs: List[str]
) -> bool:
    if filename.startswith("<frozen"):
        return True
    if filename.startswith("<"):  # <uploaded:...>, <string>, <stdin>: user code
        return False
    path = os.path.abspath(filename)
    if any(path.startswith(p) for p in packages):
        return True
    # site-packages may sit inside the stdlib directory (lib/python3.x/site-packages)
    if any(path.startswith(p) for p in site_dirs) or any(
        part in ("site-packages", "dist-packages") for part in path.split(os.sep)
    ):
        return False
    return any(path.startswith(p) for p in stdlib)


def frame_location(stack: List[traceback.FrameSummary]) -> str:
    """The location of a CUDA call for a stack (outermost first), per the module docstring."""
    if not stack:
        return NO_PYTHON_FRAME
    chosen: Optional[traceback.FrameSummary] = None
    for summary in reversed(stack):
        if summary.filename.startswith("<uploaded:"):
            chosen = summary
            break
    if chosen is None:
        packages, stdlib, site_dirs = _internal_prefixes()
        for summary in reversed(stack):
            if not _is_internal(summary.filename, packages, stdlib, site_dirs):
                chosen = summary
                break
    if chosen is None:
        chosen = stack[-1]
    return f"{chosen.filename}:{chosen.lineno} in {chosen.name}"


def _format_stack(stack: List[traceback.FrameSummary]) -> str:
    return "Traceback (most recent call last):\n" + "".join(traceback.format_list(stack))


def _violation_line(cuda_call: str, location: str, thread: str, count: int, calls: List[str]) -> str:
    line = f"GPUAccessViolation: cpu_only function called {cuda_call} at {location} (thread {thread})"
    if count > 1:
        more = ", ".join(calls) + (", ..." if count > len(calls) else "")
        line += f"; {count} CUDA API entries while watched: {more}"
    return line + "\n"


# --------------------------------------------------------------------------- the callback

_state_lock = threading.Lock()
_active: Optional["CudaGuard"] = None


def _on_callback(userdata: Optional[int], domain: int, cbid: int, cbdata: Optional[int]) -> None:
    """CUPTI callback (any thread, GIL taken by ctypes). Never raises into CUDA."""
    try:
        now = time.monotonic_ns()
        guard = _active
        if guard is None or not cbdata:
            return
        data = _CallbackData.from_address(cbdata)
        if data.callbackSite != CUPTI_API_ENTER:
            return
        try:
            frame: Optional[FrameType] = sys._getframe(1)
        except ValueError:  # a native thread with no Python frame
            frame = None
        guard._record(data.functionName, now, frame)
    except BaseException:
        pass


_CALLBACK = _CALLBACK_TYPE(_on_callback)  # must outlive every subscription: module lifetime


# --------------------------------------------------------------------------- the guard


class CudaGuard:
    """Watches CUDA API entry between ``start()`` and ``stop()`` (or as a context manager).

    ``library``: a libcupti path to use instead of the search (tests, odd installs).
    """

    def __init__(self, library: Optional[str] = None) -> None:
        self._library = library
        self._lock = threading.Lock()
        self._cupti: Optional[_Cupti] = None
        self._handle: Optional[ctypes.c_void_p] = None
        self._open = False  # recording allowed
        self._first: Optional[Tuple[str, int, str, str, str]] = None
        self._significant: Optional[Tuple[str, int, str, str, str]] = None
        self._count = 0
        self._calls: List[str] = []
        self.violation: Optional[Violation] = None

    @property
    def active(self) -> bool:
        return self._handle is not None

    def start(self) -> None:
        """Subscribe to CUPTI and begin watching. Raises ``GuardUnavailable``."""
        global _active
        if self._handle is not None:
            raise RuntimeError("this CudaGuard is already started")
        cupti = load_cupti(self._library)
        with _state_lock:
            if _active is not None:
                raise GuardUnavailable(
                    "another CudaGuard is active in this process (CUPTI allows one subscriber)"
                )
            with self._lock:
                self._first = None
                self._significant = None
                self._count = 0
                self._calls = []
                self._open = True
            self.violation = None
            _active = self
            try:
                self._handle = cupti.subscribe()
            except BaseException:
                _active = None
                with self._lock:
                    self._open = False
                raise
            self._cupti = cupti

    def stop(self) -> Optional[Violation]:
        """Unsubscribe (always) and return the first CUDA API entry seen, or None.

        Calling it again, or without ``start()``, returns the last result.
        """
        global _active
        handle, cupti = self._handle, self._cupti
        if handle is None or cupti is None:
            return self.violation
        code = CUPTI_SUCCESS
        try:
            code = cupti.unsubscribe(handle)
        finally:
            self._handle = None
            with _state_lock:
                if _active is self:
                    _active = None
            with self._lock:
                self._open = False
                # Name the first call that does GPU work (a synchronize, a launch, a copy), not
                # the device queries libraries make before it; fall back to the first call.
                first = self._significant or self._first
                count, calls = self._count, list(self._calls)
            if first is not None:
                cuda_call, detected_at_ns, location, stack_text, thread = first
                text = stack_text + _violation_line(cuda_call, location, thread, count, calls)
                self.violation = Violation(
                    cuda_call, location, detected_at_ns, text, count, tuple(calls)
                )
            if code != CUPTI_SUCCESS:
                from .log import log

                log(f"cuptiUnsubscribe failed: {cupti.describe(code)}")
        return self.violation

    def _record(self, raw_name: Optional[bytes], now: int, frame: Optional[FrameType]) -> None:
        with self._lock:
            if not self._open:
                return
            self._count += 1
            if self._first is not None and len(self._calls) >= MAX_DISTINCT_CALLS:
                return
            name = raw_name.decode("ascii", "replace") if raw_name else "<unknown CUDA API>"
            if name not in self._calls:
                self._calls.append(name)
            if self._first is not None and (self._significant is not None or is_query_call(name)):
                return
            stack = list(traceback.extract_stack(frame)) if frame is not None else []
            entry = (
                name,
                now,
                frame_location(stack),
                _format_stack(stack),
                threading.current_thread().name,
            )
            if self._first is None:
                self._first = entry
            if not is_query_call(name):
                self._significant = entry

    def __enter__(self) -> "CudaGuard":
        self.start()
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.stop()  # the result is in self.violation


@contextlib.contextmanager
def cpu_only_guard(library: Optional[str] = None) -> Iterator[None]:
    """For ``devices.set_cpu_only_guard(cpu_only_guard)``: run the body under a ``CudaGuard``.

    No CUPTI -> ``ExecutionError("unavailable", ...)`` before the body runs. A CUDA API entry ->
    ``GPUAccessViolation`` after the body (it wins over an exception the body raised, which
    stays attached as ``__context__``).
    """
    guard = CudaGuard(library)
    try:
        guard.start()
    except GuardUnavailable as exc:
        raise ExecutionError("unavailable", f"cpu_only requires the CUPTI guard: {exc}") from exc
    try:
        yield
    finally:
        violation = guard.stop()
        if violation is not None:
            raise GPUAccessViolation(
                violation.cuda_call, violation.location, violation.traceback, violation.detected_at_ns
            )


def stop_active() -> bool:
    """Unsubscribe the active guard, if any; True if there was one.

    The worker calls this at the end of every program, so a guard that uploaded code started
    and never stopped cannot outlive its request (CUPTI callbacks cost time on every CUDA call).
    """
    guard = _active
    if guard is None:
        return False
    try:
        guard.stop()
    except Exception:
        pass
    return True


def _stop_at_exit() -> None:
    stop_active()


atexit.register(_stop_at_exit)
