"""The tool-call environment: shop, learnable or BFCL tasks played through the shared agent loop.

`ToolCallEnv(args, seed)` implements `clawr1.environment.TaskEnvironment`. Env args:

- `tasks`: the pool the env trains on: "shop" (default), "learnable", or "bfcl:simple",
  "bfcl:multiple", "bfcl:parallel" (optionally "bfcl:simple:50": the first 50).
- `eval_tasks`: a task spec (see `tasks()`) for `evaluate`; by default the pool's held-out part.
  Training never uses a task that `evaluate` scores.
- `max_turns`: assistant turns per episode (default 8 shop, 3 learnable, 1 BFCL).
- `seed`: the seed of the task splits (learnable's held-out split, BFCL's held-out sample). Keep 0
  when the model was warm-started on `learnable.warmstart_conversations`, which draws from split 0.

Task specs (`tasks(spec)`): "shop" (all 30), "shop:train", "shop:heldout" (every 5th task by id);
"learnable" (= "learnable:heldout", what a benchmark should use), "learnable:train";
"bfcl:<category>" (the whole category), "bfcl:<category>:<N>" (its first N),
"bfcl:<category>:train", "bfcl:<category>:heldout" (a fixed quarter). `tasks(None)` is the spec
named by the `tasks` arg, read as a task spec ("learnable": its held-out split).
"""
from __future__ import annotations

import random
from dataclasses import dataclass, fields
from typing import Any, Optional

from clawr1.environment import AssistantTurn, ChatClient, EpisodeResult
from envs.agentic.agent import (AgentTask, ScriptedAgent, World, evaluate_tasks, group_metrics, pass_rates,
                                play_group, run_episode, tally_episodes)
from envs.toolcall import bfcl, learnable, shop
from envs.toolcall.worlds import BfclWorld, LearnableWorld, ShopWorld

BFCL_SYSTEM_PROMPT = ("You are a helpful assistant with access to functions. Answer the request by calling "
                      "the right function or functions, with the right arguments, all in one turn.")
DEFAULT_MAX_TURNS = {"shop": 8, "learnable": 3, "bfcl": 1}
SHOP_HELDOUT_EVERY = 5  # every 5th shop task by id is held out
BFCL_HELDOUT_FRACTION = 0.25
EVAL_CONCURRENCY = 4
PARTS = ("train", "heldout")


