"""The agent loop every tool-using environment shares, and the scripted agents that calibrate tasks.

One episode: the policy gets the task's messages and tools through a `ChatClient` (the gateway);
each tool call it makes runs in the task's `World` (a sandbox, a database...); the result goes
back as a `tool` message with the call's `tool_call_id`. The episode ends when the policy submits,
stops calling tools (tasks that need a submit get one nudge first), or reaches `max_turns`. Then
the world grades it and the outcome goes to `client.complete` (the gateway's
`/v1/sessions/{id}/complete`), where the judge's `env` backend reads it.

A tool result goes back to the policy as one line of JSON with its structured status
(`{"ok": ..., "exit_code": ..., "timed_out": ..., "error": ..., "output": ...}`), so the judge can
read a turn's signal from fields, never by searching free text for words like "error".
"""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any, Optional, Protocol

from clawr1.environment import AssistantTurn, ChatClient, EpisodeResult

NUDGE = "You have not submitted yet. Continue with the tools, and call submit when the task is done."


@dataclass
class ToolOutcome:
    """What one tool call did, with structured status."""

    output: str  # what the tool printed or returned
    ok: bool = True
    error: str = ""  # a malformed call, an unknown tool, a call the tool refused
    exit_code: Optional[int] = None  # commands only
    timed_out: bool = False
    submitted: bool = False  # the call ended the episode (submit)
    wall_s: float = 0.0  # time the tool took (for a sandbox: one command)

    def message_content(self) -> str:
        fields: dict[str, Any] = {"ok": self.ok}
        if self.exit_code is not None:
            fields["exit_code"] = self.exit_code
        if self.timed_out:
            fields["timed_out"] = True
        if self.error:
            fields["error"] = self.error
        fields["output"] = self.output
        return json.dumps(fields, ensure_ascii=False)


@dataclass
class Grade:
    passed: bool
    reward: float  # what goes to the judge as the outcome (+1 / -1, or a fraction)
    feedback: str = ""  # said to the judge with the outcome (a failing test's name...)
    details: dict[str, Any] = field(default_factory=dict)


class World(Protocol):
    """One episode's world: runs tool calls and grades the end state. Blocking calls are fine (run in a thread)."""

    def call(self, name: str, arguments: str) -> ToolOutcome: ...

    def grade(self, messages: list[dict]) -> Grade: ...

    def close(self) -> None: ...


@dataclass
class AgentTask:
    """What the agent loop needs of a task."""

    id: str
    category: str
    messages: list[dict]  # system and user messages the episode starts with
    tools: list[dict]  # OpenAI function schemas
    max_turns: int = 16
    needs_submit: bool = False  # the episode ends on a submit call (one nudge when the policy stops without it)


async def run_episode(client: ChatClient, task: AgentTask, world: World, session_id: str, *,
                      side: bool = False, group_id: str = "") -> EpisodeResult:
    """Play one episode of `task` through `client`, grade it, report the outcome (unless `side`)."""
    t0 = time.monotonic()
    messages = [dict(m) for m in task.messages]
    result = EpisodeResult(task.id, task.category, passed=False, reward=0.0, turns=0)
    nudged = False
    while result.turns < task.max_turns:
        turn = await client.chat(session_id, messages, tools=task.tools, side=side, task_id=task.id,
                                 group_id=group_id)
        result.turns += 1
        messages.append(turn.message())
        if not turn.tool_calls:
            if task.needs_submit and not nudged:
                nudged = True
                messages.append({"role": "user", "content": NUDGE})
                continue
            break
        if await _run_calls(turn, world, messages, result):
            break
    return await finish_episode(client, world, messages, result, session_id, side=side, started=t0)


async def finish_episode(client: ChatClient, world: World, messages: list[dict], result: EpisodeResult,
                         session_id: str, *, side: bool, started: float) -> EpisodeResult:
    """Grade the finished episode into `result` and report the outcome through `client` (unless `side`)."""
    grade = await asyncio.to_thread(world.grade, messages)
    result.passed, result.reward, result.details = grade.passed, grade.reward, grade.details
    result.wall_s = time.monotonic() - started
    if not side:
        await client.complete(session_id, reward=grade.reward, text=grade.feedback)
    return result


