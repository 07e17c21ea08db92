"""`clawr1 run` end to end: a few steps of the combined recipe; a dead loop or Ctrl-C stops everything."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clawr1.fork_client import uses_fork_server
from clawr1.pool.store import read_samples
from tests.conftest import REPO, pid_alive

pytestmark = pytest.mark.slow


def descendants(pid: int) -> set[int]:
    """Every live process below `pid`, from /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = set(), [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.add(c)
            todo.append(c)
    return out


def start_run(run_dir: Path, *overrides: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "clawr1.cli", "run", "recipes/combined/cpu.yaml", f"run.dir={run_dir}", *overrides],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})


def wait_for(predicate, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc.poll() is not None:
            raise AssertionError(f"run exited early ({proc.returncode}):\n{proc.stdout.read()}")
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.2)


def trainer_records(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [r for r in map(json.loads, path.read_text().splitlines()) if r["loop"] == "trainer" and "pg_loss" in r]


def test_combined_recipe_end_to_end(tiny_model, tmp_path):
    run_dir = tmp_path / "run"
    proc = start_run(run_dir, "run.max_steps=3", "rollout.eval_size=16")
    seen: set[int] = set()
    while proc.poll() is None:  # remember every process the run starts, to check they are all gone later
        seen |= descendants(proc.pid)
        time.sleep(0.5)
    out = proc.stdout.read()
    assert proc.returncode == 0, out
    assert [line.split("|")[0].split()[-1] for line in out.splitlines() if line.startswith("[train] step")] == ["1", "2", "3"]
    assert json.loads((run_dir / "summary.json").read_text())["engine_weight_version"] == 3
    records = trainer_records(run_dir)
    assert [r["step"] for r in records] == [1, 2, 3]
    for r in records:  # tokens were sampled by weights the trainer had already published
        assert r["max_token_version"] <= r["trained_at_version"] == r["step"] - 1
        assert r["samples"] == 16 and r["tokens_per_s"] > 0
    # the recipe's frozen teacher runs in an engine of its own, and scores every hinted turn
    forked = ["fork_server.log"] if uses_fork_server(True) else []
    assert sorted(p.name for p in (run_dir / "logs").iterdir()) == \
        [*forked, "gateway.log", "judge.log", "pool.log", "rollout.log", "serve.log", "teacher.log", "trainer.log"]
    hinted = [s for s in read_samples(run_dir / "pool") if s.hint]
    assert hinted and all(len(s.teacher_logprobs) == s.response_len for s in hinted)
    evals = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if "personalization_score" in line]
    assert [r["eval_version"] for r in evals] == [0, 3]  # before training, then at the final version
    assert all(0.0 <= r["personalization_score"] <= r["pref_format"] <= 1.0 for r in evals)
    assert list((run_dir / "wandb").glob("offline-run-*"))
    assert sorted(p.name for p in (run_dir / "weights").iterdir()) == ["v000002", "v000003"]
    assert seen and not [p for p in seen if pid_alive(p)]


def test_a_killed_loop_stops_the_run_and_is_named(tiny_model, tmp_path):
    run_dir = tmp_path / "run"
    proc = start_run(run_dir, "run.max_steps=1000", "rollout.eval_every=0", "judge.teacher=policy")
    wait_for(lambda: len(trainer_records(run_dir)) >= 1, proc, timeout=240)
    children = descendants(proc.pid)
    judge_pid = int((run_dir / "state" / "judge.ready").read_text())
    os.kill(judge_pid, signal.SIGKILL)
    out, _ = proc.communicate(timeout=90)
    assert proc.returncode == 1
    assert "loop 'judge' exited with code -9" in out
    assert not [p for p in children if pid_alive(p)]


def test_ctrl_c_stops_every_loop(tiny_model, tmp_path):
    run_dir = tmp_path / "run"
    proc = start_run(run_dir, "run.max_steps=1000", "rollout.eval_every=0")
    wait_for(lambda: (run_dir / "state" / "rollout.ready").exists(), proc, timeout=240)
    children = descendants(proc.pid)
    assert len(children) >= 7  # six loops and the teacher engine
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=90)
    assert proc.returncode == 130, out
    assert not [p for p in children if pid_alive(p)]


def test_data_parallel_with_minibatches_and_epochs_end_to_end(tiny_model, tmp_path):
    """Issue 11: two trainer ranks, two minibatches, two PPO epochs (old log-probs per rank's shards)."""
    run_dir = tmp_path / "run"
    proc = start_run(run_dir, "run.max_steps=2", "trainer.data_parallel=2", "algo.minibatches=2", "algo.ppo_epochs=2",
                     "rollout.eval_every=0", "judge.teacher=policy")  # the subject is the trainer's ranks
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-3000:]
    assert [r["step"] for r in trainer_records(run_dir)] == [1, 2]
    assert json.loads((run_dir / "summary.json").read_text())["engine_weight_version"] == 2
    assert {"trainer-0.log", "trainer-1.log"} <= {p.name for p in (run_dir / "logs").iterdir()}
