"""Worker modes and their device backends.

* ``gpu``: torch on CUDA. The zygote imports torch but never creates a CUDA context; a child
  creates it on ``init`` (under the server's lease), or, when ``init`` defers it
  (``context=False``), at the first instruction that takes the lease (``ensure_context``).
* ``sim``: simulated GPUs for machines without one (design.md §5). Tensors stay torch CPU
  tensors, lease messages are exactly those of ``gpu`` mode, target is ``{"arch":"simulated"}``.
  With ``--sim-devices N`` the devices are ``sim-0`` .. ``sim-<N-1>``; ``CUDA_VISIBLE_DEVICES``
  (e.g. ``sim-0,sim-2``) selects which ones a child sees.
* ``cpu``: no torch at all, no lease messages; tensor uploads are ``unavailable``.

Library uploads work in every mode (``libraries.py``: ``tvm_ffi`` when importable, else the
plain C ABI of ``docs/c-abi.md``). On CPU workers this is an extension over upstream, whose CPU
workers answer ``unavailable``: a host-only library can be called with CPU tensors and numpy
arrays the program creates itself.

``cpu_only`` functions run under the CUPTI guard in ``gpu`` mode (installed by the child after
``init`` through ``set_cpu_only_guard``) and directly in ``sim`` and ``cpu`` modes, which have no
GPU to touch.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import importlib.metadata
import math
import mmap
import os
import sys
import warnings
from typing import Any, Callable, ContextManager, Dict, List, Optional, Sequence, Tuple

from . import cabi, cuda_driver
from .builtins import ARCH_ENV
from .errors import ExecutionError
from .libraries import LibraryLoader, LoadedLibrary
from .modules import LoadedPythonModule
from .staging import PinnedBlobCache, checked_blob_size, read_blob
from .values import DTYPE_ITEM_SIZES

MODES = ("gpu", "sim", "cpu")

CPU_ONLY_UNAVAILABLE = "cpu_only requires the CUPTI guard, which this worker does not have"

# A factory returning a context manager that watches the CUDA API during a cpu_only call and
# raises GPUAccessViolation on exit if the call touched it. Installed by set_cpu_only_guard().
_cpu_only_guard: Optional[Callable[[], ContextManager[None]]] = None


def set_cpu_only_guard(factory: Optional[Callable[[], ContextManager[None]]]) -> None:
    global _cpu_only_guard
    _cpu_only_guard = factory


def cpu_only_guard_factory() -> Optional[Callable[[], ContextManager[None]]]:
    """The installed guard factory, or None."""
    return _cpu_only_guard


# --------------------------------------------------------------------------- zygote side


def import_heavy(mode: str) -> None:
    """Import what programs will need, once, in the zygote. Creates no CUDA context."""
    try:
        import numpy  # noqa: F401
        import numpy.random  # noqa: F401  (lazily imported by numpy 2; children reseed it)
    except ImportError:
        pass  # optional for programs; torch works without it
    if mode in ("gpu", "sim"):
        import torch

        if torch.cuda.is_initialized():
            raise RuntimeError("importing torch initialized CUDA in the zygote")
    optional = ("tvm_ffi", "tvm", "triton") if mode == "gpu" else ("tvm_ffi",)
    for name in optional:
        try:
            __import__(name)
        except Exception:
            pass  # optional
    if mode in ("gpu", "sim"):
        import torch

        if torch.cuda.is_initialized():
            raise RuntimeError("an optional import initialized CUDA in the zygote")


def preload(names: List[str], mode: str) -> None:
    """Import the server's ``--preload-modules`` in the zygote, after ``import_heavy``: every child
    forked afterwards starts with them (e.g. torch on a CPU server that runs ``kcoral eval``,
    whose CPU zygote imports no torch of its own). A module that fails to import fails the
    zygote's start with its error; one that initializes CUDA in a GPU zygote does too."""
    for name in names:
        try:
            importlib.import_module(name)
        except BaseException as exc:
            raise RuntimeError(f"--preload-modules: importing {name!r} failed: "
                               f"{type(exc).__name__}: {exc}") from exc
        torch = sys.modules.get("torch")
        if mode in ("gpu", "sim") and torch is not None and torch.cuda.is_initialized():
            raise RuntimeError(f"--preload-modules: importing {name!r} initialized CUDA in the "
                               "zygote")


