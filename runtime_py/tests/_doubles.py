"""Test doubles shared by several test modules: a lease that records what the engine asks of
it, and the build of the stand-in libcupti (fixtures/cabi/fake_cupti.c)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import List

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "cabi"


class RecordingLease:
    """The child's lease without a server: ``acquire``/``release`` are logged when they change
    the state."""

    def __init__(self, log: List[str]) -> None:
        self.log = log
        self.held = False

    def acquire(self) -> None:
        if not self.held:
            self.log.append("acquire")
            self.held = True

    def release(self) -> None:
        if self.held:
            self.log.append("release")
            self.held = False

    def request_done(self) -> None:
        self.held = False

    def begin_request(self) -> None:
        pass

    def take_receipt(self) -> None:
        return None


def c_compiler() -> str:
    for candidate in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if candidate and shutil.which(candidate):
            return candidate
    raise AssertionError("no C compiler (cc, gcc, clang or $CC) to build the test libraries")


def cuda_include() -> Path:
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and (Path(root) / "include" / "cupti_callbacks.h").is_file():
            return Path(root) / "include"
    nvcc = shutil.which("nvcc")
    if nvcc:
        include = Path(os.path.realpath(nvcc)).parents[1] / "include"
        if (include / "cupti_callbacks.h").is_file():
            return include
    raise AssertionError("cupti_callbacks.h not found (install the CUDA toolkit's CUPTI headers)")


def build_fake_nvml(out: Path) -> str:
    """Compiles the stand-in NVML (``fixtures/nvml/fake_nvml.c``) to ``out``; returns its path."""
    source = Path(__file__).resolve().parent / "fixtures" / "nvml" / "fake_nvml.c"
    cmd = [c_compiler(), "-shared", "-fPIC", "-Wall", "-Wextra", "-Werror", str(source),
           "-o", str(out), "-lpthread"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return str(out)


def build_fake_cupti(out: Path) -> str:
    """Compiles the stand-in libcupti to ``out`` (name it other than ``libcupti.so*``: the real
    CUPTI search prefers copies already mapped into the process)."""
    cmd = [c_compiler(), "-shared", "-fPIC", "-Wall", "-Werror", f"-I{cuda_include()}",
           str(FIXTURES / "fake_cupti.c"), "-o", str(out), "-lpthread"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return str(out)
