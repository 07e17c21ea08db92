"""Scripted GUI agents (no model): they read each observation and act through its element ids.

`PlanAgent` plays a task's `Plan` (its oracle, or its wrong solution): each step's target (a role
and a name) is looked up in the observation the agent was just shown, exactly as a model would.
"""
from __future__ import annotations

import json
from typing import Callable, Optional

from clawr1.environment import AssistantTurn
from envs.agentic.agent import call_turn
from envs.gui.task import Plan, Step, find_element

OBSERVATION_HEADER = "The page:\n"


def latest_observation(messages: list[dict]) -> str:
    """The page as the agent last saw it: the last tool result's output, else the first user message's page."""
    for message in reversed(messages):
        if message.get("role") == "tool":
            try:
                output = json.loads(message.get("content") or "{}").get("output", "")
            except ValueError:
                continue
            if output.startswith("Page:"):
                return output
        if message.get("role") == "user" and OBSERVATION_HEADER in (message.get("content") or ""):
            return message["content"].split(OBSERVATION_HEADER, 1)[1]
    return ""


def instruction_of(messages: list[dict]) -> str:
    first_user = next((m.get("content") or "" for m in messages if m.get("role") == "user"), "")
    return first_user.split(OBSERVATION_HEADER, 1)[0].removeprefix("Task: ").strip()


class PlanAgent:
    """A ChatClient that plays `plan_for(task_id)`; a step whose target is not in the page ends the episode."""

    def __init__(self, plan_for: Callable[[str], Optional[Plan]]):
        self.plan_for = plan_for
        self.steps_taken: dict[str, int] = {}
        self.outcomes: dict[str, float] = {}

    async def chat(self, session_id: str, messages: list[dict], *, tools=None, side: bool = False, seed=None,
                   max_tokens=None, task_id: str = "", group_id: str = "", user: str = "") -> AssistantTurn:
        plan = self.plan_for(task_id)
        k = self.steps_taken.get(session_id, 0)
        self.steps_taken[session_id] = k + 1
        observation = latest_observation(messages)
        step = plan(instruction_of(messages), observation, k) if plan else None
        if step is None:
            return AssistantTurn("")
        return self._turn(step, observation)

    @staticmethod
    def _turn(step: Step, observation: str) -> AssistantTurn:
        args = dict(step.args)
        if step.target is not None:
            ref = find_element(observation, step.target)
            if ref is None:
                return AssistantTurn(f"(scripted agent) no {step.target.role} {step.target.name!r} on the page")
            args["id"] = ref
        return call_turn([(step.tool, args)])

    async def complete(self, session_id: str, reward: float, text: str = "") -> None:
        self.outcomes[session_id] = reward
        self.steps_taken.pop(session_id, None)