def _dist_version(distribution: str) -> Optional[str]:
    try:
        return importlib.metadata.version(distribution)
    except Exception:
        return None


def collect_versions(mode: str) -> Dict[str, str]:
    """Versions reported in ``hello`` and ``ready`` (spec server §10, §9)."""
    versions: Dict[str, str] = {}
    if mode == "cpu":
        tvm_ffi = _dist_version("apache-tvm-ffi")
        if tvm_ffi is not None:
            versions["tvm_ffi"] = tvm_ffi
        return versions
    import torch

    versions["torch"] = str(torch.__version__)
    if mode == "sim":
        versions["simulated"] = "cpu"
        module = sys.modules.get("tvm_ffi")
        if module is not None and getattr(module, "__version__", None):
            versions["tvm_ffi"] = str(module.__version__)
        return versions
    if torch.version.cuda:
        versions["cuda"] = str(torch.version.cuda)
    for name in ("tvm", "tvm_ffi", "triton"):
        module = sys.modules.get(name)
        version = getattr(module, "__version__", None) if module is not None else None
        if version:
            versions[name] = str(version)
    for key, distribution in (("cutlass", "nvidia-cutlass-dsl"), ("flashinfer", "flashinfer-python")):
        version = _dist_version(distribution)
        if version is not None:
            versions[key] = version
    return versions


# --------------------------------------------------------------------------- helpers


def visible_sim_devices(spec: Optional[str], count: int) -> List[str]:
    """The simulated devices a child sees: ``CUDA_VISIBLE_DEVICES`` entries ``sim-<k>``
    (or plain indices ``k``) with ``k < count``; all of them when the variable is unset."""
    if spec is None:
        return [f"sim-{k}" for k in range(count)]
    out: List[str] = []
    for raw in spec.split(","):
        entry = raw.strip()
        if not entry:
            continue
        digits = entry[4:] if entry.startswith("sim-") else entry
        if not digits.isdigit() or int(digits) >= count:
            raise RuntimeError(
                f"CUDA_VISIBLE_DEVICES entry {entry!r} names no simulated GPU "
                f"(this worker simulates sim-0..sim-{count - 1})"
            )
        name = f"sim-{int(digits)}"
        if name in out:
            raise RuntimeError(f"CUDA_VISIBLE_DEVICES names {name} twice")
        out.append(name)
    if not out:
        raise RuntimeError("CUDA_VISIBLE_DEVICES selects no simulated GPU")
    return out


def format_uuid(value: Any) -> str:
    text = str(value)
    return text if text.startswith(("GPU-", "MIG-")) else "GPU-" + text


def arch_of(major: int, minor: int) -> Tuple[str, str]:
    """(target arch, TVM_FFI_CUDA_ARCH_LIST spelling): sm_90a / 9.0a, sm_75 / 7.5."""
    suffix = "a" if major >= 9 else ""
    return f"sm_{major}{minor}{suffix}", f"{major}.{minor}{suffix}"


PINNED_STAGING_MAX_BYTES = 512 << 20


# --------------------------------------------------------------------------- backends


class CpuBackend:
    """``--device cpu``: Python modules, bytes and files only."""

    mode = "cpu"
    uses_lease = False
    tensor_type: Optional[type] = None
    torch: Any = None
    # Serves more than one request (set by the child): cached pinned staging pays off.
    reused = False

    # get_function on a handle that is neither a module nor a library (spec protocol §2.4).
    other_handle_kind = "unavailable"

    def __init__(self, versions: Dict[str, str]) -> None:
        self.versions = versions
        self.libraries = LibraryLoader()
        # ``init`` deferred the device context and nothing has created it since: until
        # ``ensure_context``, nothing here touches a device (drains and frees are no-ops).
        self.context_pending = False

    def prepare(self) -> None:
        """Work that needs no lease, done as soon as the child is forked (nothing here)."""

    def init(self, context: bool = True) -> Tuple[Dict[str, str], List[str]]:
        """Create the device context (``context=False``: only learn the devices, leaving the
        context to ``ensure_context``); returns (target, device_uuids)."""
        return {}, []

    def ensure_context(self) -> None:
        """Create the device context ``init`` deferred (call under the lease); no-op when it
        exists. CPU workers have none."""

    def load_tensor(self, blob_path: str, dtype: str, shape: Sequence[int]) -> Any:
        raise ExecutionError("unavailable", "tensor uploads require a GPU worker")

    def get_function(self, handle: Any, name: str) -> Any:
        if isinstance(handle, (LoadedPythonModule, LoadedLibrary, cabi.CLibrary)):
            return handle.get_function(name)
        raise ExecutionError(
            self.other_handle_kind, "get_function expects an uploaded module or library handle"
        )

    def run_cpu_only(self, fn: Callable[..., Any], args: List[Any]) -> Any:
        return fn(*args)  # there is no GPU here to touch

    def prepare_release(self) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def take_last_error(self) -> Optional[str]:
        return None

    def empty_cache(self) -> None:
        pass