async def _run_calls(turn: AssistantTurn, world: World, messages: list[dict], result: EpisodeResult) -> bool:
    """Run one turn's tool calls in order; whether one of them submitted."""
    submitted = False
    for call in turn.tool_calls:
        f = call.get("function", {})
        arguments = f.get("arguments", "")
        out = await asyncio.to_thread(world.call, f.get("name", ""), arguments if isinstance(arguments, str)
                                      else json.dumps(arguments))
        result.tool_calls += 1
        result.tool_errors += not out.ok
        result.timeouts += out.timed_out
        result.tool_s += out.wall_s
        messages.append({"role": "tool", "tool_call_id": call.get("id", ""), "content": out.message_content()})
        submitted = submitted or out.submitted
    return submitted


async def evaluate_tasks(run_task: Any, client: ChatClient, tasks: list[Any], session_prefix: str,
                         concurrency: int) -> list[EpisodeResult]:
    """Each task once as side turns (never trained on), `concurrency` at a time: the held-out evaluation."""
    slots = asyncio.Semaphore(concurrency)

    async def play(i: int, task: Any) -> EpisodeResult:
        async with slots:
            return await run_task(client, task, f"{session_prefix}-{i}", side=True)

    return list(await asyncio.gather(*(play(i, t) for i, t in enumerate(tasks))))


async def play_group(run_task: Any, client: ChatClient, task: Any, session_id: str, size: int) -> list[EpisodeResult]:
    """`size` training attempts at one task, concurrently: one GRPO group (a shared group id) when size > 1."""
    if size == 1:
        return [await run_task(client, task, session_id, side=False)]
    return list(await asyncio.gather(*(run_task(client, task, f"{session_id}-{i}", side=False, group_id=session_id)
                                       for i in range(size))))


def tally_episodes(counts: dict[str, float], results: list[EpisodeResult]) -> None:
    """Add training episodes to an environment's counters (`timeouts` where it keeps that one)."""
    for result in results:
        counts["episodes"] += 1
        counts["episodes_passed"] += result.passed
        counts["tool_calls"] += result.tool_calls
        counts["tool_errors"] += result.tool_errors
        if "timeouts" in counts:
            counts["timeouts"] += result.timeouts


def group_metrics(results: list[EpisodeResult]) -> dict[str, float]:
    """A training group's metrics: each episode metric's mean over the attempts."""
    per_episode = [r.metrics() for r in results]
    return {name: sum(m[name] for m in per_episode) / len(per_episode) for name in per_episode[0]}


def pass_rates(results: list[EpisodeResult]) -> dict[str, float]:
    """The headline of an evaluation: pass rate, mean turns and tool errors (and timeouts) per task."""
    k = max(1, len(results))
    return {"pass_rate": sum(r.passed for r in results) / k, "mean_turns": sum(r.turns for r in results) / k,
            "tool_errors": sum(r.tool_errors for r in results) / k, "timeouts": sum(r.timeouts for r in results) / k}


# ---------------------------------------------------------------- scripted agents (no model)
class ScriptedAgent:
    """A ChatClient without a model: for each task, a fixed list of turns, played in order.

    `turns_for(task_id)` gives the script (e.g. the reference solution through the tools, for an oracle);
    past its end the agent answers with an empty message, which ends the episode.
    """

    def __init__(self, turns_for: Any):
        self.turns_for = turns_for
        self.played: dict[str, int] = {}
        self.outcomes: dict[str, float] = {}

    async def chat(self, session_id: str, messages: list[dict], *, tools: Optional[list[dict]] = None,
                   side: bool = False, seed: Optional[int] = None, max_tokens: Optional[int] = None,
                   task_id: str = "", group_id: str = "", user: str = "") -> AssistantTurn:
        script = self.turns_for(task_id)
        k = self.played.get(session_id, 0)
        self.played[session_id] = k + 1
        return script[k] if k < len(script) else AssistantTurn("")

    async def complete(self, session_id: str, reward: float, text: str = "") -> None:
        self.outcomes[session_id] = reward
        self.played.pop(session_id, None)


def call_turn(calls: list[tuple[str, dict]], content: str = "") -> AssistantTurn:
    """An assistant turn that makes these tool calls (name, arguments)."""
    return AssistantTurn(content, tool_calls=[
        {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
        for i, (name, args) in enumerate(calls)], finish_reason="tool_calls")
