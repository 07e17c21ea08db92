"""The shared agent loop through a real gateway and engine: tools offered, results sent back, token-exact turns."""
from __future__ import annotations

import asyncio
import json

import pytest
from transformers import AutoTokenizer

from clawr1 import bus, protocol
from clawr1.chat import ChatRenderer
from clawr1.chat_client import GatewayChat
from envs.agentic.agent import AgentTask, Grade, ScriptedAgent, ToolOutcome, call_turn, run_episode
from tests.conftest import LoopProcess, make_config

ECHO = {"type": "function", "function": {"name": "echo", "description": "Repeat the text.",
                                         "parameters": {"type": "object", "properties": {"text": {"type": "string"}},
                                                        "required": ["text"]}}}
SUBMIT = {"type": "function", "function": {"name": "submit", "description": "Finish.",
                                           "parameters": {"type": "object", "properties": {}}}}


class EchoWorld:
    def __init__(self):
        self.calls, self.closed = [], False

    def call(self, name: str, arguments: str) -> ToolOutcome:
        self.calls.append((name, arguments))
        if name == "submit":
            return ToolOutcome("submitted", submitted=True)
        try:
            return ToolOutcome(json.loads(arguments)["text"]) if name == "echo" else ToolOutcome("", ok=False, error=f"unknown tool {name!r}")
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            return ToolOutcome("", ok=False, error=f"bad arguments: {e}")

    def grade(self, messages: list[dict]) -> Grade:
        return Grade(passed=any(n == "submit" for n, _ in self.calls), reward=1.0, feedback="done")

    def close(self) -> None:
        self.closed = True


TASK = AgentTask("echo-1", "test", [{"role": "system", "content": "Use the tools."},
                                    {"role": "user", "content": "Say hello with the echo tool, then submit."}],
                 [ECHO, SUBMIT], max_turns=3, needs_submit=True)


def test_scripted_episode_sends_tool_results_with_their_ids_and_the_outcome():
    agent = ScriptedAgent(lambda task_id: [call_turn([("echo", {"text": "hi"}), ("nope", {})]), call_turn([("submit", {})])])
    world = EchoWorld()
    result = asyncio.run(run_episode(agent, TASK, world, "s1"))
    assert (result.passed, result.turns, result.tool_calls, result.tool_errors) == (True, 2, 3, 1)
    assert agent.outcomes == {"s1": 1.0} and world.calls[0] == ("echo", '{"text": "hi"}')


def test_a_model_that_stops_without_submitting_is_nudged_once():
    agent = ScriptedAgent(lambda task_id: [])  # never calls a tool
    result = asyncio.run(run_episode(agent, TASK, EchoWorld(), "s2"))
    assert result.turns == 2 and not result.passed  # the answer, the nudge's answer, then the end


@pytest.fixture(scope="module")
def stack(tiny_model, tmp_path_factory):
    cfg = make_config(tmp_path_factory.mktemp("agent"), "gateway.default_max_tokens=40")
    judge = bus.pull_socket(cfg.judge_turns_addr)
    engine, gateway = LoopProcess(cfg, "serve"), LoopProcess(cfg, "gateway")
    try:
        engine.wait_http(f"{cfg.engine_url}/health")
        gateway.wait_http(f"{cfg.gateway_url}/health")
        yield cfg, judge, ChatRenderer(AutoTokenizer.from_pretrained(tiny_model))
    finally:
        gateway.stop()
        engine.stop()
        judge.close(0)


def test_multi_turn_tool_episode_is_token_exact_through_the_gateway(stack):
    cfg, judge, renderer = stack

    async def episode():
        chat = GatewayChat(cfg.gateway_url, None, "m", max_tokens=40, temperature=1.0)
        try:
            return await run_episode(chat, TASK, EchoWorld(), "loop-1")
        finally:
            await chat.close()

    result = asyncio.run(episode())
    assert result.turns >= 2
    records = []
    while len(records) < result.turns and judge.poll(10_000):
        records.append(protocol.decode(judge.recv_multipart()))
    records.sort(key=lambda r: r.turn_index)
    assert [r.turn_index for r in records] == list(range(result.turns)) and records[0].tools
    first, second = records[0], records[1]
    # the second prompt is the first prompt, the exact sampled ids, and only the new messages (tool results or the nudge)
    sampled = first.prompt_ids + first.response_ids
    if first.response_ids[-1] not in renderer.end_ids:
        sampled += [renderer.turn_end_id]  # a reply cut at max_tokens is closed by the template
    assert second.prompt_ids[: len(sampled)] == sampled
    new = second.messages[len(first.messages) + 1:]
    reply = second.messages[len(first.messages)]
    assert new and second.prompt_ids[len(sampled):] == renderer.encode(renderer.continuation_text(reply, new, first.tools))
    assert records[-1].next_state.kind == "outcome" and records[-1].next_state.reward == 1.0