class SimBackend(CpuBackend):
    """Simulated GPUs: torch CPU tensors stand in for device tensors."""

    mode = "sim"
    uses_lease = True
    other_handle_kind = "runtime"

    def __init__(self, versions: Dict[str, str], sim_devices: int) -> None:
        import torch

        self.torch = torch
        self.tensor_type = torch.Tensor
        self.sim_devices = sim_devices
        # How many times a (simulated) context was created: once, at ``init`` or later.
        self.contexts_created = 0
        super().__init__(versions)

    def init(self, context: bool = True) -> Tuple[Dict[str, str], List[str]]:
        devices = visible_sim_devices(os.environ.get("CUDA_VISIBLE_DEVICES"), self.sim_devices)
        if context:
            self.contexts_created += 1
        else:
            self.context_pending = True
        return {"arch": "simulated"}, devices

    def ensure_context(self) -> None:
        """Simulated: records that the context was created, as a GPU worker would create it."""
        if self.context_pending:
            self.context_pending = False
            self.contexts_created += 1

    def _dtype(self, name: str) -> Any:
        dtype = getattr(self.torch, name, None) if name in DTYPE_ITEM_SIZES else None
        if not isinstance(dtype, self.torch.dtype):
            raise ExecutionError("runtime", f"unknown dtype: {name!r}")
        return dtype

    def load_tensor(self, blob_path: str, dtype: str, shape: Sequence[int]) -> Any:
        torch = self.torch
        torch_dtype = self._dtype(dtype)
        try:
            nbytes = math.prod(shape) * DTYPE_ITEM_SIZES[dtype]
            tensor = torch.empty(list(shape), dtype=torch_dtype)
            if nbytes:
                flat = tensor.reshape(-1).view(torch.uint8).numpy()
                read_blob(blob_path, memoryview(flat))
            return tensor
        except Exception as exc:
            raise ExecutionError("runtime", f"malformed tensor: {exc}") from exc


