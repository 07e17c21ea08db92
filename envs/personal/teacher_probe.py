"""How much the teacher knows: hint uptake and teacher signal quality, per preference kind.

For the current policy on held-out questions:

- *uptake* of a kind: the rate at which responses satisfy the kind's preference with the hint
  (the user's full preferences, as the user words them) in context, minus the rate without it;
- *signal quality* of a kind: the AUC of a response's summed teacher - student log-prob gap, the
  teacher holding one directive (that kind's) in context, as a classifier of responses that satisfy
  the kind against those that violate it (1.0 perfect, 0.5 chance, below 0.5 inverted).

The personal env logs both at every evaluation (`uptake_<kind>`, `auc_<kind>`), and

    python -m envs.personal.teacher_probe --base-url http://127.0.0.1:8000 [--profile-seed 0] [--n 64]

prints the table for a running clawr1 gateway (it scores through its /v1/score).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
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
                wording: Wording = directive_text) -> dict[str, Optional[float]]:
    """Uptake and AUC per kind; `plain_answers` are the policy's answers to `questions` without a hint, which
    is the profile in the user's `wording`."""
    hint = wording(profile)

    async def hinted(i: int, q: str) -> str:
        messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": hinted_message(q, hint)}]
        return (await client.chat(f"{session_prefix}-hinted-{i}", messages, side=True, seed=seed + i)).content

    hinted_answers = await asyncio.gather(*(hinted(i, q) for i, q in enumerate(questions)))
    return {**uptake(plain_answers, hinted_answers, profile, read),
            **await signal_quality(client, questions, plain_answers, profile, read, wording=wording)}


def _main(argv: Optional[list[str]] = None) -> int:
    from clawr1.chat_client import GatewayChat
    from envs.personal.env import PersonalEnv

    p = argparse.ArgumentParser(prog="python -m envs.personal.teacher_probe", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", required=True, help="a clawr1 gateway, e.g. http://127.0.0.1:8000")
    p.add_argument("--profile-seed", type=int, default=0)
    p.add_argument("--n", type=int, default=64, help="held-out questions")
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--reader", default="exact", help="how answers are read: exact (the tiny model) or free_text")
    args = p.parse_args(argv)

    async def go() -> dict:
        env = PersonalEnv({"profile_seed": args.profile_seed, "probe_teacher": True, "reader": args.reader})
        chat = GatewayChat(args.base_url.rstrip("/").removesuffix("/v1"), None, "clawr1-policy", args.max_tokens, 1.0)
        try:
            return await env.evaluate(chat, args.n, "teacher-probe")
        finally:
            await chat.close()

    result = asyncio.run(go())
    kinds = [k.removeprefix("uptake_") for k in result if k.startswith("uptake_")]
    print("| kind | satisfied with the hint | uptake | AUC |\n|---|---|---|---|")
    for k in kinds:
        a = result.get(f"auc_{k}")
        print(f"| {k} | {result[f'hinted_{k}']:.2f} | {result[f'uptake_{k}']:+.2f} | {'-' if a is None else f'{a:.2f}'} |")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(_main())
