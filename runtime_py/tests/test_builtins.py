"""kcoral_runtime.builtins: compile_cuda with the real nvcc, benchmark's CPU-side behaviour.

Also compiles the examples of docs/c-abi.md, so the documentation stays correct.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

RUNTIME_DIR = Path(__file__).resolve().parents[1]
if str(RUNTIME_DIR) not in sys.path:
    sys.path.insert(0, str(RUNTIME_DIR))

from kcoral_runtime import builtins, cabi  # noqa: E402
from kcoral_runtime.errors import ExecutionError  # noqa: E402

DOC = RUNTIME_DIR.parent / "docs" / "c-abi.md"

needs_nvcc = pytest.mark.skipif(
    builtins.find_nvcc() is None, reason="nvcc is not installed (CI has it)"
)


def doc_block(language: str, first_line_prefix: str) -> str:
    text = DOC.read_text(encoding="utf-8")
    for match in re.finditer(r"```" + language + r"\n(.*?)```", text, re.S):
        if match.group(1).startswith(first_line_prefix):
            return match.group(1)
    raise AssertionError(f"docs/c-abi.md has no ```{language} block starting {first_line_prefix!r}")


ADD_ONE_BROKEN = """
__global__ void k(float* x) { x[0] = undefined_thing + 1.0f; }
extern "C" int add_one(void) { k<<<1, 1>>>(nullptr); return 0; }
"""


# --------------------------------------------------------------------------- compile_cuda


@needs_nvcc
def test_compile_documented_cuda_example_and_load_it(tmp_path: Path) -> None:
    source = doc_block("cuda", "// add_one.cu")
    blob = builtins.compile_cuda(source, arch="sm_90a", name="add_one")
    assert blob[:4] == b"\x7fELF"
    path = tmp_path / "libadd_one.so"
    path.write_bytes(blob)
    lib = cabi.load_library(str(path))
    os.unlink(path)
    add_one = lib.get_function("add_one")
    lib.get_function("add_one_on_stream")
    # Host-side validation runs without a GPU: CPU tensors are refused with the library's text.
    with pytest.raises(ExecutionError) as info:
        add_one(torch.zeros(4), torch.zeros(4))
    assert info.value.kind == "runtime"
    assert info.value.message == "add_one: x must be a CUDA tensor (device_type 1)"
    with pytest.raises(ExecutionError) as info:
        add_one(None, torch.zeros(4))
    assert info.value.message == "add_one: x is NULL (pass a tensor)"


@needs_nvcc
def test_compile_contains_sm90a_code() -> None:
    blob = builtins.compile_cuda(doc_block("cuda", "// add_one.cu"), arch="sm_90a")
    cuobjdump = shutil.which("cuobjdump") or os.path.join(
        os.path.dirname(os.path.realpath(builtins.find_nvcc() or "")), "cuobjdump"
    )
    if os.path.exists(cuobjdump):
        import tempfile

        with tempfile.NamedTemporaryFile(suffix=".so") as f:
            f.write(blob)
            f.flush()
            listing = subprocess.run([cuobjdump, "--list-elf", f.name], capture_output=True, text=True)
        assert "sm_90a" in listing.stdout, listing.stdout + listing.stderr
    else:  # no cuobjdump in this toolkit: the arch name is still embedded in the fatbinary
        assert b"sm_90a" in blob


@needs_nvcc
def test_compile_with_arch_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(builtins.ARCH_ENV, "sm_80")
    blob = builtins.compile_cuda('extern "C" int zero(void) { return 0; }\n')
    assert blob[:4] == b"\x7fELF" and b"sm_80" in blob


@needs_nvcc
def test_compile_multiple_files_with_header_and_flags(tmp_path: Path) -> None:
    blob = builtins.compile_cuda(
        {
            "include/scale.cuh": "#pragma once\n#define SCALE_FACTOR FACTOR_FROM_FLAGS\n",
            "a.cu": '#include "include/scale.cuh"\n'
            'extern "C" int factor(long long* out) { *out = SCALE_FACTOR; return 0; }\n',
            "b.cpp": 'extern "C" int twice(long long v, long long* out) { *out = 2 * v; return 0; }\n',
        },
        arch="sm_90a",
        flags=["-DFACTOR_FROM_FLAGS=7"],
    )
    path = tmp_path / "multi.so"
    path.write_bytes(blob)
    import ctypes

    handle = ctypes.CDLL(str(path))
    out = ctypes.c_longlong()
    assert handle.factor(ctypes.byref(out)) == 0 and out.value == 7
    assert handle.twice(ctypes.c_longlong(21), ctypes.byref(out)) == 0 and out.value == 42


@needs_nvcc
def test_compile_error_diagnostics_are_trimmed_to_the_first_error() -> None:
    source = "#warning this is only a warning\n" + ADD_ONE_BROKEN
    with pytest.raises(ExecutionError) as info:
        builtins.compile_cuda(source, arch="sm_90a", name="broken")
    assert info.value.kind == "compile"
    message = info.value.message
    first = message.splitlines()[0]
    assert "error" in first and "undefined_thing" in first, message
    assert first.startswith("broken.cu("), message
    assert "only a warning" not in message  # the warning came before the first error


@needs_nvcc
def test_compile_error_for_unknown_arch_flag() -> None:
    with pytest.raises(ExecutionError) as info:
        builtins.compile_cuda("int x;\n", arch="sm_90a", flags=["--definitely-not-an-nvcc-flag"])
    assert info.value.kind == "compile"
    assert "definitely-not-an-nvcc-flag" in info.value.message


@needs_nvcc
def test_compile_cleans_up_its_directory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    builtins.compile_cuda('extern "C" int zero(void) { return 0; }\n', arch="sm_90a")
    with pytest.raises(ExecutionError):
        builtins.compile_cuda(ADD_ONE_BROKEN, arch="sm_90a")
    assert list(tmp_path.iterdir()) == []


def fake_nvcc(root: Path, script: str) -> Path:
    """A stand-in nvcc under ``root/bin`` (a shell script), for the search and output handling."""
    bin_dir = root / "bin"
    bin_dir.mkdir(parents=True)
    path = bin_dir / "nvcc"
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_nvcc_search_order(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(builtins, "DEFAULT_CUDA_ROOTS", (str(tmp_path / "default"),))
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    assert builtins.find_nvcc() is None
    default = fake_nvcc(tmp_path / "default", "exit 0\n")
    assert builtins.find_nvcc() == str(default)
    cuda_path = fake_nvcc(tmp_path / "cuda_path", "exit 0\n")
    monkeypatch.setenv("CUDA_PATH", str(tmp_path / "cuda_path"))
    assert builtins.find_nvcc() == str(cuda_path)
    cuda_home = fake_nvcc(tmp_path / "cuda_home", "exit 0\n")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda_home"))
    assert builtins.find_nvcc() == str(cuda_home)
    on_path = fake_nvcc(tmp_path / "on_path", "exit 0\n")
    monkeypatch.setenv("PATH", str(on_path.parent))
    assert builtins.find_nvcc() == str(on_path)


def test_missing_nvcc_is_unavailable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setattr(builtins, "DEFAULT_CUDA_ROOTS", (str(tmp_path / "nowhere"),))
    with pytest.raises(ExecutionError) as info:
        builtins.compile_cuda("int x;", arch="sm_90a")
    assert info.value.kind == "unavailable" and "nvcc not found" in info.value.message


def test_command_line_and_verbatim_long_diagnostics(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    args_file = tmp_path / "args.txt"
    long_line = "x" * 9000
    fake_nvcc(
        tmp_path / "cuda",
        f'printf "%s\\n" "$@" > "{args_file}"\n'
        'echo "kernel.cu(1): warning #177-D: variable \\"error\\" was declared but never referenced"\n'
        'echo "kernel.cu(2): error: first problem"\n'
        f'echo "{long_line}"\n'
        'echo "kernel.cu(9): error: last problem"\n'
        "exit 2\n",
    )
    monkeypatch.setenv("PATH", str(tmp_path / "cuda" / "bin"))
    with pytest.raises(ExecutionError) as info:
        builtins.compile_cuda("src", arch="sm_90a", flags=("-lineinfo", "-std=c++17"))
    message = info.value.message
    assert info.value.kind == "compile"
    assert message.startswith("kernel.cu(2): error: first problem\nxxx")
    assert message.endswith("xxx\nkernel.cu(9): error: last problem")
    assert "characters elided" in message and len(message) <= builtins.DIAGNOSTICS_LIMIT
    assert args_file.read_text().splitlines() == [
        "-shared", "-Xcompiler", "-fPIC", "-O3", "-arch=sm_90a", "-lineinfo", "-std=c++17",
        "kernel.cu", "-o", "lib.so",
    ]


def test_nvcc_failure_without_output(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake_nvcc(tmp_path / "cuda", "exit 3\n")
    monkeypatch.setenv("PATH", str(tmp_path / "cuda" / "bin"))
    with pytest.raises(ExecutionError) as info:
        builtins.compile_cuda("src", arch="sm_90a")
    assert info.value.kind == "compile" and info.value.message == "nvcc exited with status 3"
    shutil.rmtree(tmp_path / "cuda")
    fake_nvcc(tmp_path / "cuda", "kill -9 $$\n")
    with pytest.raises(ExecutionError) as info:
        builtins.compile_cuda("src", arch="sm_90a")
    assert info.value.message == "nvcc was killed by signal 9"


def test_success_warnings_go_to_stderr(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    fake_nvcc(tmp_path / "cuda", 'echo "a.cu(1): warning: be careful"\nprintf "ELF" > lib.so\n')
    monkeypatch.setenv("PATH", str(tmp_path / "cuda" / "bin"))
    assert builtins.compile_cuda("src", arch="sm_90a") == b"ELF"
    assert "be careful" in capsys.readouterr().err


def test_trim_diagnostics() -> None:
    text = "note: something\nf.cpp:3:5: error: bad\n  more\n"
    assert builtins.trim_diagnostics(text) == "f.cpp:3:5: error: bad\n  more"
    assert builtins.trim_diagnostics("nvcc warning : x\nnvcc fatal   : Unsupported gpu architecture 'compute_1'\n") == (
        "nvcc fatal   : Unsupported gpu architecture 'compute_1'"
    )
    assert builtins.trim_diagnostics("ptxas error   : Entry function uses too much\n") == (
        "ptxas error   : Entry function uses too much"
    )
    assert builtins.trim_diagnostics("k.cu(4): error #20: identifier\n") == "k.cu(4): error #20: identifier"
    no_error = "something odd happened\nsecond line\n"
    assert builtins.trim_diagnostics(no_error) == no_error.rstrip("\n")
    long = "e.cu(1): error: " + "y" * 10000
    trimmed = builtins.trim_diagnostics(long, limit=1000)
    assert len(trimmed) <= 1000 and trimmed.startswith("e.cu(1): error: yyy") and trimmed.endswith("yyy")


@pytest.mark.parametrize(
    "kwargs,fragment",
    [
        ({"sources": 5}, "sources must be"),
        ({"sources": {"a.cu": 5}}, "sources must map"),
        ({"sources": {"../a.cu": "x"}}, "invalid source filename"),
        ({"sources": {"/abs.cu": "x"}}, "invalid source filename"),
        ({"sources": {"a.h": "x"}}, "no file to compile"),
        ({"sources": "x", "arch": "sm90"}, "invalid arch"),
        ({"sources": "x", "arch": "sm_90a; rm -rf /"}, "invalid arch"),
        ({"sources": "x", "flags": "-O2"}, "flags must be"),
        ({"sources": "x", "flags": [1]}, "flags must be"),
        ({"sources": "x", "name": "../evil"}, "invalid name"),
    ],
)
def test_compile_argument_validation(kwargs, fragment: str) -> None:
    kwargs.setdefault("arch", "sm_90a")
    with pytest.raises(ExecutionError) as info:
        builtins.compile_cuda(**kwargs)
    assert info.value.kind == "runtime" and fragment in info.value.message


def test_compile_without_arch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(builtins.ARCH_ENV, raising=False)
    with pytest.raises(ExecutionError) as info:
        builtins.compile_cuda("x")
    assert info.value.kind == "runtime" and builtins.ARCH_ENV in info.value.message


def test_documented_host_example_builds_and_runs(tmp_path: Path) -> None:
    import numpy as np

    (tmp_path / "scale.c").write_text(doc_block("c", "/* scale.c"))
    cc = next((c for c in (os.environ.get("CC"), "cc", "gcc") if c and shutil.which(c)), None)
    assert cc is not None, "no C compiler"
    subprocess.run([cc, "-shared", "-fPIC", "-O2", "-Wall", "-Werror", "scale.c", "-o", "libscale.so"],
                   cwd=tmp_path, check=True)
    lib = cabi.load_library(str(tmp_path / "libscale.so"))
    scale = lib.get_function("scale")
    t = torch.ones(3, 4)
    scale(t[:, ::2], 3.0)
    assert t.tolist() == [[3.0, 1.0, 3.0, 1.0]] * 3
    a = np.ones(5, dtype=np.float32)
    scale(a, 0.5)
    assert a.tolist() == [0.5] * 5
    with pytest.raises(ExecutionError) as info:
        scale(torch.ones(2, dtype=torch.float64), 2.0)
    assert info.value.message == "scale: x must be a float32 CPU tensor"


# --------------------------------------------------------------------------- benchmark


@pytest.mark.parametrize(
    "args,kwargs,fragment",
    [
        ((5,), {}, "fn must be callable"),
        ((print,), {"warmup": -1}, "warmup must be"),
        ((print,), {"warmup": True}, "warmup must be"),
        ((print,), {"warmup": 1.5}, "warmup must be"),
        ((print,), {"repeat": 0}, "repeat must be"),
        ((print,), {"repeat": "10"}, "repeat must be"),
        ((print,), {"flush_l2": 1}, "flush_l2 must be"),
    ],
)
@pytest.mark.parametrize("name", ["benchmark", "launch_times"])
def test_benchmark_argument_validation(name: str, args, kwargs, fragment: str) -> None:
    with pytest.raises(ExecutionError) as info:
        getattr(builtins, name)(*args, **kwargs)
    assert info.value.kind == "runtime"
    assert info.value.message.startswith(f"{name}: ") and fragment in info.value.message


def test_benchmark_without_cuda() -> None:
    calls = []
    if torch.cuda.is_available():  # on a GPU machine: a real, tiny measurement instead
        x = torch.zeros(1 << 20, device="cuda")
        result = builtins.benchmark(lambda: x.add_(1), warmup=2, repeat=5)
        assert result["repeat"] == 5 and result["latency_ms_min"] > 0
        times = builtins.launch_times(lambda: x.add_(1), warmup=2, repeat=7)
        assert len(times) == 7 and all(t > 0 for t in times)
        assert x[0].item() == 2 + 5 + 2 + 7  # every warmup and timed call ran once
        return
    for name in ("benchmark", "launch_times"):
        with pytest.raises(ExecutionError) as info:
            getattr(builtins, name)(lambda: calls.append(1), warmup=1, repeat=1)
        assert info.value.kind == "unavailable"
        assert info.value.message == f"{name} requires a CUDA device"
    assert calls == []  # fn never ran


def test_flush_buffer_size() -> None:
    assert builtins.flush_buffer_bytes(60 * 2**20) == 120 * 2**20  # H200: 60 MiB L2
    assert builtins.flush_buffer_bytes(4 * 2**20) == 64 * 2**20  # never below 64 MiB