@dataclass
class ToolCallEnvConfig:
    tasks: str = "shop"
    eval_tasks: str = ""  # "": the held-out part of `tasks`
    max_turns: int = 0  # 0: the task set's default
    seed: int = 0  # the task splits' seed
    group_size: int = 1  # attempts of the same task per training episode, one GRPO group (match pool.group_size)

    @classmethod
    def from_args(cls, args: dict[str, Any]) -> "ToolCallEnvConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(args) - known)
        if unknown:
            raise ValueError(f"toolcall env: unknown arg(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        cfg = cls(**args)
        if cfg.max_turns < 0:
            raise ValueError(f"toolcall env: max_turns must be >= 0, got {cfg.max_turns}")
        return cfg


@dataclass
class ToolTask:
    """One task: what the agent loop plays (`agent`) and the task set's own task (`task`)."""

    source: str  # shop | learnable | bfcl
    agent: AgentTask
    task: Any  # shop.ShopTask | learnable.LearnTask | bfcl.BfclTask

    @property
    def id(self) -> str:
        return self.agent.id

    @property
    def category(self) -> str:
        return self.agent.category


@dataclass(frozen=True)
class Spec:
    """A parsed task spec: a pool (source, BFCL category and limit) and which part of it."""

    source: str
    category: str = ""  # BFCL only
    limit: Optional[int] = None  # BFCL only: the first N of the category
    part: str = ""  # "" | train | heldout

    @property
    def pool(self) -> "Spec":
        return Spec(self.source, self.category, self.limit)


SPEC_FORMS = ("shop", "shop:train", "shop:heldout", "learnable", "learnable:train", "learnable:heldout",
              "bfcl:<simple|multiple|parallel>[:N|:train|:heldout]")


def parse_spec(spec: str) -> Spec:
    head, *rest = spec.split(":")
    if head in ("shop", "learnable") and len(rest) <= 1 and (not rest or rest[0] in PARTS):
        part = rest[0] if rest else ("heldout" if head == "learnable" else "")
        return Spec(head, part=part)
    if head == "bfcl" and len(rest) in (1, 2) and rest[0] in bfcl.CATEGORY_STEMS:
        tail = rest[1] if len(rest) == 2 else ""
        if tail in PARTS or tail == "":
            return Spec("bfcl", rest[0], part=tail)
        if tail.isdigit() and int(tail) > 0:
            return Spec("bfcl", rest[0], limit=int(tail))
    raise ValueError(f"toolcall env: unknown task spec {spec!r}; use one of {', '.join(SPEC_FORMS)}")


# ---------------------------------------------------------------- building tasks

def _agent_task(tid: str, category: str, system: str, user_messages: list[dict], tools: list[dict],
                max_turns: int) -> AgentTask:
    messages = [{"role": "system", "content": system}, *user_messages]
    return AgentTask(id=tid, category=category, messages=messages, tools=tools, max_turns=max_turns,
                     needs_submit=False)


def shop_task(t: shop.ShopTask, max_turns: int) -> ToolTask:
    user = [{"role": "user", "content": t.instruction}]
    return ToolTask("shop", _agent_task(t.id, f"shop/{t.kind}", shop.SYSTEM_PROMPT, user, shop.TOOLS, max_turns), t)


def learnable_task(t: learnable.LearnTask, max_turns: int) -> ToolTask:
    user = [{"role": "user", "content": t.question}]
    return ToolTask("learnable", _agent_task(t.id, f"learnable/{t.kind}", learnable.SYSTEM_PROMPT, user,
                                             learnable.TOOLS, max_turns), t)


def bfcl_task(t: bfcl.BfclTask, max_turns: int) -> ToolTask:
    return ToolTask("bfcl", _agent_task(t.id, f"bfcl/{t.category}", BFCL_SYSTEM_PROMPT, t.messages, t.tools,
                                        max_turns), t)


def _split(tasks: list[ToolTask], heldout: set[int]) -> dict[str, list[ToolTask]]:
    return {"": tasks, "train": [t for i, t in enumerate(tasks) if i not in heldout],
            "heldout": [t for i, t in enumerate(tasks) if i in heldout]}


def load_pool(pool: Spec, max_turns: int, seed: int) -> dict[str, list[ToolTask]]:
    """A pool's tasks, whole ("") and split into "train" and "heldout"."""
    if pool.source == "shop":
        tasks = [shop_task(t, max_turns) for t in sorted(shop.load_tasks(), key=lambda t: t.id)]
        return _split(tasks, {i for i in range(len(tasks)) if i % SHOP_HELDOUT_EVERY == SHOP_HELDOUT_EVERY - 1})
    if pool.source == "learnable":
        split = learnable.split_tasks(seed=seed)
        tasks = [learnable_task(t, max_turns) for t in split.train + split.heldout]
        return _split(tasks, set(range(len(split.train), len(tasks))))
    tasks = [bfcl_task(t, max_turns) for t in bfcl.load_bfcl(pool.category, pool.limit)]
    k = max(1, round(len(tasks) * BFCL_HELDOUT_FRACTION))
    return _split(tasks, set(random.Random(f"bfcl-{pool.category}-{seed}").sample(range(len(tasks)), k)))


# ---------------------------------------------------------------- oracle scripts

def oracle_script(task: ToolTask) -> list[AssistantTurn]:
    """The reference solution as assistant turns: the calls, then (shop, learnable) the answer."""
    if task.source == "shop":
        calls = shop.oracle_calls(task.task)
        answer = AssistantTurn(shop.oracle_answer(task.task))
        return ([AssistantTurn("", calls, "tool_calls")] if calls else []) + [answer]
    if task.source == "learnable":
        return [AssistantTurn("", [learnable.tool_call(task.task)], "tool_calls"),
                AssistantTurn(f"The answer is {task.task.answer}.")]
    return [AssistantTurn("", bfcl.as_tool_calls(bfcl.oracle_calls(task.task)), "tool_calls")]


def make_world(task: ToolTask) -> World:
    worlds = {"shop": ShopWorld, "learnable": LearnableWorld, "bfcl": BfclWorld}
    return worlds[task.source](task.task)


# ---------------------------------------------------------------- the environment

class ToolCallEnv:
    """A `clawr1.environment.TaskEnvironment` over the shop, learnable and BFCL tool-call tasks."""

    eval_metrics = ("pass_rate", "mean_turns")

    def __init__(self, args: dict[str, Any], seed: int = 0):
        self.cfg = ToolCallEnvConfig.from_args(args)
        self.run_seed = seed
        self._pools: dict[Spec, dict[str, list[ToolTask]]] = {}
        self._known: dict[str, ToolTask] = {}
        if self.cfg.tasks.split(":")[-1] in PARTS:
            raise ValueError(f"toolcall env: tasks must name a pool (shop, learnable, bfcl:<category>[:N]), "
                             f"not a part of one: {self.cfg.tasks!r}")
        pool = self._pool(parse_spec(self.cfg.tasks))
        self.heldout_set = self.tasks(self.cfg.eval_tasks) if self.cfg.eval_tasks else pool["heldout"]
        scored = {t.id for t in self.heldout_set}
        self.train_set = [t for t in pool["train"] if t.id not in scored]
        if not self.train_set or not self.heldout_set:
            raise ValueError(f"toolcall env: {len(self.train_set)} training and {len(self.heldout_set)} evaluation "
                             f"tasks with tasks={self.cfg.tasks!r}, eval_tasks={self.cfg.eval_tasks!r}")
        self.heldout_order = random.Random(f"eval-{self.cfg.seed}").sample(self.heldout_set, len(self.heldout_set))
        self.counts = {"episodes": 0, "episodes_passed": 0, "tool_calls": 0, "tool_errors": 0}

    # -- task sets
    def _pool(self, spec: Spec) -> dict[str, list[ToolTask]]:
        pool = spec.pool
        if pool not in self._pools:
            max_turns = self.cfg.max_turns or DEFAULT_MAX_TURNS[pool.source]
            self._pools[pool] = load_pool(pool, max_turns, self.cfg.seed)
            self._known.update({t.id: t for t in self._pools[pool][""]})
        return self._pools[pool]

    def tasks(self, spec: Optional[str] = None) -> list[ToolTask]:
        """The tasks of a spec (see the module docstring); None: the spec the `tasks` arg names."""
        parsed = parse_spec(self.cfg.tasks if spec is None else spec)
        return list(self._pool(parsed)[parsed.part])

    # -- playing
    async def run_task(self, client: ChatClient, task: ToolTask, session_id: str, *,
                       side: bool = True, group_id: str = "") -> EpisodeResult:
        world = make_world(task)
        try:
            return await run_episode(client, task.agent, world, session_id, side=side, group_id=group_id)
        finally:
            world.close()

    async def episode(self, client: ChatClient, session_id: str, rng: random.Random) -> dict[str, float]:
        """`group_size` attempts at one random training task, one GRPO group (reported to the judge); their mean."""
        results = await play_group(self.run_task, client, rng.choice(self.train_set), session_id, self.cfg.group_size)
        tally_episodes(self.counts, results)
        return group_metrics(results)

    async def evaluate(self, client: ChatClient, n: int, session_prefix: str) -> dict[str, float]:
        """Up to `n` evaluation tasks (the same ones every time) as side turns, 4 at a time."""
        results = await evaluate_tasks(self.run_task, client, self.heldout_order[:max(0, n)], session_prefix,
                                       EVAL_CONCURRENCY)
        return pass_rates(results)

    # -- calibration
    def scripted_agent(self, kind: str) -> ScriptedAgent:
        """"oracle": plays each task's reference solution; "null": answers with nothing at once."""
        if kind == "oracle":
            return ScriptedAgent(lambda task_id: oracle_script(self._task(task_id)))
        if kind == "null":
            return ScriptedAgent(lambda task_id: [])
        raise ValueError(f"toolcall env: unknown scripted agent {kind!r}; use 'oracle' or 'null'")

    def _task(self, task_id: str) -> ToolTask:
        if task_id not in self._known:
            raise KeyError(f"toolcall env: task {task_id!r} is not among the tasks this env has loaded")
        return self._known[task_id]

    def sandbox_overhead_s(self) -> Optional[float]:
        return None  # the tools are pure Python: no sandbox

    # -- reporting
    def describe(self) -> dict[str, Any]:
        return {"tasks": self.cfg.tasks, "eval_tasks": self.cfg.eval_tasks or f"{self.cfg.tasks} (held-out part)",
                "train_tasks": len(self.train_set), "eval_task_count": len(self.heldout_set),
                "max_turns": self.cfg.max_turns or DEFAULT_MAX_TURNS[parse_spec(self.cfg.tasks).source],
                "split_seed": self.cfg.seed}

    def report(self) -> dict[str, float]:
        return {k: float(v) for k, v in self.counts.items()}


ENVIRONMENT = ToolCallEnv
