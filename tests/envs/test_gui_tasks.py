"""The GUI task sets, calibrated from the command line: the oracle passes every own task and the MiniWoB++ set,
the null agent fails them all, and every own task's wrong solution fails."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

from clawr1.agent_bench import run_bench
from envs.gui.env import GuiEnv
from envs.gui.miniwob import MINIWOB_SET
from envs.gui.tasks import own_tasks
from tests.conftest import REPO
from tests.envs.test_gui_env import _browser_missing

pytestmark = pytest.mark.skipif(bool(_browser_missing()), reason=_browser_missing() or "-")
KINDS = {"form", "login", "settings", "search", "second-page", "table", "app", "dialog"}


def test_the_own_set_covers_its_kinds_and_the_miniwob_set_its_types():
    tasks = own_tasks()
    assert len(tasks) >= 12 and len({t.id for t in tasks}) == len(tasks)
    assert {t.category.removeprefix("own/") for t in tasks} == KINDS
    assert all(t.oracle and t.wrong for t in tasks)
    assert len(MINIWOB_SET) >= 20 and len(set(MINIWOB_SET)) == len(MINIWOB_SET)


def test_the_oracle_passes_every_task_and_writes_the_report(tmp_path):
    out = subprocess.run([sys.executable, "-m", "clawr1.cli", "bench", "envs/gui", "--agent", "oracle", "--out",
                          str(tmp_path / "report")], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["tasks"] == len(own_tasks()) + 3 * len(MINIWOB_SET)
    assert summary["pass@1"] == 1.0 and summary["failed"] == 0, summary["failed_tasks"]
    report = (tmp_path / "report.md").read_text()
    assert "| own/login | own/login | 1/1 |" in report and "| miniwob/click-button/s2 |" in report
    assert (tmp_path / "report.png").stat().st_size > 1000


@pytest.fixture(scope="module")
def env():
    gui = GuiEnv({"tasks": "all"})
    yield gui
    gui.close()


@pytest.mark.parametrize("agent, spec", [("null", "all"), ("wrong", "own")])
def test_the_null_agent_and_every_wrong_solution_fail(env, agent, spec):
    tasks = env.tasks(spec)
    scores = asyncio.run(run_bench(env, tasks, agent, None, 1, echo=lambda line: None))
    passed = [s.task_id for s in scores if s.successes]
    assert len(scores) == len(tasks) and not passed
    if agent == "wrong":  # each wrong solution plays to its submit without a tool error: it fails on its choice
        assert all(r.tool_errors == 0 and r.details["answer"] is not None for s in scores for r in s.results)
