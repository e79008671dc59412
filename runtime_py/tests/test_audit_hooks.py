"""A program's audit hook outlives its request (it cannot be removed): a sandboxed child notices
one being added and its sandbox check retires the child."""

import subprocess
import sys
import textwrap
from pathlib import Path

RUNTIME = str(Path(__file__).resolve().parents[1])


def _run(body: str) -> str:
    code = textwrap.dedent(
        """
        import sys, tempfile
        sys.path.insert(0, %r)
        from kcoral_runtime import leak_checks
        """ % RUNTIME
    ) + textwrap.dedent(body)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_an_added_audit_hook_is_reported_by_the_sandbox_check() -> None:
    out = _run(
        """
        leak_checks.watch_audit_hooks()
        workspace = tempfile.mkdtemp()
        state = leak_checks.SandboxState()
        print(state.clean_and_check(workspace))
        sys.addaudithook(lambda event, args: None)
        print(leak_checks.audit_hook_added())
        print(leak_checks.SandboxState().clean_and_check(workspace))
        """
    )
    first, added, second = out.splitlines()
    assert first == "None"
    assert added == "True"
    assert "an audit hook was added" in second


def test_the_watch_is_installed_once_and_sees_nothing_by_itself() -> None:
    out = _run(
        """
        leak_checks.watch_audit_hooks()
        leak_checks.watch_audit_hooks()
        open(__import__("os").devnull).close()
        print(leak_checks.audit_hook_added())
        """
    )
    assert out == "False"


def test_a_fork_inherits_the_watch() -> None:
    out = _run(
        """
        import os
        leak_checks.watch_audit_hooks()
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            sys.addaudithook(lambda event, args: None)
            os.write(w, b"1" if leak_checks.audit_hook_added() else b"0")
            os._exit(0)
        os.waitpid(pid, 0)
        print(os.read(r, 1).decode(), leak_checks.audit_hook_added())
        """
    )
    assert out == "1 False"
