"""Conversations for the tiny model's supervised warm start.

The warm-started model answers in every style with roughly equal probability
when nothing is asked for, and follows style directives when they appear in the
conversation. RL then has something to shift (the unconditioned style) and the
hint-conditioned teacher has something to say (the directed style).
"""
from __future__ import annotations

import random

from envs.personal.env import MOVE_ON, REASK, STILL_WRONG, SYSTEM_PROMPT
from envs.personal.preferences import KINDS, OPTIONS, Style, directive_text, random_style, render_answer
from envs.personal.questions import warmstart_question

Conversation = list[dict[str, str]]  # assistant messages are the training targets


def _wanted(rng: random.Random) -> Style:
    n = rng.choice((1, 1, 1, 2, 2, 3, 5))
    return {kind: rng.choice(OPTIONS[kind]) for kind in rng.sample(KINDS, n)}


def _directed(q_text: str, wanted: Style, rng: random.Random) -> str:
    sep = rng.choice((" ", "\n", "\n"))
    prefix = rng.choice(("", "", "No. "))
    return q_text + sep + prefix + directive_text(wanted)


def _obey(rng: random.Random, wanted: Style) -> Style:
    return {**random_style(rng), **wanted}


def conversation(rng: random.Random) -> Conversation:
    """One random warm-start conversation."""
    msgs: Conversation = [{"role": "system", "content": SYSTEM_PROMPT}]
    q = warmstart_question(rng)
    kind = rng.random()
    if kind < 0.25:  # plain question, any style
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


def conversations(n: int, seed: int) -> list[Conversation]:
    rng = random.Random(seed)
    return [conversation(rng) for _ in range(n)]
