"""The fork server: a local run's warm parent. It imports what the loops share once (torch, transformers,
megatron-core, the loops' modules), then forks each loop `clawr1 run` asks for, so no loop pays for those
imports again. A forked loop is what `python -m clawr1.cli <loop> --config ...` would be: its own process,
PID and process group (a new session), its output appended to its log, that command line in /proc and `ps`,
its own exit code, killed by the kernel when its parent dies (PR_SET_PDEATHSIG, as every loop is).

The rule that makes forking safe: before a fork, the server only imports. It creates no thread, no OpenMP
pool (no torch operation), no CUDA context, no socket but its channel to `clawr1 run`, no process group.
One thread is allowed while importing: OpenBLAS's pool (numpy starts it), which OpenBLAS stops itself
before every fork (pthread_atfork) and restarts on its next use. `preload` holds the rule: after each import
that leaves a second thread it forks once to see whether the thread outlives a fork, and refuses to serve,
naming the module, if it does. CUDA is the reason a run with an NVIDIA GPU starts its loops the plain way
(`clawr1/fork_client.py`): a process may not use CUDA once its parent touched the driver, and the libraries
probe it at import on such machines.

`clawr1/fork_client.py` starts it and asks it for loops. Channel: JSON lines over a socketpair. `clawr1 run`
sends {"args", "env", "log", "title", "cwd"}; the server answers {"pid"}, and later {"exit": pid,
"returncode": rc} for every loop that exits (rc < 0: the signal).
"""
from __future__ import annotations

import ctypes
import gc
import importlib
import json
import os
import select
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

from clawr1.fork_client import send_message
from clawr1.runtime import die_with_parent

PRELOAD = ("numpy", "torch", "transformers", "megatron.core", "clawr1.cli", "clawr1.pool.main",
           "clawr1.gateway.main", "clawr1.judge.main", "clawr1.rollout.main", "clawr1.serving.main",
           "clawr1.trainer.main",
           # what the engines' from_pretrained resolves lazily (2.8 CPU-s an engine otherwise)
           "transformers.models.auto.modeling_auto", "transformers.models.qwen2.modeling_qwen2",
           "transformers.models.qwen3.modeling_qwen3", "transformers.models.llama.modeling_llama")
REAP_INTERVAL_S = 0.05


class ForkUnsafe(RuntimeError):
    """A preloaded module left a thread that outlives a fork."""


def thread_count() -> int:
    """Threads of this process as the kernel counts them (Python's and native ones alike)."""
    return len(os.listdir("/proc/self/task"))


def _probe_fork() -> None:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)


def preload(modules: tuple[str, ...]) -> None:
    """Import `modules` in order; ForkUnsafe naming the first whose import leaves a thread that outlives a fork."""
    for name in modules:
        importlib.import_module(name)
        if thread_count() > 1:
            _probe_fork()  # atfork-aware pools (OpenBLAS) stop here
            if thread_count() > 1:
                raise ForkUnsafe(f"importing {name} started a thread that outlives fork(); a forked loop could "
                                 f"inherit a lock it holds. Leave {name} out of the preload (clawr1/fork_server.py)")
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        raise ForkUnsafe("CUDA was initialized while preloading; a forked loop could not use it")
    # out of the collector's sight: a loop's collections then skip (and so never copy) the shared pages
    gc.collect()
    gc.freeze()


def _reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        send_message(sock, {"exit": pid, "returncode": os.waitstatus_to_exitcode(status)})


def serve(sock: socket.socket) -> dict[str, Any]:
    """Fork a loop for every request until `clawr1 run` closes the channel. Returns only in a forked loop, with
    its request."""
    buffer = b""
    while True:
        readable, _, _ = select.select([sock], [], [], REAP_INTERVAL_S)
        _reap(sock)
        if not readable:
            continue
        chunk = sock.recv(65536)
        if not chunk:  # `clawr1 run` is done with us; nothing to tear down but the preloaded modules
            os._exit(0)
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            request = json.loads(line)
            pid = os.fork()
            if pid == 0:
                sock.close()
                return request
            send_message(sock, {"pid": pid})


def become_loop(request: dict[str, Any], server_pid: int) -> None:
    """In a forked child: turn into the loop the request describes (see the module's text)."""
    os.setsid()
    die_with_parent()
    if os.getppid() != server_pid:  # the server died before the line above took effect
        os._exit(1)
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.close(devnull)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if request.get("cwd"):
        os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    if "numpy" in sys.modules:  # its global generator was seeded once, in the server; a fresh process reseeds
        sys.modules["numpy"].random.seed()
    _set_title(request["title"])


def _set_title(argv: list[str]) -> None:
    """Write `argv` over this process's original argument area, so /proc/PID/cmdline and `ps` show it."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end (proc(5) fields 48, 49)
    except (OSError, IndexError, ValueError):
        return
    data = b"\0".join(a.encode() for a in argv)[:end - start - 1]
    ctypes.memmove(start, data.ljust(end - start, b"\0"), end - start)


def server_main() -> None:
    server_pid = os.getpid()
    sock = socket.socket(fileno=int(sys.argv[1]))
    modules = tuple(sys.argv[2].split(",")) if sys.argv[2] else PRELOAD  # argv[3]: room for a loop's command line
    started = time.process_time()
    try:
        preload(modules)
    except ForkUnsafe as e:
        send_message(sock, {"error": str(e)})
        sys.exit(1)
    send_message(sock, {"ready": len(modules), "cpu_s": round(time.process_time() - started, 2)})
    request = serve(sock)
    become_loop(request, server_pid)
    from clawr1 import cli

    sys.argv = [cli.__file__, *request["args"]]
    sys.exit(cli.main(request["args"]))




if __name__ == "__main__":
    server_main()
