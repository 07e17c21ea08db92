"""Grading a shop episode: the database it left behind and what the assistant said.

The expected database is a fresh copy with the task's gold actions replayed. Both sides are
compared in canonical form (strings case- and whitespace-folded, money in cents). Required
outputs are matched with `envs.toolcall.text.contains`: case, whitespace and number formatting
(12.5 vs 12.50, 1,299 vs 1299) do not matter.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from envs.toolcall.shop.db import Db, canonical, db_diff, load_db
from envs.toolcall.shop.tasks import ShopTask
from envs.toolcall.shop.tools import call_tool
from envs.toolcall.text import contains


@dataclass
class Grade:
    passed: bool
    db_match: bool
    missing_outputs: list[str]  # one entry per unmet group, its alternatives joined by " | "
    db_diff: list[str] = field(default_factory=list)  # paths that differ from the expected state


def expected_db(task: ShopTask) -> Db:
    """A fresh database with the task's gold actions applied; a failing gold action is a broken task."""
    db = load_db()
    for call in task.actions:
        result = call_tool(db, call.name, call.arguments)
        if not result.ok:
            raise ValueError(f"shop task {task.id}: gold action {call.name} failed: {result.error}")
    return db


def missing_outputs(task: ShopTask, assistant_texts: Sequence[str] | str) -> list[str]:
    text = assistant_texts if isinstance(assistant_texts, str) else "\n".join(t or "" for t in assistant_texts)
    return [" | ".join(group) for group in task.required_outputs if not any(contains(text, s) for s in group)]


def grade(task: ShopTask, db_after: Db, assistant_texts: Sequence[str] | str) -> Grade:
    """Pass when the database equals the gold state and every required output was said."""
    diff = db_diff(canonical(db_after), canonical(expected_db(task)))
    missing = missing_outputs(task, assistant_texts)
    return Grade(passed=not diff and not missing, db_match=not diff, missing_outputs=missing, db_diff=diff)
