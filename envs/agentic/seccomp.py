"""A seccomp filter for a sandbox that has no other (classic BPF, built here: no libseccomp needed).

`deny_list_filter()` is the bytes of a `struct sock_filter` program that bwrap loads with `--seccomp FD`: the
system calls in DENIED fail with EPERM; every other call is allowed. They are the calls a process that only
renders pages never needs, and that an escape would: tracing other processes, new namespaces, mounts, kernel
modules, BPF, keyrings, perf events. On a machine whose architecture is not x86-64 there is no filter (None):
the numbers below are x86-64's.
"""
from __future__ import annotations

import platform
import struct
from typing import Optional

# x86-64 system call numbers (linux/arch/x86/entry/syscalls/syscall_64.tbl)
DENIED = {
    "ptrace": 101, "syslog": 103, "acct": 163, "mount": 165, "umount2": 166, "swapon": 167, "swapoff": 168,
    "reboot": 169, "iopl": 172, "ioperm": 173, "init_module": 175, "delete_module": 176, "quotactl": 179,
    "lookup_dcookie": 212, "kexec_load": 246, "add_key": 248, "request_key": 249, "keyctl": 250, "unshare": 272,
    "perf_event_open": 298, "name_to_handle_at": 303, "open_by_handle_at": 304, "setns": 308,
    "process_vm_readv": 310, "process_vm_writev": 311, "finit_module": 313, "kexec_file_load": 320, "bpf": 321,
    "userfaultfd": 323, "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432,
    "fspick": 433, "pivot_root": 155,
}
AUDIT_ARCH_X86_64 = 0xC000003E
X32_SYSCALL_BIT = 0x40000000
EPERM = 1

# classic BPF opcodes (linux/filter.h, linux/seccomp.h)
_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE_K = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_RET_K = 0x06  # BPF_RET | BPF_K
_RET_KILL_PROCESS = 0x80000000
_RET_ERRNO = 0x00050000
_RET_ALLOW = 0x7FFF0000
_ARCH_OFFSET, _NR_OFFSET = 4, 0  # in struct seccomp_data


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def deny_list_filter() -> Optional[bytes]:
    """The filter program, or None where the machine is not x86-64."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return None
    numbers = sorted(DENIED.values())
    program = [
        _op(_LD_W_ABS, _ARCH_OFFSET),
        _op(_JEQ_K, AUDIT_ARCH_X86_64, jt=1),  # another ABI (i386 via int 0x80): killed
        _op(_RET_K, _RET_KILL_PROCESS),
        _op(_LD_W_ABS, _NR_OFFSET),
        _op(_JGE_K, X32_SYSCALL_BIT, jf=1),  # the x32 ABI: killed
        _op(_RET_K, _RET_KILL_PROCESS),
    ]
    for i, nr in enumerate(numbers):  # each: equal -> jump to the EPERM return past the remaining checks
        program.append(_op(_JEQ_K, nr, jt=len(numbers) - i))
    program += [_op(_RET_K, _RET_ALLOW), _op(_RET_K, _RET_ERRNO | EPERM)]
    return b"".join(program)
