"""Conversations for the tiny model's supervised warm start.

The warm-started model answers in every style with roughly equal probability
when nothing is asked for, and follows style directives when they appear in the
conversation. RL then has something to shift (the unconditioned style) and the
hint-conditioned teacher has something to say (the directed style).
"""
from __future__ import annotations

import random

from envs.personal.phrases import MOVE_ON, REASK, STILL_WRONG, SYSTEM_PROMPT
from envs.personal.preferences import (CALCULATOR, KINDS, OPTIONS, TOOL_OPTIONS, Style, directive_text, random_style,
                                       render_answer)
from envs.personal.questions import Question, warmstart_question

Conversation = list[dict]  # assistant messages are the training targets


def _wanted(rng: random.Random) -> Style:
    """Which options a directive asks for: any number of kinds (all five as often as one, since a user's whole
    profile is what the teacher's hint carries), every option of a kind equally often."""
    n = rng.choice((1, 2, 3, 4, 5, 5))
    return {kind: rng.choice(OPTIONS[kind]) for kind in rng.sample(KINDS, n)}


def _directed(q_text: str, wanted: Style, rng: random.Random) -> str:
    sep = rng.choice((" ", "\n", "\n"))
    prefix = rng.choice(("", "", "No. "))
    return q_text + sep + prefix + directive_text(wanted)


def _obey(rng: random.Random, wanted: Style) -> Style:
    return {**random_style(rng), **wanted}


def tool_turns(q: Question, answer: str) -> list[dict]:
    """Call the calculator, read its result, then answer."""
    call = {"id": "call_0", "type": "function",
            "function": {"name": "calculator", "arguments": {"expression": f"{q.a} + {q.b}"}}}
    return [{"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_0", "content": str(q.answer)},
            {"role": "assistant", "content": answer}]


def tool_conversation(rng: random.Random) -> Conversation:
    """The calculator is offered: used about half the time, or as a directive says."""
    q = warmstart_question(rng)
    wanted = _wanted(rng) if rng.random() < 0.5 else {}
    if rng.random() < 0.4:
        wanted["tool"] = rng.choice(TOOL_OPTIONS)
    user = _directed(q.text, wanted, rng) if wanted else q.text
    style = _obey(rng, {k: v for k, v in wanted.items() if k != "tool"})
    use_tool = wanted.get("tool", rng.choice(TOOL_OPTIONS)) == "calculator"
    msgs: Conversation = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]
    answer = render_answer(q, style)
    return msgs + (tool_turns(q, answer) if use_tool else [{"role": "assistant", "content": answer}])


def conversation(rng: random.Random) -> tuple[Conversation, list[dict] | None]:
    """One random warm-start conversation and the tools it offers (or None)."""
    if rng.random() < 0.2:
        return tool_conversation(rng), [CALCULATOR]
    return plain_conversation(rng), None


def plain_conversation(rng: random.Random) -> Conversation:
    """One random warm-start conversation without tools."""
    msgs: Conversation = [{"role": "system", "content": SYSTEM_PROMPT}]
    q = warmstart_question(rng)
    kind = rng.random()
    if kind < 0.15:  # plain question, any style
        msgs += [{"role": "user", "content": q.text}, {"role": "assistant", "content": render_answer(q, random_style(rng))}]
    elif kind < 0.65:  # question with a directive appended (the shape of a hint-enhanced teacher prompt)
        wanted = _wanted(rng)
        msgs += [{"role": "user", "content": _directed(q.text, wanted, rng)},
                 {"role": "assistant", "content": render_answer(q, _obey(rng, wanted))}]
    elif kind < 0.85:  # correction, then compliance
        first, wanted = random_style(rng), _wanted(rng)
        msgs += [{"role": "user", "content": q.text}, {"role": "assistant", "content": render_answer(q, first)},
                 {"role": "user", "content": "No. " + directive_text(wanted)},
                 {"role": "assistant", "content": render_answer(q, _obey(rng, wanted))}]
    elif kind < 0.88:  # implicit re-ask
        msgs += [{"role": "user", "content": q.text}, {"role": "assistant", "content": render_answer(q, random_style(rng))},
                 {"role": "user", "content": rng.choice(REASK).format(q=q.text)},
                 {"role": "assistant", "content": render_answer(q, random_style(rng))}]
    else:  # move on to a second question, possibly after a last complaint
        q2 = warmstart_question(rng)
        msgs += [{"role": "user", "content": q.text}, {"role": "assistant", "content": render_answer(q, random_style(rng))}]
        if rng.random() < 0.5:
            wanted = _wanted(rng)
            text = STILL_WRONG.format(directive=directive_text(wanted)) + " " + rng.choice(MOVE_ON).format(q=q2.text)
            style = _obey(rng, wanted)
        else:
            text, style = rng.choice(MOVE_ON).format(q=q2.text), random_style(rng)
        msgs += [{"role": "user", "content": text}, {"role": "assistant", "content": render_answer(q2, style)}]
    return msgs


def conversations(n: int, seed: int) -> list[tuple[Conversation, list[dict] | None]]:
    rng = random.Random(seed)
    return [conversation(rng) for _ in range(n)]
