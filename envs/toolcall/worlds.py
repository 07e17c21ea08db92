"""One episode's world for each tool-call task set (see `envs.agentic.agent.World`).

- `ShopWorld`: a fresh copy of the shop database; tools through `shop.call_tool`; graded by
  `shop.grade` on the database left behind and everything the assistant said.
- `LearnableWorld`: the calculator tool; graded on the final answer.
- `BfclWorld`: nothing runs; the first assistant turn's calls are the answer, checked by
  `bfcl.check_calls`. Every call "submits", so the episode ends after that turn.

Rewards are +1 (passed) / -1 (failed). No world raises on anything a model can send.
"""
from __future__ import annotations

import json
from typing import Optional

from envs.agentic.agent import Grade, ToolOutcome
from envs.toolcall import learnable, shop
from envs.toolcall.bfcl import BfclTask, check_calls
from envs.toolcall.dispatch import ToolResult, parse_arguments


def reward(passed: bool) -> float:
    return 1.0 if passed else -1.0


def outcome(result: ToolResult) -> ToolOutcome:
    """A dispatcher's ToolResult as the agent loop's ToolOutcome (on failure the error says it all)."""
    if result.ok:
        return ToolOutcome(output=result.content)
    return ToolOutcome(output="", ok=False, error=result.error or "the tool failed")


def assistant_messages(messages: list[dict]) -> list[dict]:
    return [m for m in messages if m.get("role") == "assistant"]


def assistant_texts(messages: list[dict]) -> list[str]:
    return [m.get("content") or "" for m in assistant_messages(messages)]


class ShopWorld:
    def __init__(self, task: shop.ShopTask):
        self.task = task
        self.db = shop.load_db()

    def call(self, name: str, arguments: str) -> ToolOutcome:
        return outcome(shop.call_tool(self.db, name, arguments))

    def grade(self, messages: list[dict]) -> Grade:
        g = shop.grade(self.task, self.db, assistant_texts(messages))
        problems = []
        if g.missing_outputs:
            problems.append("the answer did not state: " + "; ".join(g.missing_outputs))
        if g.db_diff:
            problems.append("the database differs from the expected one at: " + ", ".join(g.db_diff))
        return Grade(g.passed, reward(g.passed), feedback=". ".join(problems),
                     details={"db_match": g.db_match, "missing_outputs": g.missing_outputs, "db_diff": g.db_diff})

    def close(self) -> None:
        pass


class LearnableWorld:
    def __init__(self, task: learnable.LearnTask):
        self.task = task

    def call(self, name: str, arguments: str) -> ToolOutcome:
        return outcome(learnable.call_tool(name, arguments))

    def grade(self, messages: list[dict]) -> Grade:
        texts = assistant_texts(messages)
        final = texts[-1] if texts else ""
        passed = learnable.grade(self.task, final)
        feedback = "" if passed else f"the final answer should state {self.task.answer}"
        return Grade(passed, reward(passed), feedback=feedback, details={"final_text": final})

    def close(self) -> None:
        pass


class BfclWorld:
    """Single turn: each call is acknowledged (or refused when malformed) and ends the episode."""

    def __init__(self, task: BfclTask):
        self.task = task

    def call(self, name: str, arguments: str) -> ToolOutcome:
        error = self._call_error(name, arguments)
        if error:
            return ToolOutcome(output="", ok=False, error=error, submitted=True)
        return ToolOutcome(output="call recorded", submitted=True)

    def _call_error(self, name: str, arguments: str) -> Optional[str]:
        if name not in self.task.to_bfcl:
            return f"unknown tool '{name}'; tools are: {', '.join(self.task.to_bfcl)}"
        args = parse_arguments(arguments)
        return args if isinstance(args, str) else None

    def grade(self, messages: list[dict]) -> Grade:
        replies = assistant_messages(messages)
        calls = (replies[0].get("tool_calls") or []) if replies else []
        result = check_calls(self.task, calls)
        return Grade(result.ok, reward(result.ok), feedback=result.reason,
                     details={"calls": [self._bfcl_call(c) for c in calls]})

    def _bfcl_call(self, call: dict) -> dict:
        """A call under its BFCL name, with its arguments parsed when they are JSON."""
        f = call.get("function", {})
        name, args = f.get("name", ""), f.get("arguments", "")
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                pass
        return {"name": self.task.to_bfcl.get(name, name), "arguments": args}

    def close(self) -> None:
        pass
