"""The Environment protocol: what `clawr1 rollout` drives, and the chat client it hands to environments.

An environment is a class named by import path (`rollout.env: package.module:Class`), built as
`Class(env_args, seed=run_seed)`. It talks to the policy only through a `ChatClient`, which
`clawr1 rollout` implements over the gateway with the official `openai` client, exactly as any
external agent would. clawr1 itself never imports an environment: the names of the evaluation
metrics reach the progress line and `clawr1 report` through the metrics the rollout loop writes.
An environment that holds a process (envs/gui's browser) may define `close()`: `clawr1 rollout`
and `clawr1 bench` call it when they finish.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Optional, Protocol, Sequence, runtime_checkable


@dataclass
class AssistantTurn:
    """One whole assistant turn as the gateway answered it."""

    content: str  # the text ("" when the turn only calls tools)
    tool_calls: list[dict] = field(default_factory=list)  # OpenAI shape: {"id", "type": "function", "function": {...}}
    finish_reason: str = "stop"  # stop | length | tool_calls
    reasoning: str = ""  # a thinking model's reasoning_content, if any

    def message(self) -> dict:
        """The assistant message to append to the conversation (what a client sends back next turn)."""
        msg: dict[str, Any] = {"role": "assistant", "content": self.content if (self.content or not self.tool_calls) else None}
        if self.tool_calls:
            msg["tool_calls"] = self.tool_calls
        return msg


def assistant_turn(choice: Any) -> AssistantTurn:
    """An `openai` client's Choice as an AssistantTurn."""
    message = choice.message
    calls = [c.model_dump(include={"id", "type", "function"}) for c in message.tool_calls or []]
    return AssistantTurn(content=message.content or "", tool_calls=calls, finish_reason=choice.finish_reason or "stop",
                         reasoning=getattr(message, "reasoning_content", None) or "")


class ChatClient(Protocol):
    """The policy, as an environment sees it: one chat session per `session_id`."""

    async def chat(self, session_id: str, messages: list[dict], *, tools: Optional[list[dict]] = None,
                   side: bool = False, seed: Optional[int] = None, max_tokens: Optional[int] = None,
                   task_id: str = "", group_id: str = "", user: str = "") -> AssistantTurn:
        """The next assistant turn. `side=True`: never trained on (evaluation); task_id/group_id group samples;
        `user`: who is asking (with lora.per_user, whose adapter answers)."""
        ...

    async def complete(self, session_id: str, reward: float, text: str = "") -> None:
        """Report the session's outcome (it ends the session; the env judge reads the reward)."""
        ...


@runtime_checkable
class Environment(Protocol):
    """Episodes to train on, and a held-out evaluation.

    `eval_metrics` names what `evaluate` reports, the headline score first (it is what the
    progress line and `clawr1 report` show); `evaluate` may report more keys than it names.
    """

    eval_metrics: Sequence[str]

    def describe(self) -> dict[str, Any]:
        """What this environment is (logged once at start)."""
        ...

    async def episode(self, client: ChatClient, session_id: str, rng: random.Random) -> dict[str, float]:
        """One training episode through `client`; returns its metrics (averaged into the rollout's records)."""
        ...

    async def evaluate(self, client: ChatClient, n: int, session_prefix: str) -> dict[str, float]:
        """Held-out evaluation on `n` tasks as side turns; returns at least every name in `eval_metrics`."""
        ...

    def report(self) -> dict[str, float]:
        """The environment's own counters since the start (may be empty)."""
        ...


@dataclass
class EpisodeResult:
    """One attempt at one task by an agent (what `clawr1 bench` tabulates)."""

    task_id: str
    category: str
    passed: bool
    reward: float
    turns: int
    tool_calls: int = 0
    tool_errors: int = 0  # malformed calls, unknown tools, calls the tool refused, commands that failed
    timeouts: int = 0
    tool_s: float = 0.0  # time spent running tools (commands)
    wall_s: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)

    def metrics(self) -> dict[str, float]:
        return {"passed": float(self.passed), "reward": self.reward, "turns": float(self.turns),
                "tool_errors": float(self.tool_errors), "timeouts": float(self.timeouts)}


@runtime_checkable
class TaskEnvironment(Environment, Protocol):
    """An Environment made of tasks an agent passes or fails, which `clawr1 bench` can score.

    `tasks(spec)` picks a task set (None: the bundled one); every task has `.id` and `.category`.
    `scripted_agent("oracle" | "null")` is a ChatClient with no model that plays each task's reference
    solution, or gives up at once: they calibrate the tasks (oracle must pass, null must fail).
    """

    def tasks(self, spec: Optional[str] = None) -> list[Any]: ...

    async def run_task(self, client: ChatClient, task: Any, session_id: str, *, side: bool = True) -> EpisodeResult:
        ...

    def scripted_agent(self, kind: str) -> ChatClient: ...

    def sandbox_overhead_s(self) -> Optional[float]:
        """Seconds a trivial command costs in this environment's sandbox (None: no sandbox)."""
        ...


def check_environment(env: Any, import_path: str) -> None:
    """Refuse, naming what is missing, an object that does not implement the protocol."""
    missing = [name for name in ("eval_metrics", "describe", "episode", "evaluate", "report") if not hasattr(env, name)]
    if missing:
        raise TypeError(f"rollout.env {import_path} is not a clawr1 Environment: it lacks {', '.join(missing)} "
                        f"(see clawr1/environment.py)")
    if not env.eval_metrics:
        raise TypeError(f"rollout.env {import_path}: eval_metrics must name at least the headline score")


def close_environment(env: Any) -> None:
    """Release what an environment holds (a browser, sandboxes), where it says how (an optional `close()`)."""
    close = getattr(env, "close", None)
    if callable(close):
        close()
