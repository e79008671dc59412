"""Upstream's worker-side ``kcoral`` and ``kcoral_runtime`` in the processes a request starts.

A program's subprocess and its grandchild, run by real CPU-mode zygote children (fresh and
reused), import the very files the program imports in process: the runtime's ``kcoral_runtime``
and its compat ``kcoral`` — or, where a real ``kcoral`` is installed in the worker's
``site-packages``, that one, in process and in every subprocess alike.
"""

from __future__ import annotations

import json
import os
import sys
import sysconfig
from pathlib import Path

import pytest

RUNTIME_DIR = Path(__file__).resolve().parents[1]
COMPAT_KCORAL = RUNTIME_DIR / "kcoral_runtime" / "compat" / "kcoral" / "__init__.py"
RUNTIME_INIT = RUNTIME_DIR / "kcoral_runtime" / "__init__.py"

# What a process imports: the files of kcoral (and, with ours, kcoral.errors/builtins) and
# kcoral_runtime, as JSON on one line.
_IMPORTS = (
    "import json, kcoral, kcoral_runtime\\n"
    "seen = {'kcoral': kcoral.__file__, 'kcoral_runtime': kcoral_runtime.__file__}\\n"
    "if not getattr(kcoral, 'REAL', False):\\n"
    "    import kcoral.builtins, kcoral.errors\\n"
    "    seen['builtins'] = kcoral.builtins.__file__\\n"
    "    seen['errors'] = kcoral.errors.__file__\\n"
    "print(json.dumps(seen))\\n"
)

# main() returns what it imports in process, what ``python -c`` imports, and what a grandchild
# (``python -c`` started by that ``python -c``) imports; a failed import's stderr travels too.
PROGRAM = f"""
import json, subprocess, sys

IMPORTS = "{_IMPORTS}"

def _run(argv):
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        return {{'failed': done.stderr}}
    return json.loads(done.stdout)

def main():
    here = {{}}
    exec(IMPORTS.replace('print(json.dumps(seen))', 'out.update(seen)'), {{'out': here}})
    grandchild = ("import subprocess, sys; "
                  "sys.exit(subprocess.run([sys.executable, '-c', " + repr(IMPORTS) + "]).returncode)")
    return json.dumps({{'here': here, 'child': _run([sys.executable, '-c', IMPORTS]),
                       'grandchild': _run([sys.executable, '-c', grandchild])}})
"""


def _imports(child, make_request, kc):
    r = child.run(make_request(kc.call(PROGRAM)))
    assert r.outcome["status"] == "COMPLETED", r.outcome["error"]
    return json.loads(r.results["r"]["value"])


def _ours() -> dict:
    compat = COMPAT_KCORAL.parent
    return {
        "kcoral": str(COMPAT_KCORAL),
        "kcoral_runtime": str(RUNTIME_INIT),
        "builtins": str(compat / "builtins.py"),
        "errors": str(compat / "errors.py"),
    }


@pytest.mark.parametrize("max_requests", [1, 0], ids=["fresh", "reused"])
def test_subprocesses_import_the_runtime_s_kcoral(cpu_zygote, make_request, kc, max_requests):
    child = cpu_zygote.child(max_requests=max_requests)
    try:
        seen = _imports(child, make_request, kc)
        assert seen == {"here": _ours(), "child": _ours(), "grandchild": _ours()}
        if max_requests == 0:
            # A program that empties PYTHONPATH: reuse hygiene gives the next request it back.
            clear = "import os\ndef main():\n    os.environ['PYTHONPATH'] = ''\n"
            r = child.run(make_request(kc.call(clear)))
            assert r.outcome["status"] == "COMPLETED" and r.retire is None
            assert _imports(child, make_request, kc) == seen
    finally:
        if max_requests == 0:
            child.kill()


def test_a_kcoral_installed_in_site_packages_wins_in_subprocesses_too(
    zygote_factory, make_request, kc, tmp_path, monkeypatch
):
    # The user site: like site-packages, after every PYTHONPATH entry on a new interpreter's path.
    base = tmp_path / "userbase"
    site = Path(sysconfig.get_path("purelib", f"{os.name}_user", vars={"userbase": str(base)}))
    (site / "kcoral").mkdir(parents=True)
    (site / "kcoral" / "__init__.py").write_text("REAL = True\n")
    monkeypatch.setenv("PYTHONUSERBASE", str(base))
    monkeypatch.delenv("PYTHONNOUSERSITE", raising=False)
    if sys.flags.no_user_site or os.getuid() != os.geteuid():
        pytest.skip("this interpreter has no user site")
    zygote = zygote_factory("cpu")
    assert zygote.hello["t"] == "hello", zygote.stderr_text()
    child = zygote.child(max_requests=1)
    real = {"kcoral": str(site / "kcoral" / "__init__.py"), "kcoral_runtime": str(RUNTIME_INIT)}
    assert _imports(child, make_request, kc) == {"here": real, "child": real, "grandchild": real}
