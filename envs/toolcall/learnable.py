"""Tool tasks small enough for the tiny CPU model (4 layers, 128 hidden) to learn with RL.

One tool: `calculator`, which evaluates `A + B`, `A - B` or `A * B` (the same tool the personal
env's warm start teaches, so the base model knows the call's shape). Calc questions ask for a
sum, difference or product; unit questions ask how many of a smaller unit are in an amount
(km -> m, h -> min, ...), so the expression needs the conversion factor. Each question needs
exactly one call, and the answer must repeat the tool's result:

    user:      What is 17 times 4?
    assistant: <tool_call> {"name": "calculator", "arguments": {"expression": "17 * 4"}}
    tool:      {"ok": true, "output": "68"}
    assistant: The answer is 68.

The first design (`calculator(op, a, b)`, then one tool per operation) was not learned by the tiny
model built then: its warm start wrote malformed calls nearly always, mixing them up with the
personal env's `calculator(expression)` (that build also trained on other number tokens than it
was served; see clawr1/tinymodel/build.py). One shared tool shape is learned: the default model
makes the right call about half the time at temperature 1 (docs/environments.md,
"Tool-call learning on CPU").

Text is short and regular on purpose. The held-out split holds question *pairs* never trained
on: 3 + 4 and 4 + 3 always fall in the same split.
"""
from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from typing import Any, Optional

from envs.toolcall.dispatch import ToolError, ToolResult, run_tool
from envs.toolcall.text import contains

SYSTEM_PROMPT = "Call a tool to get the number, then give the answer."

OPS = {"add": ("plus", lambda a, b: a + b), "subtract": ("minus", lambda a, b: a - b),
       "multiply": ("times", lambda a, b: a * b)}
MAX_OPERAND = 50
# (from, to): how many `to` in one `from`; only whole numbers, larger unit to smaller
UNITS: dict[tuple[str, str], int] = {
    ("km", "m"): 1000, ("m", "cm"): 100, ("cm", "mm"): 10, ("m", "mm"): 1000, ("kg", "g"): 1000,
    ("l", "ml"): 1000, ("h", "min"): 60, ("min", "s"): 60, ("h", "s"): 3600, ("day", "h"): 24, ("week", "day"): 7}
MAX_AMOUNT = 30
KINDS = ("calc", "unit")

