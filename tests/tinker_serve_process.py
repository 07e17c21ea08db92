"""`clawr1 tinker-serve` on the tiny model, started and stopped by PID for a test (tests/tinker, tests/serving,
tests/e2e): the engine it starts must be gone after it, and the key must not be in its log."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import httpx

from tests.conftest import REPO, pid_alive


@contextlib.contextmanager
def tinker_serve(run_dir: Path, model: str, key: str, slots: int = 2, *overrides: str) -> Iterator[str]:
    """Yields the URL of a running `clawr1 tinker-serve recipes/tinker/serve_cpu.yaml` (TINKER_API_KEY=key)."""
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    log = run_dir.parent / f"{run_dir.name}-tinker-serve.log"
    env = {**os.environ, "TINKER_API_KEY": key, "PYTHONUNBUFFERED": "1"}
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "clawr1.cli", "tinker-serve", "recipes/tinker/serve_cpu.yaml",
                                 f"run.dir={run_dir}", f"model.path={model}", f"lora.slots={slots}", *overrides],
                                cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    children: list[int] = []
    try:
        url = _wait_ready(run_dir / "tinker_url", proc, log, key)
        children = _children(proc.pid)  # the engine
        yield url
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    assert children and not [pid for pid in children if pid_alive(pid)], "the engine outlived tinker-serve"
    assert key not in log.read_text()


def _wait_ready(url_file: Path, proc: subprocess.Popen, log: Path, key: str) -> str:
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"tinker-serve exited {proc.returncode}:\n{log.read_text()[-3000:]}"
        if url_file.exists():
            url = url_file.read_text().strip()
            try:
                if httpx.get(f"{url}/api/v1/healthz", headers={"X-API-Key": key}, timeout=2).status_code == 200:
                    return url
            except httpx.HTTPError:
                pass
        time.sleep(0.5)
    raise AssertionError(f"tinker-serve was not ready in 600 s:\n{log.read_text()[-3000:]}")


def _children(pid: int) -> list[int]:
    """The processes `pid` started (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
        except (OSError, ValueError, IndexError):
            continue
    return found
