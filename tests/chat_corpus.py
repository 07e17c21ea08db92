"""Generated conversations for rendering tests: with and without a system message, 1-8 turns, tools,
single and parallel tool calls, tool results, reasoning turns, non-ASCII text. Each ends where the model
speaks next (a user message or tool results)."""
from __future__ import annotations

import json
import random
from typing import Optional

WORDS = ["cat", "river", "fast", "blue", "seven", "café", "naïve", "Straße", "数学", "東京", "🙂", "résumé", "Ωmega",
         "12", "3.5", "km", "hello", "world", "(x)", "a-b", "don't", "€40", "нет"]
TOOLS = [
    {"type": "function", "function": {"name": "calculator", "description": "Evaluate an arithmetic expression.",
                                      "parameters": {"type": "object", "properties": {
                                          "expression": {"type": "string"}}, "required": ["expression"]}}},
    {"type": "function", "function": {"name": "lookup", "description": "Look a word up in the dictionary.",
                                      "parameters": {"type": "object", "properties": {
                                          "word": {"type": "string"}, "lang": {"type": "string"}},
                                          "required": ["word"]}}},
]


def _text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n)).capitalize()


def _call(rng: random.Random, i: int) -> dict:
    if rng.random() < 0.5:
        name, args = "calculator", {"expression": f"{rng.randint(1, 99)} + {rng.randint(1, 99)}"}
    else:
        name, args = "lookup", {"word": rng.choice(WORDS)}
    arguments = json.dumps(args, ensure_ascii=False) if rng.random() < 0.7 else args
    return {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": arguments}}


def _assistant_turn(rng: random.Random, tools: Optional[list], turn: int) -> list[dict]:
    """One assistant turn: maybe reasoning, maybe tool calls (one or parallel) and their results, then text."""
    out: list[dict] = []
    if tools and rng.random() < 0.5:
        calls = [_call(rng, turn * 10 + k) for k in range(rng.choice([1, 1, 2, 3]))]
        msg: dict = {"role": "assistant", "content": _text(rng, 3) if rng.random() < 0.3 else "", "tool_calls": calls}
        if rng.random() < 0.3:
            msg["reasoning_content"] = _text(rng, 5)
        out.append(msg)
        out += [{"role": "tool", "tool_call_id": c["id"], "content": _text(rng, 4)} for c in calls]
    final: dict = {"role": "assistant", "content": _text(rng, rng.randint(1, 12))}
    if rng.random() < 0.3:
        final["reasoning_content"] = _text(rng, 6)
    return out + [final]


def conversation(rng: random.Random) -> tuple[list[dict], Optional[list]]:
    tools = TOOLS[: rng.randint(1, 2)] if rng.random() < 0.5 else None
    messages: list[dict] = [{"role": "system", "content": _text(rng, 6)}] if rng.random() < 0.5 else []
    turns = rng.randint(1, 8)
    for turn in range(turns):
        messages.append({"role": "user", "content": _text(rng, rng.randint(1, 10))})
        if turn < turns - 1:
            messages += _assistant_turn(rng, tools, turn)
    if tools and rng.random() < 0.25:  # end on tool results: the model speaks after them
        calls = [_call(rng, 900 + k) for k in range(rng.choice([1, 2]))]
        messages.append({"role": "assistant", "content": "", "tool_calls": calls})
        messages += [{"role": "tool", "tool_call_id": c["id"], "content": _text(rng, 3)} for c in calls]
    return messages, tools


def corpus(n: int = 300, seed: int = 0) -> list[tuple[list[dict], Optional[list]]]:
    rng = random.Random(seed)
    return [conversation(rng) for _ in range(n)]
