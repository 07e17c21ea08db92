"""The fork server (clawr1/fork_server.py): its preload keeps the fork-safety rule, and a loop it forks is a
process of its own, as `python -m clawr1.cli <loop>` would be."""
from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from clawr1.config import save_config
from clawr1.devtools import local_config
from clawr1.fork_client import ForkServer, ForkServerGone
from clawr1.fork_server import PRELOAD
from clawr1.runtime import ready_file
from tests.conftest import pid_alive

LIGHT = ("clawr1.cli", "clawr1.pool.main")  # enough for a pool loop, and quick to import


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1", **extra}


def _cmdline(pid: int) -> list[str]:
    return [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]


def _pool_config(run_dir: Path) -> Path:
    cfg = local_config(run_dir)
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    save_config(cfg, run_dir / "config.yaml")
    return run_dir / "config.yaml"


def _wait(predicate, what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"no {what} within {timeout_s:.0f}s"
        time.sleep(0.1)


def test_the_preload_leaves_no_thread_that_outlives_a_fork_and_no_cuda(tmp_path):
    server = ForkServer(tmp_path / "fork_server.log", _env())
    try:
        assert server.wait_ready(600)["ready"] == len(PRELOAD)  # preload() refuses otherwise, naming the module
    finally:
        server.stop(10)
    assert server.proc.returncode == 0


def test_a_module_that_starts_a_thread_is_refused_by_name(tmp_path):
    (tmp_path / "starts_a_thread.py").write_text(
        "import threading, time\nthreading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n")
    path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH", "")) if p)
    server = ForkServer(tmp_path / "fork_server.log", _env(PYTHONPATH=path), ("numpy", "starts_a_thread"))
    with pytest.raises(ForkServerGone, match="importing starts_a_thread started a thread that outlives fork"):
        server.wait_ready(120)
    assert server.proc.wait(timeout=30) == 1


def test_a_forked_loop_has_its_own_pid_group_command_line_log_and_exit_code(tmp_path):
    config = _pool_config(tmp_path / "run")
    server = ForkServer(tmp_path / "fork_server.log", _env(), LIGHT)
    try:
        server.wait_ready(120)
        pool = server.spawn(["pool", "--config", str(config)], _env(CLAWR1_LOOP_NAME="pool"), tmp_path / "pool.log")
        _wait(lambda: ready_file(local_config(tmp_path / "run"), "pool").exists() or pool.poll() is not None,
              "ready pool")
        assert pool.poll() is None, (tmp_path / "pool.log").read_text()
        assert pool.pid != server.proc.pid and os.getpgid(pool.pid) == os.getsid(pool.pid) == pool.pid
        assert _cmdline(pool.pid) == [sys.executable, "-m", "clawr1.cli", "pool", "--config", str(config)]
        assert "pool" in (tmp_path / "pool.log").read_text()
        os.kill(pool.pid, signal.SIGKILL)
        assert pool.wait(timeout=30) == -signal.SIGKILL

        broken = server.spawn(["pool", "--config", str(tmp_path / "missing.yaml")], _env(), tmp_path / "broken.log")
        assert broken.wait(timeout=60) == 2
        assert "config file not found" in (tmp_path / "broken.log").read_text()
    finally:
        server.stop(10)
    assert server.proc.returncode == 0


def test_a_forked_loop_dies_with_the_fork_server(tmp_path):
    config = _pool_config(tmp_path / "run")
    server = ForkServer(tmp_path / "fork_server.log", _env(), LIGHT)
    try:
        server.wait_ready(120)
        pool = server.spawn(["pool", "--config", str(config)], _env(), tmp_path / "pool.log")
        _wait(lambda: _cmdline(pool.pid)[2:4] == ["clawr1.cli", "pool"], "forked pool")
        os.kill(server.proc.pid, signal.SIGKILL)
        _wait(lambda: not pid_alive(pool.pid), "exit of the orphaned loop", 30)
        assert pool.wait(timeout=30) == -signal.SIGKILL
        with pytest.raises(ForkServerGone, match="fork server exited with code -9"):
            server.spawn(["pool", "--config", str(config)], _env(), tmp_path / "again.log")
    finally:
        server.stop(10)
