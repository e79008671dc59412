"""A seccomp filter that keeps every process a program starts inside its child's tree.

``clone(CLONE_PARENT)`` makes the new process a sibling of its caller: a child of the zygote,
out of reach of the child's leftover check (``leak_checks.kill_leftover_processes``), so a reused
worker would carry it into later requests. The filter fails such a clone with ``EPERM``, and
``clone3`` (whose flags live in memory seccomp cannot read) with ``ENOSYS``, which glibc (2.34+)
answers by falling back to ``clone``. It also fails x32 system calls and checks the 32-bit
entry (``int 0x80`` on x86-64, AArch32 on arm64), which would otherwise pass under another
architecture's numbers. Everything else is allowed.

The zygote installs it once, before anything starts a thread; every child and every process a
program starts inherits it (a filter cannot be removed). Installing sets ``no_new_privs``
(set-user-ID programs run without their privileges), as bubblewrap does anyway. It is installed
with ``SECCOMP_FILTER_FLAG_SPEC_ALLOW``: by default Linux turns on its speculation mitigations
(store-bypass disable, indirect-branch barriers on every switch) for a process with a filter,
which slows all of a program's CPU code; this filter is about process trees, not secrecy, and
must not change what a benchmark measures.
"""

from __future__ import annotations

import ctypes
import errno
import platform
import struct
from typing import List, Optional, Tuple

from . import procs

CLONE_PARENT = 0x00008000

_SECCOMP_SET_MODE_FILTER = 1
_SECCOMP_FILTER_FLAG_SPEC_ALLOW = 1 << 2
_SECCOMP_NR = {"x86_64": 317, "aarch64": 277}  # the seccomp() system call

_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000

# classic BPF opcodes used here
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_JSET_K = 0x45
_RET_K = 0x06

# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6]
_NR = 0
_ARCH = 4
_ARG0_LOW = 16  # little-endian: the low 32 bits of args[0], where clone's flags are

_X32_BIT = 0x40000000

# (audit arch, clone's number, clone3's number) per ABI the kernel accepts on this machine
_ABIS = {
    "x86_64": [(0xC000003E, 56, 435), (0x40000003, 120, 435)],
    "aarch64": [(0xC00000B7, 220, 435), (0x40000028, 120, 435)],
}

Instruction = Tuple[int, int, int, int]  # code, jt, jf, k

# Jump targets of the assembler below: fall through, the next ABI's block, or one of the returns.
_ON, _NEXT_ABI, _ALLOW, _EPERM, _ENOSYS = "on", "next_abi", "allow", "eperm", "enosys"


def _abi_block(arch: int, clone_nr: int, clone3_nr: int, x32: bool) -> List[tuple]:
    block: List[tuple] = [
        (_LD_W_ABS, _ON, _ON, _ARCH),
        (_JEQ_K, _ON, _NEXT_ABI, arch),
        (_LD_W_ABS, _ON, _ON, _NR),
    ]
    if x32:
        block.append((_JGE_K, _ENOSYS, _ON, _X32_BIT))
    block += [
        (_JEQ_K, _ENOSYS, _ON, clone3_nr),
        (_JEQ_K, _ON, _ALLOW, clone_nr),
        (_LD_W_ABS, _ON, _ON, _ARG0_LOW),
        (_JSET_K, _EPERM, _ALLOW, CLONE_PARENT),
    ]
    return block


def filter_program(machine: Optional[str] = None) -> Optional[List[Instruction]]:
    """The filter for ``machine`` (``platform.machine()``), or None for an unknown one."""
    name = machine if machine is not None else platform.machine()
    abis = _ABIS.get(name)
    if abis is None:
        return None
    blocks = [
        _abi_block(arch, clone_nr, clone3_nr, x32=name == "x86_64" and index == 0)
        for index, (arch, clone_nr, clone3_nr) in enumerate(abis)
    ]
    starts = []
    at = 0
    for block in blocks:
        starts.append(at)
        at += len(block)
    returns = {_ALLOW: at, _EPERM: at + 1, _ENOSYS: at + 2}
    program: List[Instruction] = []
    for index, block in enumerate(blocks):
        next_abi = starts[index + 1] if index + 1 < len(blocks) else returns[_ALLOW]
        for code, jt, jf, k in block:
            here = len(program)
            where = dict(returns, **{_ON: here + 1, _NEXT_ABI: next_abi})
            program.append((code, where[jt] - here - 1, where[jf] - here - 1, k))
    return program + [
        (_RET_K, 0, 0, _RET_ALLOW),
        (_RET_K, 0, 0, _RET_ERRNO | errno.EPERM),
        (_RET_K, 0, 0, _RET_ERRNO | errno.ENOSYS),
    ]


def encode(program: List[Instruction]) -> bytes:
    """``struct sock_filter[]`` bytes for ``program``."""
    return b"".join(struct.pack("=HBBI", code, jt, jf, k) for code, jt, jf, k in program)


def install() -> Optional[str]:
    """Installs the filter on this thread (and what it starts). None, or why it could not."""
    program = filter_program()
    if program is None:
        return f"no seccomp filter for machine {platform.machine()!r}"
    raw = ctypes.create_string_buffer(encode(program))

    class _Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    prog = _Prog(len(program), ctypes.cast(raw, ctypes.c_void_p))
    try:
        procs.set_no_new_privs()
    except OSError as exc:
        return str(exc)
    if procs.libc().syscall(ctypes.c_long(_SECCOMP_NR[platform.machine()]),
                            ctypes.c_ulong(_SECCOMP_SET_MODE_FILTER),
                            ctypes.c_ulong(_SECCOMP_FILTER_FLAG_SPEC_ALLOW),
                            ctypes.byref(prog)) != 0:
        return f"seccomp(SECCOMP_SET_MODE_FILTER) failed: errno {ctypes.get_errno()}"
    return None
