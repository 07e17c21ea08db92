"""The personal env's simulated users as a black-box program: any OpenAI-compatible endpoint, nothing else.

    python -m envs.personal.client --base-url http://127.0.0.1:8000/v1 [--users 8] [--duration 600]
    python -m envs.personal.client --base-url URL --evaluate 64

It drives an endpoint exactly as an external agent would, with the official
`openai` client: each conversation is a session named by OpenAI's standard
`user` field, and a correction is just the next user message. Nothing in it is
clawr1-specific but the base URL, so a live run (`clawr1 run recipes/live/cpu.yaml`)
learns from it as it would from any user. `--evaluate N` measures the
personalization score on N held-out questions instead; those requests carry
`X-Turn-Type: side`, so a clawr1 gateway never trains on them. The last line
printed is one JSON object.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import sys
import time
from typing import Optional

import openai

from clawr1.environment import AssistantTurn, assistant_turn
from envs.personal.env import PersonalEnv


class OpenAIChat:
    """A ChatClient over any OpenAI-compatible endpoint; a session is the request's `user`."""

    def __init__(self, base_url: str, api_key: str, model: str, max_tokens: int, temperature: float, timeout_s: float):
        self.client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, timeout=timeout_s, max_retries=2)
        self.model, self.max_tokens, self.temperature = model, max_tokens, temperature
        self.histories: dict[str, list[dict]] = {}  # each open session's conversation, for its closing message

    async def chat(self, session_id: str, messages: list[dict], *, tools: Optional[list[dict]] = None,
                   side: bool = False, seed: Optional[int] = None, max_tokens: Optional[int] = None,
                   task_id: str = "", group_id: str = "", user: str = "") -> AssistantTurn:
        extra = {"tools": tools} if tools else {}
        resp = await self.client.chat.completions.create(
            model=self.model, messages=messages, user=session_id, seed=seed, max_tokens=max_tokens or self.max_tokens,
            temperature=self.temperature, extra_headers={"X-Turn-Type": "side"} if side else None, **extra)
        turn = assistant_turn(resp.choices[0])
        if not side:
            self.histories[session_id] = [*messages, turn.message()]
        return turn

    async def complete(self, session_id: str, reward: float, text: str = "") -> None:
        """A black-box user has no outcome channel: it says its last word as a user would, in the chat
        (thanks, or what was still wrong), and leaves; the reply to that is never judged."""
        history = self.histories.pop(session_id, None)
        if history is None:
            return
        last_word = "Thanks, that's all for now." if reward > 0 else f"No. {text}".strip()
        await self.client.chat.completions.create(model=self.model, messages=[*history, {"role": "user", "content": last_word}],
                                                  user=session_id, max_tokens=1, temperature=self.temperature)

    async def close(self) -> None:
        await self.client.close()


async def drive(env: PersonalEnv, chat: OpenAIChat, users: int, duration_s: float, seed: int,
                stop: asyncio.Event) -> dict:
    """`users` simulated users, one session after another each, until `duration_s` or `stop`."""
    counts = {"episodes": 0, "errors": 0, "first_try_ok": 0.0}

    async def user(index: int) -> None:
        rng = random.Random(f"{seed}-user-{index}")
        k = 0
        while not stop.is_set():
            session = f"user{index}-{k}-{rng.getrandbits(32):08x}"
            k += 1
            try:
                result = await env.episode(chat, session, rng)
            except openai.APIError as e:
                counts["errors"] += 1
                print(f"[client] session {session} failed: {e}", file=sys.stderr, flush=True)
                await asyncio.sleep(1.0)
                continue
            counts["episodes"] += 1
            counts["first_try_ok"] += result["first_try_ok"]

    tasks = [asyncio.create_task(user(i)) for i in range(users)]
    try:
        await asyncio.wait_for(stop.wait(), timeout=duration_s if duration_s > 0 else None)
    except asyncio.TimeoutError:
        pass
    stop.set()
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    counts["first_try_ok"] = counts["first_try_ok"] / max(counts["episodes"], 1)
    return counts


def _args(argv: Optional[list[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m envs.personal.client", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", required=True, help="the endpoint's OpenAI base URL, e.g. http://127.0.0.1:8000/v1")
    p.add_argument("--api-key-env", default="CLAWR1_API_KEY", help="environment variable holding the key, if any")
    p.add_argument("--model", default="clawr1-policy")
    p.add_argument("--users", type=int, default=8, help="concurrent simulated users")
    p.add_argument("--duration", type=float, default=0, help="seconds to run (0: until Ctrl-C / SIGTERM)")
    p.add_argument("--profile-seed", type=int, default=0, help="which user: the hidden preferences' seed")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per request")
    p.add_argument("--evaluate", type=int, default=0, metavar="N", help="measure the score on N held-out questions")
    return p.parse_args(argv)


async def _main(args: argparse.Namespace) -> dict:
    env = PersonalEnv({"profile_seed": args.profile_seed}, seed=args.seed)
    chat = OpenAIChat(args.base_url, os.environ.get(args.api_key_env) or "unused-on-loopback", args.model,
                      args.max_tokens, args.temperature, args.timeout)
    try:
        if args.evaluate:
            t0 = time.monotonic()
            result = await env.evaluate(chat, args.evaluate, f"eval-{int(time.time())}")
            return {**result, "eval_s": round(time.monotonic() - t0, 2)}
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        return await drive(env, chat, args.users, args.duration, args.seed, stop)
    finally:
        await chat.close()


def main(argv: Optional[list[str]] = None) -> int:
    args = _args(argv)
    print(json.dumps(asyncio.run(_main(args))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