class GpuBackend(SimBackend):
    """Real CUDA devices through torch."""

    mode = "gpu"

    def __init__(self, versions: Dict[str, str]) -> None:
        super().__init__(versions, 0)
        self.device_count = 0  # devices with a context (0 until it exists)
        self._driver: Optional[cuda_driver.Driver] = None
        self._cudart: Optional[_CudaErrors] = None
        self._pinned: Optional[PinnedBlobCache] = None

    def _pinned_blobs(self) -> PinnedBlobCache:
        if self._pinned is None:
            torch = self.torch

            def allocate(nbytes: int) -> Tuple[Any, memoryview]:
                buffer = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
                return buffer, memoryview(buffer.numpy())

            self._pinned = PinnedBlobCache(allocate)
        return self._pinned

    def prepare(self) -> None:
        """Initialise the driver (``cuInit``), without the lease; best effort.

        ``cuInit`` is ~105 of the ~250 ms a new worker needs on an H200 before its context
        exists, and it creates no context: other processes calling it in a loop while kernels
        were timed left every kernel's median and p99 within the control's own round-to-round
        spread, where context creation stalled launches by milliseconds (docs/decisions/fresh-worker-context-lease.md,
        "A fresh worker initialises the CUDA driver before it takes the lease"). Only the raw
        driver call is made here (``torch.cuda.init()`` did disturb a launch-bound kernel in
        the same probe); torch's own initialisation and the context stay in ``init``, under
        the lease, which also reports any failure (a failed ``cuInit`` here is retried there).
        """
        try:
            driver = cuda_driver.Driver.load()
            driver.init()
            self._driver = driver
        except (OSError, AttributeError):
            pass  # init() meets the same problem under the lease and reports it as torch does
        try:
            self._cudart = _CudaErrors.load(self.torch)  # libcudart came with torch's import
        except RuntimeError:
            self._cudart = None  # init() loads it again and reports the failure

    def _initialised_driver(self) -> Optional[cuda_driver.Driver]:
        """The driver, when ``cuInit`` has succeeded in this process (``prepare``, or once more
        here, still before the gate names its library in ``CUDA_INJECTION64_PATH``)."""
        driver = self._driver
        if driver is None:
            try:
                driver = self._driver = cuda_driver.Driver.load()
            except (OSError, AttributeError):
                return None
        if not driver.initialized:
            try:
                driver.init()
            except AttributeError:
                return None
        return driver if driver.initialized else None

    def init(self, context: bool = True) -> Tuple[Dict[str, str], List[str]]:
        """The devices, with their contexts (under the lease), or with ``context=False`` without
        them: count, compute capability and UUIDs come from the driver API, which creates no
        context, and ``ensure_context`` creates them later. Deferring needs a driver initialised
        before the gate starts (the gate's library must not be this worker's own injection);
        where ``cuInit`` fails the contexts are created here, as torch reports that failure."""
        if not context:
            driver = self._initialised_driver()
            if driver is not None:
                return self._devices_without_context(driver)
        return self._create_context()

    def _devices_without_context(
        self, driver: cuda_driver.Driver
    ) -> Tuple[Dict[str, str], List[str]]:
        count = driver.device_count()
        if count == 0:
            raise RuntimeError("no CUDA device is visible to this worker")
        uuids = [driver.uuid(index) for index in range(count)]
        target = self._target(*driver.capability(0))
        self.context_pending = True
        return target, uuids

    def ensure_context(self) -> None:
        """Creates the contexts ``init`` deferred, as ``init`` creates them (call under the
        lease); no-op once they exist."""
        if self.context_pending:
            self._create_context()
            self.context_pending = False

    def _create_context(self) -> Tuple[Dict[str, str], List[str]]:
        torch = self.torch
        torch.cuda.init()
        count = torch.cuda.device_count()
        if count == 0:
            raise RuntimeError("no CUDA device is visible to this worker")
        self.device_count = count
        if self._cudart is None:
            self._cudart = _CudaErrors.load(torch)
        for index in range(count):
            torch.empty(1, device=f"cuda:{index}")  # creates the context on every device
            torch.cuda.synchronize(index)
        target = self._target(*torch.cuda.get_device_capability(0))
        uuids = [format_uuid(torch.cuda.get_device_properties(i).uuid) for i in range(count)]
        return target, uuids

    @staticmethod
    def _target(major: int, minor: int) -> Dict[str, str]:
        arch, arch_list = arch_of(major, minor)
        # cpu_only compiles read these instead of querying the driver off-lease:
        # tvm_ffi.cpp builds and kcoral_runtime.builtins.compile_cuda (its default arch).
        os.environ.setdefault("TVM_FFI_CUDA_ARCH_LIST", arch_list)
        os.environ.setdefault(ARCH_ENV, arch)
        return {"arch": arch}

    def load_tensor(self, blob_path: str, dtype: str, shape: Sequence[int]) -> Any:
        torch = self.torch
        torch_dtype = self._dtype(dtype)
        try:
            nbytes = math.prod(shape) * DTYPE_ITEM_SIZES[dtype]
            if nbytes == 0:
                return torch.empty(list(shape), dtype=torch_dtype, device="cuda")
            if self.reused and nbytes <= PINNED_STAGING_MAX_BYTES:
                # Page-locked staging (staging.py): read by several threads, or still there from
                # an earlier request with the same blob; then one DMA, complete on return (the
                # staged bytes may serve a later request).
                staging = self._pinned_blobs().stage(blob_path, nbytes)
                return staging.view(torch_dtype).reshape(list(shape)).to("cuda")
            with open(blob_path, "rb", buffering=0) as f:
                checked_blob_size(f.fileno(), nbytes)
                mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", UserWarning)  # "buffer is not writable"
                    host = torch.frombuffer(mapping, dtype=torch_dtype)
                try:
                    return host.reshape(list(shape)).to("cuda")  # independent device storage
                finally:
                    del host
            finally:
                try:
                    mapping.close()
                except BufferError:
                    pass  # still referenced; unmapped when collected
        except Exception as exc:
            raise ExecutionError("runtime", f"malformed tensor: {exc}") from exc

    def run_cpu_only(self, fn: Callable[..., Any], args: List[Any]) -> Any:
        """``fn(*args)`` under the installed guard (``unavailable`` when there is none).

        Garbage that is already unreachable is collected first and the cyclic collector is
        paused during the call, so that freeing an earlier instruction's CUDA tensors (which can
        enter the CUDA API, e.g. ``cudaEventQuery`` for cross-stream uses) is not blamed on the
        cpu_only function. Reference-counted frees inside the call still count: a cpu_only
        function that drops the last reference to a CUDA tensor does touch the GPU.
        """
        guard = _cpu_only_guard
        if guard is None:
            raise ExecutionError("unavailable", CPU_ONLY_UNAVAILABLE)
        gc.collect()
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            with guard():
                return fn(*args)
        finally:
            if was_enabled:
                gc.enable()

    def synchronize(self) -> None:
        """Drain every device with a context; raises on a (sticky) CUDA error."""
        for index in range(self.device_count):
            self.torch.cuda.synchronize(index)

    def prepare_release(self) -> None:
        """Drain, and give back what the allocator caches beyond what is allocated.
        ``empty_cache`` with nothing to give back costs ~0.5 us on the H200; asking first
        (``memory_reserved``/``memory_allocated`` flatten torch's whole statistics table) cost
        far more than that. Nothing to do before the context exists."""
        if self.context_pending:
            return
        self.synchronize()
        self.torch.cuda.empty_cache()

    def take_last_error(self) -> Optional[str]:
        """CUDA's pending error (``None`` before the context exists: nothing ran)."""
        if self.context_pending:
            return None
        if self._cudart is None:
            self._cudart = _CudaErrors.load(self.torch)
        return self._cudart.take_last_error()

    def empty_cache(self) -> None:
        if not self.context_pending:
            self.torch.cuda.empty_cache()


