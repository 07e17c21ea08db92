"""Shared fixtures: the cached tiny model and real loop processes on loopback."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from clawr1.config import Config, ModelConfig, assign_free_ports, load_config, save_config

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    from clawr1.tinymodel.build import ensure_tiny_model

    return ensure_tiny_model(ModelConfig())


def make_config(run_dir: Path, *overrides: str) -> Config:
    cfg = load_config(REPO / "recipes" / "combined" / "cpu.yaml", [f"run.dir={run_dir}", *overrides])
    return assign_free_ports(cfg)


class LoopProcess:
    """One `clawr1 <loop>` process started from a config file; stopped (by PID) at teardown."""

    def __init__(self, cfg: Config, loop: str, env: dict | None = None):
        cfg.run_dir.mkdir(parents=True, exist_ok=True)
        self.config_path = cfg.run_dir / f"config-{loop}.yaml"
        save_config(cfg, self.config_path)
        self.log_path = cfg.run_dir / f"{loop}.log"
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "clawr1.cli", loop, "--config", str(self.config_path)],
                                     stdout=self.log, stderr=subprocess.STDOUT, cwd=REPO,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}, start_new_session=True)

    def wait_http(self, url: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"process exited early:\n{self.log_path.read_text()[-3000:]}")
            try:
                if httpx.get(url, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise TimeoutError(f"{url} not healthy:\n{self.log_path.read_text()[-3000:]}")

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


@pytest.fixture
def loops():
    """Start loop processes with `loops(cfg, name)`; all are stopped after the test."""
    started: list[LoopProcess] = []

    def start(cfg: Config, loop: str, env: dict | None = None) -> LoopProcess:
        p = LoopProcess(cfg, loop, env)
        started.append(p)
        return p

    yield start
    for p in reversed(started):
        p.stop()


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purposes
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
