"""Pages written to break the GUI environment (envs/gui/hostile_pages.py): each attempt ends as a result, passed or
failed with its reason, never as an exception that would stop `clawr1 rollout` or `clawr1 bench`; and the
environment serves its own tasks right after."""
from __future__ import annotations

import asyncio

import pytest

from envs.gui.env import GuiEnv
from tests.envs.test_gui_env import _browser_missing

pytestmark = [pytest.mark.skipif(bool(_browser_missing()), reason=_browser_missing() or "-"), pytest.mark.slow]
CALL_TIMEOUT_S = 8  # a hung page is given up on after this (the env's default is 60)


@pytest.fixture(scope="module")
def env():
    gui = GuiEnv({"tasks": "hostile", "eval_tasks": "hostile", "call_timeout_s": CALL_TIMEOUT_S})
    yield gui
    gui.close()


@pytest.fixture(scope="module")
def outcomes(env):
    """The oracle's attempt at every hostile task, by attack."""
    oracle = env.scripted_agent("oracle")
    results = {}
    for task in env.tasks("hostile"):
        results[task.category.split("/")[1]] = asyncio.run(env.run_task(oracle, task, f"hostile-{task.id}"))
    return results


def test_every_hostile_page_ends_as_a_result_with_a_reason(outcomes):
    assert set(outcomes) == {"form-elsewhere", "form-navigates", "reload-loop", "busy-after-click", "busy-on-load",
                             "deep-nesting"}
    for attack, result in outcomes.items():
        assert result.details.get("reason"), attack


def test_a_form_posted_to_another_origin_is_refused_and_the_read_after_it_does_not_race(outcomes):
    result = outcomes["form-elsewhere"]
    assert not result.details.get("broken") and result.tool_errors == 0, result.details
    assert result.details["refused_requests"] >= 1 and result.details["posts"] == []


def test_a_form_that_navigates_the_page_passes(outcomes):
    result = outcomes["form-navigates"]
    assert result.passed and result.tool_errors == 0, result.details


@pytest.mark.parametrize("attack, reason", [
    ("busy-after-click", f"the page did not answer within {CALL_TIMEOUT_S} s"),
    ("busy-on-load", "the page could not be opened"),
])
def test_a_page_that_hangs_ends_its_attempt_failed_with_reward_0(outcomes, attack, reason):
    result = outcomes[attack]
    assert (result.passed, result.reward, result.details["broken"]) == (False, 0.0, True)
    assert reason in result.details["reason"]


@pytest.mark.parametrize("attack", ["reload-loop", "deep-nesting"])
def test_a_page_that_cannot_be_read_still_gives_a_result(outcomes, attack):
    result = outcomes[attack]
    assert not result.passed and result.reward in (0.0, -1.0), result.details


def test_the_environment_counts_the_broken_attempts_and_serves_its_own_tasks_after(env, outcomes):
    assert env.counts["episodes_broken"] == sum(bool(r.details.get("broken")) for r in outcomes.values()) >= 2
    own = GuiEnv({"tasks": "own"})
    own._host = env.host()  # the same browser, after every hostile page
    try:
        task = own.tasks("own")[0]
        assert asyncio.run(own.run_task(own.scripted_agent("oracle"), task, "after-hostile")).passed
    finally:
        own._host = None
    assert env.host().context_count() == 0  # every hostile attempt's context was closed


def test_clawr1_bench_over_the_hostile_pages_exits_0_and_gives_each_failure_its_reason(tmp_path):
    import subprocess
    import sys

    from tests.conftest import REPO

    out = subprocess.run([sys.executable, "-m", "clawr1.cli", "bench", "envs/gui", "--tasks", "hostile", "--agent",
                          "oracle", "--env-arg", f"call_timeout_s={CALL_TIMEOUT_S}", "--out", str(tmp_path / "hostile")],
                         cwd=REPO, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    rows = [line for line in (tmp_path / "hostile.md").read_text().splitlines()
            if line.startswith("| hostile/") and line.count(" | ") == 6]  # the task table, not the categories
    assert len(rows) == 6
    for row in rows:
        passed, why = row.split(" | ")[2], row.split(" | ")[-1].rstrip(" |")
        assert passed == "1/1" or why, row  # a failure says why
