"""SWE episodes of the tiny model end to end on CPU: through the gateway, graded in the sandbox, rewarded in the pool.

The tiny model cannot fix code, and it never writes a tool call for a SWE prompt (its ~560+ tokens are past
anything it was trained on: 0 of 16 samples did). So the recipe's run shows the tools offered, grading and the
reward reaching the pool and the trainer; the second test gives the episode its first tool call (scripted, as a
client's history may hold one) and checks that the real tool result goes through the gateway in the model's own
template, with the tiny model answering it, to the judge and the pool.
"""
from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from clawr1.chat_client import GatewayChat
from clawr1.environment import AssistantTurn
from clawr1.protocol import Sample
from clawr1.pool.store import read_samples
from envs.agentic.agent import ToolOutcome, call_turn
from envs.agentic.sandbox import available_backends
from envs.swe.env import SweEnv
from tests.conftest import REPO, make_config
from tests.e2e.grpo_groups import assert_grpo_groups
from tests.e2e.test_run import trainer_records

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not available_backends(), reason="no isolating sandbox backend")]


def samples(run_dir: Path) -> list[Sample]:
    return read_samples(run_dir / "pool")


def test_the_swe_recipe_runs_graded_grpo_groups_into_training(tiny_model, tmp_path):
    run_dir = tmp_path / "swe"
    done = subprocess.run([sys.executable, "-m", "clawr1.cli", "run", "recipes/swe/cpu.yaml", f"run.dir={run_dir}",
                           "run.max_steps=2"], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert [r["step"] for r in trainer_records(run_dir)] == [1, 2]
    pool = samples(run_dir)
    assert len(pool) >= 4  # two batches of 4
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    tasks = {t.id: t for t in SweEnv({}).tasks()}
    for s in pool:
        assert s.reward in (1.0, -1.0)  # the grading outcome, on every turn (env_reward: all_turns)
        prompt = tokenizer.decode(s.tokens[:s.prompt_len])
        tools = prompt[prompt.index("<tools>"):prompt.index("</tools>")]  # the offered tools, in the template
        assert all(f'"{tool}"' in tools for tool in ("bash", "read_file", "str_replace", "write_file", "submit"))
        assert tasks[s.task_id].problem_statement.split()[0] in prompt
    assert_grpo_groups(run_dir, pool, attempts=2, steps=2)  # GRPO: 2 attempts at each task


class FirstCallScripted:
    """The policy through the gateway, except that each episode's first turn is a fixed tool call."""

    def __init__(self, policy: GatewayChat, first: AssistantTurn):
        self.policy, self.first, self.started = policy, first, set()

    async def chat(self, session_id: str, messages: list[dict], **kwargs) -> AssistantTurn:
        if session_id not in self.started:
            self.started.add(session_id)
            return self.first
        return await self.policy.chat(session_id, messages, **kwargs)

    async def complete(self, session_id: str, reward: float, text: str = "") -> None:
        await self.policy.complete(session_id, reward, text)


def test_a_tool_result_goes_through_the_gateway_to_the_judge_and_the_pool(tiny_model, tmp_path, loops):
    cfg = make_config(tmp_path, "judge.teacher=none", recipe="recipes/swe/cpu.yaml")  # the env judge, all turns
    started = {name: loops(cfg, name) for name in ("pool", "serve", "judge", "gateway")}
    started["serve"].wait_http(f"{cfg.engine_url}/health")
    started["gateway"].wait_http(f"{cfg.gateway_url}/health")
    env = SweEnv({"max_turns": 3})
    task = next(t for t in env.tasks() if t.id == "slugkit-1")
    look = call_turn([("read_file", {"path": "slugkit/text.py", "start_line": 1, "end_line": 3})])

    async def episode():
        chat = GatewayChat(cfg.gateway_url, None, "m", max_tokens=24, temperature=1.0)
        try:
            return await env.run_task(FirstCallScripted(chat, look), task, "swe-e2e", side=False)
        finally:
            await chat.close()

    result = asyncio.run(episode())
    assert result.tool_calls >= 1 and (result.passed, result.reward) == (False, -1.0)
    assert result.details["reason"] == "empty diff"  # graded: the model changed nothing
    deadline = time.monotonic() + 60
    while len(samples(cfg.run_dir)) < result.turns - 1 and time.monotonic() < deadline:
        time.sleep(0.5)
    pool = sorted(samples(cfg.run_dir), key=lambda s: s.turn_index)
    assert len(pool) == result.turns - 1 >= 1  # every turn the model wrote (the scripted first one is not its own)
    assert {s.session_id for s in pool} == {"swe-e2e"} and {s.reward for s in pool} == {-1.0}
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    first = tokenizer.decode(pool[0].tokens[:pool[0].prompt_len])
    # the real file's first lines, as the sandboxed read_file numbered them, inside the template's tool response
    head = (REPO / "envs/swe/repos/slugkit/slugkit/text.py").read_text().splitlines()[:3]
    shown = ToolOutcome("".join(f"{n:6}\t{line}\n" for n, line in enumerate(head, 1))).message_content()
    assert f"<tool_response>\n{shown}\n</tool_response>" in first
    assert pool[0].tokens[pool[0].prompt_len:]  # and the tiny model answered it
