"""Upstream's worker-side ``kcoral`` modules, foreign ``ExecutionError`` classes, what a request's
imports from an unsandboxed workspace leave behind, and dropping capabilities in a child."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

RUNTIME_DIR = Path(__file__).resolve().parents[1]
COMPAT_DIR = RUNTIME_DIR / "kcoral_runtime" / "compat"
if str(RUNTIME_DIR) not in sys.path:
    sys.path.insert(0, str(RUNTIME_DIR))

from kcoral_runtime import errors, leak_checks, workspace  # noqa: E402


def _compat(tmp_path: Path, code: str) -> subprocess.CompletedProcess:
    """Runs ``code`` in a fresh interpreter whose path ends with the compatibility package."""
    script = (
        "import sys\n"
        f"sys.path.insert(0, {str(RUNTIME_DIR)!r})\n"
        f"sys.path.append({str(COMPAT_DIR)!r})\n" + code
    )
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=tmp_path, timeout=60)


def test_kcoral_errors_is_the_runtime_class(tmp_path: Path) -> None:
    result = _compat(tmp_path, (
        "from kcoral.errors import ExecutionError, GPUAccessViolation\n"
        "import kcoral_runtime.errors as ours\n"
        "assert ExecutionError is ours.ExecutionError\n"
        "assert GPUAccessViolation is ours.GPUAccessViolation\n"
        "e = ExecutionError('correctness', 'outputs differ')\n"
        "print(e.kind, e.message)\n"
    ))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "correctness outputs differ"


def test_benchmark_split_and_errors(tmp_path: Path) -> None:
    result = _compat(tmp_path, (
        "from kcoral.builtins import _split_cfg, benchmark\n"
        "from kcoral.errors import ExecutionError\n"
        "assert _split_cfg((1, 2, {'warmup': 3})) == ((1, 2), {'warmup': 3})\n"
        "assert _split_cfg((1, 2)) == ((1, 2), {})\n"
        "try:\n"
        "    benchmark(3)\n"
        "except ExecutionError as e:\n"
        "    print(e.kind, e.message)\n"
    ))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "runtime benchmark expects a compiled module handle"


def test_a_real_kcoral_on_the_path_comes_first(tmp_path: Path) -> None:
    real = tmp_path / "site" / "kcoral"
    real.mkdir(parents=True)
    (real / "__init__.py").write_text("REAL = True\n")
    result = _compat(tmp_path, (
        f"sys.path.insert(1, {str(tmp_path / 'site')!r})\n"
        "import kcoral\n"
        "print(getattr(kcoral, 'REAL', False))\n"
    ))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "True"


def test_foreign_execution_error_kind() -> None:
    class ExecutionError(Exception):
        def __init__(self, kind: str, message: str) -> None:
            super().__init__(message)
            self.kind = kind
            self.message = message

    ExecutionError.__module__ = "kcoral.errors"

    class Subclass(ExecutionError):
        pass

    assert errors.foreign_execution_error_kind(ExecutionError("compile", "x")) == "compile"
    assert errors.foreign_execution_error_kind(Subclass("correctness", "x")) == "correctness"
    assert errors.foreign_execution_error_kind(ExecutionError("bogus", "x")) == "engine"
    assert errors.foreign_execution_error_kind(ValueError("x")) is None


def test_forget_workspace_imports(tmp_path: Path) -> None:
    ws = tmp_path / "w7"
    ws.mkdir()
    (ws / "kc_forget_probe.py").write_text("VALUE = 1\n")
    sys.path.insert(0, str(ws))
    try:
        import kc_forget_probe  # noqa: F401

        assert "kc_forget_probe" in sys.modules
        assert str(ws) in sys.path_importer_cache
    finally:
        leak_checks.forget_workspace_imports(str(ws))
    assert str(ws) not in sys.path
    assert str(ws) not in sys.path_importer_cache
    assert "kc_forget_probe" not in sys.modules
    assert "os" in sys.modules  # nothing else goes


def test_forget_workspace_imports_without_imports_leaves_modules(tmp_path: Path) -> None:
    ws = str(tmp_path / "w8")
    sys.path.insert(0, ws)
    before = set(sys.modules)
    leak_checks.forget_workspace_imports(ws)
    assert ws not in sys.path
    assert set(sys.modules) == before


@pytest.mark.skipif(workspace.effective_capabilities() == 0, reason="needs some capability")
def test_drop_capabilities_in_a_child() -> None:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read)
            workspace.drop_capabilities()
            os.write(write, str(workspace.effective_capabilities()).encode())
        finally:
            os._exit(0)
    os.close(write)
    data = os.read(read, 100)
    os.close(read)
    os.waitpid(pid, 0)
    assert data == b"0"
    assert workspace.effective_capabilities() != 0  # the parent keeps its own


def test_workspace_names_are_checked() -> None:
    mounts = workspace.WorkspaceMounts()
    with pytest.raises(ValueError, match="invalid workspace name"):
        mounts._bind("../etc")
    with pytest.raises(ValueError, match="invalid workspace name"):
        mounts._bind("w1/..")
