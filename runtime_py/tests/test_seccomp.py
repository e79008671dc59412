"""The seccomp filter that keeps a program's processes inside its child's tree."""

from __future__ import annotations

import errno
import json
import platform
import struct
import subprocess
import sys
from pathlib import Path
from typing import List, Tuple

import pytest

from kcoral_runtime import seccomp

RUNTIME = str(Path(__file__).resolve().parents[1])
ALLOW, EPERM, ENOSYS = 0x7FFF0000, 0x00050000 | errno.EPERM, 0x00050000 | errno.ENOSYS
X86_64, I386, AARCH64, ARM = 0xC000003E, 0x40000003, 0xC00000B7, 0x40000028


def _run_filter(program: List[Tuple[int, int, int, int]], nr: int, arch: int, arg0: int) -> int:
    """A classic-BPF interpreter for the opcodes the filter uses, over one seccomp_data."""
    data = struct.pack("<iIQ6Q", nr, arch, 0, arg0, 0, 0, 0, 0, 0)
    acc, pc = 0, 0
    while True:
        code, jt, jf, k = program[pc]
        if code == 0x20:
            acc = struct.unpack_from("<I", data, k)[0]
            pc += 1
        elif code in (0x15, 0x35, 0x45):
            hit = {0x15: acc == k, 0x35: acc >= k, 0x45: bool(acc & k)}[code]
            pc += 1 + (jt if hit else jf)
        elif code == 0x06:
            return k
        else:
            raise AssertionError(f"unexpected opcode {code:#x}")


@pytest.mark.parametrize(
    "machine, arch, clone_nr",
    [("x86_64", X86_64, 56), ("x86_64", I386, 120), ("aarch64", AARCH64, 220),
     ("aarch64", ARM, 120)],
)
def test_filter_refuses_clone_parent_and_clone3_and_allows_the_rest(machine, arch, clone_nr) -> None:
    program = seccomp.filter_program(machine)
    assert program is not None
    fork_flags = 0x01200011  # glibc fork(): CLONE_CHILD_SETTID | CLONE_CHILD_CLEARTID | SIGCHLD
    thread_flags = 0x003D0F00  # pthread_create's flags
    assert _run_filter(program, clone_nr, arch, fork_flags) == ALLOW
    assert _run_filter(program, clone_nr, arch, thread_flags) == ALLOW
    assert _run_filter(program, clone_nr, arch, seccomp.CLONE_PARENT | 17) == EPERM
    assert _run_filter(program, clone_nr, arch, (1 << 40) | seccomp.CLONE_PARENT) == EPERM
    assert _run_filter(program, 435, arch, 0) == ENOSYS  # clone3
    assert _run_filter(program, 0, arch, seccomp.CLONE_PARENT) == ALLOW  # another call, same bits
    assert _run_filter(program, 39, arch, 0) == ALLOW


def test_x32_calls_are_refused_and_unknown_abis_pass() -> None:
    program = seccomp.filter_program("x86_64")
    assert program is not None
    assert _run_filter(program, 0x40000000 | 56, X86_64, seccomp.CLONE_PARENT) == ENOSYS
    assert _run_filter(program, 0x40000000 | 39, X86_64, 0) == ENOSYS
    assert _run_filter(program, 56, 0x12345678, seccomp.CLONE_PARENT) == ALLOW
    assert seccomp.filter_program("riscv64") is None


_LIVE = r"""
import ctypes, json, os, subprocess, sys, threading
sys.path.insert(0, sys.argv[1])
from kcoral_runtime import seccomp
libc = ctypes.CDLL(None, use_errno=True)

def call(nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_ulong(a) for a in args])
    return r, ctypes.get_errno()

def speculation():
    lines = open("/proc/self/status").read().splitlines()
    return [line for line in lines if line.startswith("Speculation")]

before = speculation()
out = {"installed": seccomp.install()}
out["speculation"] = [before, speculation()]
r, err = call(56, seccomp.CLONE_PARENT | 17, 0, 0, 0, 0)
if r == 0:
    os._exit(0)  # the escaped sibling, should the filter fail
out["clone_parent"] = [r, err]
out["clone3"] = list(call(435, 0, 0))
box = []
t = threading.Thread(target=lambda: box.append(1)); t.start(); t.join()
out["thread"] = box == [1]
out["subprocess"] = subprocess.run(["sh", "-c", "echo ok; (echo nested &) ; wait"],
                                    capture_output=True, text=True).stdout.split()
pid = os.fork()
if pid == 0:
    os._exit(3)
out["fork"] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
print(json.dumps(out))
"""


@pytest.mark.skipif(platform.machine() not in ("x86_64", "aarch64"), reason="no filter here")
def test_installed_filter_refuses_clone_parent_and_keeps_threads_forks_and_subprocesses() -> None:
    done = subprocess.run([sys.executable, "-c", _LIVE, RUNTIME], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["installed"] is None
    # The kernel's mitigations stay as they were (without SPEC_ALLOW, a host mitigating "prctl and
    # seccomp" would force store-bypass disable on every worker: slower CPU code in benchmarks).
    assert out["speculation"][0] == out["speculation"][1]
    assert out["clone_parent"] == [-1, errno.EPERM]
    assert out["clone3"] == [-1, errno.ENOSYS]
    assert out["thread"] is True
    assert sorted(out["subprocess"]) == ["nested", "ok"]
    assert out["fork"] == 3
