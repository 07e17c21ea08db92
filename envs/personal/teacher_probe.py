"""How much the teacher knows: hint uptake and teacher signal quality, per preference kind.

For the current policy on held-out questions:

- *uptake* of a kind: the rate at which responses satisfy the kind's preference with the hint
  (the user's full preferences, as the user words them) in context, minus the rate without it;
- *signal quality* of a kind: the AUC of a response's summed teacher - student log-prob gap, the
  teacher holding one directive (that kind's) in context, as a classifier of responses that satisfy
  the kind against those that violate it (1.0 perfect, 0.5 chance, below 0.5 inverted).

The personal env logs both at every evaluation (`uptake_<kind>`, `auc_<kind>`), and

    python benchmarks/teacher_probe.py [--base-url http://127.0.0.1:8000] [--profiles 0] [--n 64]

prints the table, for a running clawr1 gateway or one it starts (it scores through the gateway's /v1/score).
"""
from __future__ import annotations

import asyncio
from typing import Any, Callable, Optional, Sequence

from clawr1.algo.advantages import signal_auc
from envs.personal.phrases import SYSTEM_PROMPT
from envs.personal.preferences import Reader, Style, directive_text, parse_style, violations


def auc(scores: Sequence[float], labels: Sequence[bool]) -> Optional[float]:
    """P(score of a positive > score of a negative), ties counting half; None with only one class."""
    return signal_auc(list(scores), [1.0 if y else -1.0 for y in labels])[0]


def uptake(plain: Sequence[str], hinted: Sequence[str], profile: Style,
           read: Reader = parse_style) -> dict[str, float]:
    """Per kind: the satisfied rate with the hint minus the rate without it."""
    def rate(answers: Sequence[str], kind: str) -> float:
        return sum(kind not in violations(a, profile, read) for a in answers) / max(len(answers), 1)
    out = {}
    for kind in profile:
        out[f"hinted_{kind}"] = rate(hinted, kind)
        out[f"uptake_{kind}"] = rate(hinted, kind) - rate(plain, kind)
    return out


def hinted_message(question: str, hint: str) -> str:
    """The user's message with the hint on a new line, as the judge places it for the teacher."""
    return f"{question}\n{hint}"


Wording = Callable[[Style], str]  # how the user words wishes: the hint the teacher gets


async def signal_quality(client: Any, questions: Sequence[str], answers: Sequence[str], profile: Style,
                         read: Reader = parse_style, concurrency: int = 8,
                         wording: Wording = directive_text) -> dict[str, Optional[float]]:
    """Per kind: the AUC of the summed teacher - student gap as a satisfies-the-kind classifier."""
    slots = asyncio.Semaphore(concurrency)

    async def summed(question: str, answer: str, hint: str) -> float:
        messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question}]
        async with slots:
            return sum(await client.score(messages, answer, hint=hint))

    student = await asyncio.gather(*(summed(q, a, "") for q, a in zip(questions, answers)))
    out: dict[str, Optional[float]] = {}
    for kind, option in profile.items():
        hint = wording({kind: option})
        teacher = await asyncio.gather(*(summed(q, a, hint) for q, a in zip(questions, answers)))
        gaps = [t - s for t, s in zip(teacher, student)]
        out[f"auc_{kind}"] = auc(gaps, [kind not in violations(a, profile, read) for a in answers])
    return out


async def probe(client: Any, questions: Sequence[str], plain_answers: Sequence[str], profile: Style,
                session_prefix: str, seed: int, read: Reader = parse_style,
                wording: Wording = directive_text, signal: bool = True) -> dict[str, Optional[float]]:
    """Uptake and (with `signal`) AUC per kind; `plain_answers` are the policy's answers to `questions` without a
    hint, which is the profile in the user's `wording`."""
    hint = wording(profile)

    async def hinted(i: int, q: str) -> str:
        messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": hinted_message(q, hint)}]
        return (await client.chat(f"{session_prefix}-hinted-{i}", messages, side=True, seed=seed + i)).content

    hinted_answers = await asyncio.gather(*(hinted(i, q) for i, q in enumerate(questions)))
    out = uptake(plain_answers, hinted_answers, profile, read)
    if signal:
        out.update(await signal_quality(client, questions, plain_answers, profile, read, wording=wording))
    return out
