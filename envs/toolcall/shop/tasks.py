"""Shop tasks: what the simulated user asks, the gold changes, and the facts the answer must state.

Tasks live in `data/shop_tasks.yaml` (its header documents the fields). Loading checks them:
known keys and kinds, unique ids, known tools, gold actions that change the database and reads
that do not.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from envs.toolcall.shop.db import DATA_DIR
from envs.toolcall.shop.tools import IMPLEMENTATIONS, MUTATING

TASKS_PATH = DATA_DIR / "shop_tasks.yaml"
KINDS = ("lookup", "mutation", "multi_step", "refuse")

# Any one of these in the answer counts as saying "no" on a refuse task.
REFUSAL_PHRASES = ["cannot", "can't", "can not", "unable", "not able", "not possible", "isn't possible",
                   "not allowed", "won't be able"]

SYSTEM_PROMPT = (
    "You are a customer service agent for an online shop. Use the tools to look things up and to make "
    "changes. Rules: identify the customer (by email or name) before acting, and act only on that "
    "customer's own orders. Only pending orders can be cancelled or modified. Only delivered orders can "
    "be refunded, and at most what was paid minus earlier refunds. If a request breaks a rule, change "
    "nothing and tell the customer you cannot do it and why. Always tell the customer the facts they "
    "ask for, such as amounts, statuses and tracking numbers."
)


@dataclass(frozen=True)
class Call:
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ShopTask:
    id: str
    kind: str
    instruction: str  # the simulated user's message
    reads: tuple[Call, ...] = ()  # natural read-only calls (for the oracle; not graded)
    actions: tuple[Call, ...] = ()  # gold calls that change the database
    outputs: tuple[tuple[str, ...], ...] = ()  # each group: any one of these strings must be said
    refuse: bool = False

    @property
    def required_outputs(self) -> list[list[str]]:
        """Every group of alternatives the assistant must say, refusal included."""
        groups = [list(g) for g in self.outputs]
        return groups + [list(REFUSAL_PHRASES)] if self.refuse else groups


def _calls(raw: list[dict] | None, where: str) -> tuple[Call, ...]:
    calls = []
    for c in raw or []:
        if set(c) != {"name", "arguments"} or c["name"] not in IMPLEMENTATIONS:
            raise ValueError(f"{where}: bad call {c!r}")
        calls.append(Call(c["name"], dict(c["arguments"])))
    return tuple(calls)


def _task(raw: dict) -> ShopTask:
    known = {"id", "kind", "instruction", "reads", "actions", "outputs", "refuse"}
    tid = raw.get("id", "?")
    if set(raw) - known or not {"id", "kind", "instruction"} <= set(raw):
        raise ValueError(f"shop task {tid}: keys must be among {sorted(known)} (id, kind, instruction required)")
    if raw["kind"] not in KINDS:
        raise ValueError(f"shop task {tid}: kind {raw['kind']!r} not in {KINDS}")
    reads, actions = _calls(raw.get("reads"), f"{tid}.reads"), _calls(raw.get("actions"), f"{tid}.actions")
    if any(c.name in MUTATING for c in reads) or any(c.name not in MUTATING for c in actions):
        raise ValueError(f"shop task {tid}: reads must not change the database and actions must")
    outputs = tuple(tuple(str(x) for x in (o if isinstance(o, list) else [o])) for o in raw.get("outputs") or [])
    return ShopTask(id=tid, kind=raw["kind"], instruction=raw["instruction"], reads=reads, actions=actions,
                    outputs=outputs, refuse=bool(raw.get("refuse", False)))


@lru_cache(maxsize=None)
def _load(path: str) -> tuple[ShopTask, ...]:
    tasks = tuple(_task(r) for r in yaml.safe_load(Path(path).read_text()))
    ids = [t.id for t in tasks]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{path}: duplicate task ids")
    return tasks


def load_tasks(path: Path = TASKS_PATH) -> list[ShopTask]:
    return list(_load(str(path)))


def get_task(task_id: str) -> ShopTask:
    for t in load_tasks():
        if t.id == task_id:
            return t
    raise KeyError(f"no shop task {task_id!r}")
