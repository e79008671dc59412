"""Helpers for uploaded code on workers: ``from kcoral_runtime.builtins import compile_cuda, benchmark``.

* ``compile_cuda(sources, arch=None, flags=(), name="kernel") -> bytes``: nvcc builds a shared
  library (the plain C ABI of ``docs/c-abi.md``, or anything else nvcc can link) and returns its
  bytes, ready for ``upload kind=library`` on a GPU server. Works on CPU workers (no GPU needed).
* ``benchmark(fn, *args, warmup=25, repeat=100, flush_l2=True, adaptive=False, ...) -> dict``:
  latency of ``fn(*args)``, each call timed by the span of the GPU work it launched on any
  stream (CUPTI activities), with a 95 % interval of the median, flags and a GPU-state receipt.
* ``launch_times(fn, *args, warmup=25, repeat=100, flush_l2=True) -> list``: the same
  measurement, every timed call's latency in milliseconds (for percentiles).

Errors are ``ExecutionError`` with a wire kind: ``unavailable`` (no nvcc / no CUDA device),
``compile`` (nvcc failed; the message is its diagnostics from the first error on),
``runtime`` (invalid arguments).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Union

from .benchmarking import Settings, flush_buffer_bytes, measure
from .errors import ExecutionError

__all__ = ["compile_cuda", "benchmark", "launch_times", "find_nvcc", "trim_diagnostics",
           "flush_buffer_bytes"]

ARCH_ENV = "KCORAL_CUDA_ARCH"
DEFAULT_CUDA_ROOTS = ("/usr/local/cuda",)
DIAGNOSTICS_LIMIT = 4000  # characters of compiler text kept in the error message
_ARCH_RE = re.compile(r"^(sm|compute)_[0-9]{2,3}[af]?$")
_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]*$")
_COMPILED_SUFFIXES = (".cu", ".c", ".cc", ".cpp", ".cxx")
# A diagnostic line: "f.cu(3): error: ...", "f.cpp:3:5: error: ...", "ptxas error   : ...",
# "nvcc fatal   : ...", "error #20-D: ...". Words such as 'error' inside a quoted identifier do
# not match: the keyword must be followed (after optional spaces and a diagnostic number) by ':'.
_ERROR_LINE_RE = re.compile(r"\b(?:error|fatal)\b\s*(?:#\s*\d+(?:-D)?\s*)?:", re.IGNORECASE)


# --------------------------------------------------------------------------- compile_cuda


def find_nvcc() -> Optional[str]:
    """nvcc from PATH, then ``$CUDA_HOME/bin``, ``$CUDA_PATH/bin``, ``/usr/local/cuda/bin``."""
    found = shutil.which("nvcc")
    if found:
        return found
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), *DEFAULT_CUDA_ROOTS]
    for root in roots:
        if root:
            candidate = os.path.join(root, "bin", "nvcc")
            if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
                return candidate
    return None


def trim_diagnostics(text: str, limit: int = DIAGNOSTICS_LIMIT) -> str:
    """Compiler output from the first error line on (verbatim), middle-elided past ``limit``.

    With no recognizable error line the whole text is kept.
    """
    lines = text.splitlines(keepends=True)
    for index, line in enumerate(lines):
        if _ERROR_LINE_RE.search(line):
            text = "".join(lines[index:])
            break
    text = text.rstrip("\n")
    if len(text) <= limit:
        return text
    marker_budget = 64
    head = (limit - marker_budget) // 2
    tail = limit - marker_budget - head
    elided = len(text) - head - tail
    return f"{text[:head]}\n... [{elided} characters elided] ...\n{text[len(text) - tail:]}"


def _source_files(sources: Union[str, Mapping[str, str]], name: str) -> Dict[str, str]:
    if isinstance(sources, str):
        return {f"{name}.cu": sources}
    if not isinstance(sources, Mapping):
        raise ExecutionError(
            "runtime", "compile_cuda: sources must be a string or a dict {filename: source}"
        )
    files: Dict[str, str] = {}
    for filename, text in sources.items():
        if not isinstance(filename, str) or not isinstance(text, str):
            raise ExecutionError("runtime", "compile_cuda: sources must map str filenames to str")
        parts = filename.split("/")
        if (
            not filename
            or filename.startswith("/")
            or any(part in ("", ".", "..") for part in parts)
            or "\0" in filename
            or filename == "lib.so"
        ):
            raise ExecutionError("runtime", f"compile_cuda: invalid source filename {filename!r}")
        files[filename] = text
    if not any(f.endswith(_COMPILED_SUFFIXES) for f in files):
        raise ExecutionError(
            "runtime",
            "compile_cuda: no file to compile (names ending in " + ", ".join(_COMPILED_SUFFIXES) + ")",
        )
    return files


def _resolve_arch(arch: Optional[str]) -> str:
    if arch is None:
        arch = os.environ.get(ARCH_ENV) or None
        if arch is None:
            raise ExecutionError(
                "runtime",
                f"compile_cuda: no arch given and {ARCH_ENV} is not set (pass e.g. arch='sm_90a';"
                " remote compilation reads it from the GPU server's /health target.arch)",
            )
    if not isinstance(arch, str) or not _ARCH_RE.match(arch):
        raise ExecutionError(
            "runtime", f"compile_cuda: invalid arch {arch!r} (expected e.g. 'sm_90a', 'sm_100a')"
        )
    return arch


def compile_cuda(
    sources: Union[str, Mapping[str, str]],
    arch: Optional[str] = None,
    flags: Sequence[str] = (),
    name: str = "kernel",
) -> bytes:
    """Compile CUDA C++ into a shared library with nvcc; return the ``.so`` bytes.

    ``sources``: one source (written as ``<name>.cu``) or ``{filename: source}``; files ending
    in .cu/.c/.cc/.cpp/.cxx are compiled and linked, the others (headers) are only written.
    The command, run in a private temporary directory (so ``#include "x.cuh"`` finds siblings):
    ``nvcc -shared -Xcompiler -fPIC -O3 -arch=<arch> <flags...> <files...> -o lib.so``.
    Compiler warnings of a successful build go to ``sys.stderr``.
    """
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ExecutionError("runtime", f"compile_cuda: invalid name {name!r}")
    if isinstance(flags, str) or not all(isinstance(f, str) for f in flags):
        raise ExecutionError("runtime", "compile_cuda: flags must be a sequence of strings")
    files = _source_files(sources, name)
    arch = _resolve_arch(arch)
    nvcc = find_nvcc()
    if nvcc is None:
        raise ExecutionError(
            "unavailable",
            "compile_cuda: nvcc not found (searched PATH, $CUDA_HOME/bin, $CUDA_PATH/bin,"
            " /usr/local/cuda/bin)",
        )
    directory = tempfile.mkdtemp(prefix="kcoral-nvcc-")
    try:
        units: List[str] = []
        for filename, text in files.items():
            path = os.path.join(directory, filename)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
            if filename.endswith(_COMPILED_SUFFIXES):
                units.append(filename)
        output = os.path.join(directory, "lib.so")
        command = [nvcc, "-shared", "-Xcompiler", "-fPIC", "-O3", f"-arch={arch}", *flags, *units,
                   "-o", "lib.so"]
        try:
            proc = subprocess.run(
                command,
                cwd=directory,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
        except OSError as exc:
            raise ExecutionError("unavailable", f"compile_cuda: cannot run {nvcc}: {exc}") from exc
        text = proc.stdout.decode("utf-8", "replace")
        if proc.returncode != 0:
            if proc.returncode < 0:
                detail = f"nvcc was killed by signal {-proc.returncode}"
            else:
                detail = f"nvcc exited with status {proc.returncode}"
            diagnostics = trim_diagnostics(text)
            raise ExecutionError("compile", diagnostics if diagnostics else detail)
        if not os.path.isfile(output):
            raise ExecutionError("compile", "nvcc reported success but wrote no lib.so")
        if text.strip():
            sys.stderr.write(text if text.endswith("\n") else text + "\n")
        with open(output, "rb") as f:
            return f.read()
    finally:
        shutil.rmtree(directory, ignore_errors=True)


# --------------------------------------------------------------------------- benchmark


def benchmark(
    fn: Callable[..., Any],
    *args: Any,
    warmup: int = 25,
    repeat: int = 100,
    flush_l2: bool = True,
    adaptive: bool = False,
    target_rel_ci: float = 0.005,
    budget_s: float = 10.0,
    discard_throttled: bool = False,
) -> Dict[str, Any]:
    """Latency of ``fn(*args)`` in milliseconds: each call timed by the GPU work it launched.

    ``warmup`` untimed calls, then ``repeat`` timed ones (with ``adaptive``, rounds of ``repeat``
    calls until the median's 95 % confidence half-width is at most ``target_rel_ci`` of it, or
    ``budget_s`` seconds have passed). Each call is isolated (device synchronized before and
    after) and timed from the first start to the last end of every kernel, memcpy and memset it
    launched on any stream or thread (CUPTI activity records; without libcupti, CUDA events
    closed by a device-wide synchronize, and ``timing`` says so). With ``flush_l2`` the
    persisting-L2 lines are reset and twice the L2 is overwritten before every call, outside the
    timed span. Returns ``latency_ms_{median,mean,min,max}``, ``ci95_ms``,
    ``ci95_rel_half_width``, ``samples``, ``warmup``, ``repeat``, ``flush_l2``, ``timing``,
    ``activities_stable``, ``escaped_work``, ``throttled_calls``, the GPU-state ``receipt`` and
    more (docs/timing.md).
    """
    settings = Settings(warmup, repeat, flush_l2, adaptive, target_rel_ci, budget_s,
                        discard_throttled)
    return measure("benchmark", fn, args, settings)


def launch_times(
    fn: Callable[..., Any],
    *args: Any,
    warmup: int = 25,
    repeat: int = 100,
    flush_l2: bool = True,
) -> List[float]:
    """Every timed call's latency in milliseconds, in call order, measured as ``benchmark`` does.

    For percentiles or distributions that ``benchmark``'s summary leaves out::

        times = sorted(launch_times(lambda: torch.add(a, b, out=c), repeat=1000))
        p99 = times[989]
    """
    settings = Settings(warmup, repeat, flush_l2)
    return list(measure("launch_times", fn, args, settings, keep_times=True)["times_ms"])