SYMBOLS = {"add": "+", "subtract": "-", "multiply": "*"}
CALCULATOR = {"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}
TOOLS: list[dict] = [CALCULATOR]
_SCHEMAS = {"calculator": {**CALCULATOR["function"]["parameters"], "additionalProperties": False}}
_EXPRESSION = re.compile(r"^\s*(-?\d{1,9})\s*([-+*])\s*(-?\d{1,9})\s*$")


def calculator(expression: str) -> str:
    """`A op B` with op one of + - * (whole numbers): nothing else is evaluated."""
    match = _EXPRESSION.match(expression)
    if not match:
        raise ToolError(f"cannot evaluate {expression!r}: write two whole numbers joined by +, - or *")
    a, op, b = int(match[1]), match[2], int(match[3])
    return str(a + b if op == "+" else a - b if op == "-" else a * b)


_IMPLS = {"calculator": calculator}


def call_tool(name: str, arguments: str | dict | None) -> ToolResult:
    return run_tool(_SCHEMAS, _IMPLS, name, arguments)


@dataclass(frozen=True)
class LearnTask:
    id: str
    kind: str  # calc | unit
    question: str
    tool: str  # the tool to call
    arguments: dict[str, Any]  # the call that answers it
    answer: int  # the tool's result, which the final answer must contain

    def messages(self) -> list[dict]:
        """The conversation to send the policy: system prompt and question."""
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": self.question}]


def _calc(op: str, a: int, b: int) -> LearnTask:
    word, fn = OPS[op]
    return LearnTask(f"calc-{op}-{a}-{b}", "calc", f"What is {a} {word} {b}?", "calculator",
                     {"expression": f"{a} {SYMBOLS[op]} {b}"}, fn(a, b))


def _unit(src: str, dst: str, amount: int) -> LearnTask:
    return LearnTask(f"unit-{src}-{dst}-{amount}", "unit", f"How many {dst} are in {amount} {src}?", "calculator",
                     {"expression": f"{amount} * {UNITS[(src, dst)]}"}, amount * UNITS[(src, dst)])


def _groups(kind: str) -> list[list[LearnTask]]:
    """Every task of a kind, grouped so that a split never separates a question from its mirror."""
    if kind == "unit":
        return [[_unit(s, d, n)] for (s, d) in UNITS for n in range(1, MAX_AMOUNT + 1)]
    groups = []
    for op in OPS:
        for a in range(1, MAX_OPERAND + 1):
            for b in range(1, a + 1):
                if op == "subtract":  # keep results positive: the larger number first
                    groups.append([_calc(op, a, b)] if a > b else [])
                else:
                    groups.append([_calc(op, a, b)] + ([_calc(op, b, a)] if a != b else []))
    return [g for g in groups if g]


@dataclass
class TaskSplit:
    train: list[LearnTask]
    heldout: list[LearnTask]


def split_tasks(seed: int = 0, heldout_fraction: float = 0.1, kinds: tuple[str, ...] = KINDS) -> TaskSplit:
    """Disjoint train and held-out tasks; the same seed always gives the same split."""
    unknown = set(kinds) - set(KINDS)
    if unknown or not kinds:
        raise ValueError(f"learnable: kinds must be a non-empty subset of {KINDS}, got {kinds}")
    train, heldout = [], []
    for kind in kinds:
        groups = _groups(kind)
        random.Random(f"{seed}-{kind}").shuffle(groups)
        cut = max(1, round(len(groups) * heldout_fraction))
        heldout += [t for g in groups[:cut] for t in g]
        train += [t for g in groups[cut:] for t in g]
    return TaskSplit(train, heldout)


def grade(task: LearnTask, final_text: str) -> bool:
    """Did the final answer state the tool's result (as a whole number, not inside another)?"""
    return contains(final_text or "", str(task.answer))


def right_call(task: LearnTask, name: str, arguments: str | dict | None) -> bool:
    """Is this a call that answers the task (the calculator, on an expression worth the answer)?"""
    result = call_tool(name, arguments)
    return name == task.tool and result.ok and result.content == str(task.answer)


def tool_call(task: LearnTask, call_id: str = "call_0") -> dict:
    return {"id": call_id, "type": "function",
            "function": {"name": task.tool, "arguments": json.dumps(task.arguments)}}


def tool_message(result: ToolResult) -> str:
    """The tool message the agent loop sends for this result (envs/agentic: one JSON line with its status),
    so the warm start shows the model exactly what RL will."""
    from envs.agentic.agent import ToolOutcome

    outcome = ToolOutcome(result.content) if result.ok else ToolOutcome("", ok=False, error=result.error or "")
    return outcome.message_content()


def solved_conversation(task: LearnTask) -> list[dict]:
    """The whole right episode: question, tool call, tool result, answer."""
    return task.messages() + [
        {"role": "assistant", "content": "", "tool_calls": [tool_call(task)]},
        {"role": "tool", "tool_call_id": "call_0", "content": tool_message(call_tool(task.tool, task.arguments))},
        {"role": "assistant", "content": f"The answer is {task.answer}."}]


Conversation = tuple[list[dict], list[dict]]  # (messages, tools), OpenAI format


def warmstart_conversations(n: int, seed: int, split: Optional[TaskSplit] = None) -> list[Conversation]:
    """`n` solved (messages, tools) conversations drawn from the train split only."""
    pool = (split or split_tasks()).train
    rng = random.Random(f"warmstart-{seed}")
    return [(solved_conversation(rng.choice(pool)), TOOLS) for _ in range(n)]