class _CudaErrors:
    """``cudaGetLastError`` of the libcudart torch itself uses (found via /proc/self/maps)."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._get_last_error = lib.cudaGetLastError
        self._get_last_error.argtypes = []
        self._get_last_error.restype = ctypes.c_int
        self._name = lib.cudaGetErrorName
        self._name.argtypes = [ctypes.c_int]
        self._name.restype = ctypes.c_char_p
        self._text = lib.cudaGetErrorString
        self._text.argtypes = [ctypes.c_int]
        self._text.restype = ctypes.c_char_p

    @classmethod
    def load(cls, torch: Any) -> "_CudaErrors":
        candidates: List[str] = []
        try:
            with open("/proc/self/maps") as maps:
                for line in maps:
                    path = line.rstrip("\n").split(maxsplit=5)[-1]
                    if "/libcudart.so" in path and path not in candidates:
                        candidates.append(path)
        except OSError:
            pass
        if torch.version.cuda:
            candidates.append(f"libcudart.so.{torch.version.cuda.split('.', 1)[0]}")
        found = ctypes.util.find_library("cudart")
        if found:
            candidates.append(found)
        candidates.append("libcudart.so")
        failures = []
        for candidate in dict.fromkeys(candidates):
            try:
                return cls(ctypes.CDLL(candidate))
            except (OSError, AttributeError) as exc:
                failures.append(f"{candidate}: {exc}")
        raise RuntimeError("cannot load libcudart to read CUDA's last error: " + "; ".join(failures))

    def take_last_error(self) -> Optional[str]:
        code = self._get_last_error()
        if code == 0:
            return None
        name = self._name(code)
        text = self._text(code)
        name_s = name.decode("utf-8", "replace") if name else "cudaErrorUnknown"
        text_s = text.decode("utf-8", "replace") if text else "unknown error"
        return f"CUDA error {name_s} ({code}): {text_s}"


def make_backend(mode: str, versions: Dict[str, str], sim_devices: int) -> CpuBackend:
    if mode == "gpu":
        return GpuBackend(versions)
    if mode == "sim":
        return SimBackend(versions, sim_devices)
    if mode == "cpu":
        return CpuBackend(versions)
    raise ValueError(f"unknown mode {mode!r}")
