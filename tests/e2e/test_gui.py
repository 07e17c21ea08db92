"""GUI episodes of the tiny model end to end on CPU: pages in the sandboxed browser, tool schemas and the
accessibility tree in the model's own template, the page's verdict in the pool, GRPO pairs, training steps.

The tiny model cannot operate a web page (its verdicts are all -1); the run shows the whole path.
"""
from __future__ import annotations

import re
import subprocess
import sys

import pytest
from transformers import AutoTokenizer

from clawr1.pool.store import read_samples
from clawr1.tracking import read_metrics
from envs.gui.actions import TOOL_NAMES
from envs.gui.env import GuiEnv
from tests.conftest import REPO
from tests.e2e.grpo_groups import assert_grpo_groups
from tests.e2e.test_run import trainer_records
from tests.envs.test_gui_env import _browser_missing

pytestmark = [pytest.mark.slow, pytest.mark.skipif(bool(_browser_missing()), reason=_browser_missing() or "-")]


def test_the_gui_recipe_runs_judged_grpo_groups_into_training(tiny_model, tmp_path):
    run_dir = tmp_path / "gui"
    done = subprocess.run([sys.executable, "-m", "clawr1.cli", "run", "recipes/gui/cpu.yaml", f"run.dir={run_dir}",
                           "run.max_steps=2"], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert [r["step"] for r in trainer_records(run_dir)] == [1, 2]
    pool = read_samples(run_dir / "pool")
    assert len(pool) >= 8  # two batches of 4
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    instructions = {t.id: t.instruction for t in GuiEnv({}).tasks()}  # own tasks say theirs; MiniWoB++'s pages do
    for s in pool:
        assert s.reward in (1.0, -1.0)  # the page's verdict, on every turn (env_reward: all_turns)
        prompt = tokenizer.decode(s.tokens[:s.prompt_len])
        tools = prompt[prompt.index("<tools>"):prompt.index("</tools>")]  # the offered tools, in the template
        assert all(f'"{tool}"' in tools for tool in TOOL_NAMES)
        assert "The page:\nPage: " in prompt and re.search(r"\[ref=e\d+\]", prompt)  # the tree, ids and all
        assert instructions[s.task_id] in prompt
    assert_grpo_groups(run_dir, pool, attempts=2, steps=2)  # GRPO: 2 attempts at each task
    log = (run_dir / "logs" / "rollout.log").read_text()
    assert "Traceback" not in log


# half of them break every attempt (they hang or never load), half give turns to train on
HOSTILE = "+".join(f"hostile/{kind}" for kind in ("busy-on-load", "busy-after-click", "reload-loop", "form-navigates",
                                                  "form-elsewhere", "blocked-links"))


def test_a_run_whose_tasks_include_hostile_pages_trains_and_exits_0(tiny_model, tmp_path):
    """Pages that hang, crash or race end their attempts failed (reward 0, counted as episodes_broken); the run
    trains on what the other attempts gave and stops as asked."""
    run_dir = tmp_path / "gui"
    done = subprocess.run([sys.executable, "-m", "clawr1.cli", "run", "recipes/gui/cpu.yaml", f"run.dir={run_dir}",
                           "run.max_steps=3", f"rollout.env_args.tasks={HOSTILE}", "rollout.env_args.call_timeout_s=8",
                           "rollout.env_args.heldout_every=100"], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert [r["step"] for r in trainer_records(run_dir)] == [1, 2, 3]
    rollout = [r for r in read_metrics(run_dir, "rollout") if "episodes_broken" in r]
    assert rollout and rollout[-1]["episodes_broken"] >= 1  # pages broke attempts, and the loop went on
