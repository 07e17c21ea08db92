"""Scripted agents for calibration: the oracle passes every task, the null agent fails every one."""
from __future__ import annotations

import json

from envs.toolcall.shop.db import Db, load_db
from envs.toolcall.shop.grader import Grade, grade
from envs.toolcall.shop.tasks import REFUSAL_PHRASES, ShopTask
from envs.toolcall.shop.tools import ToolResult, call_tool


def oracle_calls(task: ShopTask) -> list[dict]:
    """The task's natural reads, then its gold actions, as OpenAI assistant tool calls."""
    return [{"id": f"call_{i}", "type": "function",
             "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
            for i, c in enumerate((*task.reads, *task.actions))]


def oracle_answer(task: ShopTask) -> str:
    """A final reply that states every required output (the first alternative of each group)."""
    facts = "; ".join(group[0] for group in task.outputs)
    opening = f"Sorry, I {REFUSAL_PHRASES[0]} do that." if task.refuse else "Done."
    return f"{opening} {facts}".strip() if facts else opening


def run_tool_calls(db: Db, tool_calls: list[dict]) -> tuple[list[dict], list[ToolResult]]:
    """Execute OpenAI tool calls on `db`: the `tool` messages to send back, and the structured results."""
    messages, results = [], []
    for call in tool_calls:
        f = call.get("function", call)
        result = call_tool(db, f.get("name", ""), f.get("arguments"))
        messages.append({"role": "tool", "tool_call_id": call.get("id", ""), "content": result.content})
        results.append(result)
    return messages, results


def run_oracle(task: ShopTask) -> Grade:
    db = load_db()
    run_tool_calls(db, oracle_calls(task))
    return grade(task, db, [oracle_answer(task)])


def run_null(task: ShopTask) -> Grade:
    """An agent that calls nothing and says nothing."""
    return grade(task, load_db(), [])
