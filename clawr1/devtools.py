"""Helpers for tests and benchmarks: one loop process started from a config, stopped by PID; without a GPU,
forked from this process's own fork server (clawr1/fork_server.py), as `clawr1 run` forks its loops."""
from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

from clawr1.config import Config, load_config, save_config
from clawr1.fork_client import ForkServer, uses_fork_server
from clawr1.ports import assign_free_ports
from clawr1.runtime import wait_http

REPO = Path(__file__).resolve().parents[1]


def local_config(run_dir: Path, *overrides: str, recipe: str = "recipes/combined/cpu.yaml") -> Config:
    """A recipe's config with its run directory set and free ports assigned, for loops started by hand.

    Nothing started by hand runs a teacher engine, so the judge asks the serving policy (judge.teacher=policy)
    unless an override says otherwise; `clawr1 run` starts the recipe's own teacher."""
    return assign_free_ports(load_config(REPO / recipe, [f"run.dir={run_dir}", "judge.teacher=policy", *overrides]))


_fork_server: Optional[ForkServer] = None


def shared_fork_server() -> Optional[ForkServer]:
    """This process's fork server, started at first use and stopped at exit; None where loops start fresh
    (a machine with an NVIDIA GPU)."""
    global _fork_server
    if not uses_fork_server(True):
        return None
    if _fork_server is None or not _fork_server.alive():
        log = Path(tempfile.gettempdir()) / f"clawr1-fork-server-{os.getpid()}.log"
        _fork_server = ForkServer(log, {**os.environ, "PYTHONUNBUFFERED": "1"})
        _fork_server.wait_ready(600)
        atexit.register(_fork_server.stop, 10.0)
    return _fork_server


class LoopProcess:
    """One `clawr1 <loop>` process started from a config file; stopped (by PID) at teardown."""

    def __init__(self, cfg: Config, loop: str, env: dict | None = None, extra: tuple[str, ...] = (),
                 name: str | None = None):
        cfg.run_dir.mkdir(parents=True, exist_ok=True)
        name = name or loop
        self.config_path = cfg.run_dir / f"config-{name}.yaml"
        save_config(cfg, self.config_path)
        self.log_path = cfg.run_dir / f"{name}.log"
        self.log = open(self.log_path, "wb")
        args = [loop, "--config", str(self.config_path), *extra]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        server = shared_fork_server()
        if server is not None:
            self.proc = server.spawn(args, env, self.log_path, cwd=REPO)
        else:
            self.proc = subprocess.Popen([sys.executable, "-m", "clawr1.cli", *args], stdout=self.log,
                                         stderr=subprocess.STDOUT, cwd=REPO, env=env, start_new_session=True)

    def wait_http(self, url: str, timeout: float = 120) -> None:
        try:
            wait_http(url, self.proc, timeout)
        except RuntimeError as e:
            raise RuntimeError(f"{e}:\n{self.log_path.read_text()[-3000:]}") from None

    def wait_file(self, path: Path, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not path.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{path} never appeared:\n{self.log_path.read_text()[-3000:]}")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


def stop_all(processes: list[LoopProcess]) -> None:
    for p in reversed(processes):
        p.stop()
