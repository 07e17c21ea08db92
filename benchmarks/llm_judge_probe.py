"""Learning IV's third judge (OpenClaw-RL's own: the base model as the `llm` judge) against the simulator's truth,
before any run of its row: can it score the turns and write hints at all, and do they say what the users want?

Plays real sessions of the row's users (envs/personal, the row's env args; an episode is --group-size sessions
of one user at once, every user's episode at once) with
the base model (adapter off: every adapter's state at step 0) through a gateway, as the row's first step does.
Each assistant turn is then judged by the real judge (`clawr1.judge.llm.LlmJudge`, the row's judge config:
`judge.prm=policy`, m evaluation and m hint votes on the serving engine's /generate) from what followed it, read as
the gateway reads it. The truth: whether the answer satisfied every wish its user holds.

Every turn's votes are kept verbatim in the JSON, so any reading of them can be recomputed from it
(`bare_numbers`: how many more evaluation votes a reply that is only "-1", "0" or "1" would add; the judge counts
them as abstentions, as it counts anything without `\\boxed{}`).

    python benchmarks/llm_judge_probe.py [--episodes 1 --group-size 2] [--out docs/benchmarks/learning-iv/llm_judge.json]

Prints one JSON line (the summary); the per-turn file is written beside the learning table.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.learning_iv_rows import DATA, SERVING, row_runs, write_json  # noqa: E402
from clawr1.agent_bench import serving_stack  # noqa: E402
from clawr1.chat_client import GatewayChat  # noqa: E402
from clawr1.config import load_config  # noqa: E402
from clawr1.environment import AssistantTurn  # noqa: E402
from clawr1.gateway.sessions import next_state_from  # noqa: E402
from clawr1.judge.llm import LlmJudge  # noqa: E402
from clawr1.judge.votes import EVAL_SYSTEM, HINT_SYSTEM, parse_eval  # noqa: E402
from clawr1.protocol import NextState, TurnRecord  # noqa: E402
from envs.personal.env import PersonalEnv  # noqa: E402
from envs.personal.preferences import violations  # noqa: E402

ROW = "llm-16"
_BARE = re.compile(r"^\s*([+-]?[01])\s*[.!]?\s*$")


class RecordingChat:
    """The environment's client: answers through the gateway and keeps each turn with what followed it."""

    def __init__(self, chat: GatewayChat):
        self.chat_client = chat
        self.turns: list[dict] = []
        self.open: dict[str, dict] = {}  # session -> its last turn, until what followed it arrives

    async def chat(self, session_id: str, messages: list[dict], **kw) -> AssistantTurn:
        if session_id in self.open:
            self._close(session_id, next_state_from(messages[-1:]))
        turn = await self.chat_client.chat(session_id, messages, **kw)
        self.open[session_id] = {"session": session_id, "user": kw.get("user", ""), "messages": list(messages),
                                 "answer": turn.content}
        return turn

    async def complete(self, session_id: str, reward: float, text: str = "") -> None:
        await self.chat_client.complete(session_id, reward, text)
        self._close(session_id, NextState(kind="outcome", text=text, reward=reward, done=True))

    def _close(self, session_id: str, following: NextState) -> None:
        turn = self.open.pop(session_id)
        turn["next_state"] = {"kind": following.kind, "text": following.text, "reward": following.reward}
        self.turns.append(turn)


class KeepingJudge(LlmJudge):
    """The llm judge, keeping its votes' replies verbatim (one judge per turn, so a turn's replies stay apart)."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.replies: dict[str, list[str]] = {EVAL_SYSTEM: [], HINT_SYSTEM: []}

    async def complete(self, system: str, user: str) -> str:
        reply = await super().complete(system, user)
        self.replies[system].append(reply)  # the votes finish in any order: kept by which they are
        return reply

    def votes(self) -> list[str]:
        """The m evaluation votes' replies, then the m hint votes'."""
        return self.replies[EVAL_SYSTEM] + self.replies[HINT_SYSTEM]


async def play(env: PersonalEnv, gateway_url: str, cfg, episodes: int, seed: int) -> list[dict]:
    """`episodes` episodes of every user (each the row's group of sessions), all users at once; their turns."""
    chat = GatewayChat(gateway_url, None, cfg.model.name, cfg.rollout.max_tokens, cfg.rollout.temperature,
                       timeout_s=cfg.rollout.request_timeout_s)
    recorder = RecordingChat(chat)
    rng = random.Random(seed)
    try:
        for e in range(episodes):
            await asyncio.gather(*(env.episode(recorder, f"probe-e{e}-{i}", random.Random(rng.random()))
                                   for i in range(len(env.profiles))))
    finally:
        await chat.close()
    return recorder.turns


async def judge(turns: list[dict], judge_cfg, engine_url: str, env: PersonalEnv, at_once: int = 4) -> None:
    """Each turn gains the judge's votes (verbatim), decision and hint, and the truth."""
    slots = asyncio.Semaphore(at_once)

    async def one(turn: dict) -> None:
        ns = turn["next_state"]
        record = TurnRecord(session_id=turn["session"], turn_index=0, prompt_ids=[], response_ids=[],
                            rollout_logprobs=[], versions=[], messages=turn["messages"], response_text=turn["answer"],
                            next_state=NextState(kind=ns["kind"], text=ns["text"], reward=ns["reward"]))
        llm = KeepingJudge(judge_cfg, engine_url)
        try:
            async with slots:
                verdict = await llm.verdict(record)
        finally:
            await llm.close()
        turn.update(decision=verdict.score, hint=verdict.hint, votes=llm.votes(),
                    truth=not violations(turn["answer"], env.profiles[turn["user"]], env.read))

    await asyncio.gather(*(one(t) for t in turns))


def summary(turns: list[dict], votes: int) -> dict:
    """Decision and hint rates, the decisions' accuracy against the truth, and what bare numbers would add."""
    decided = [t for t in turns if t["decision"] not in (None, 0.0)]
    hinted = [t for t in turns if t["hint"]]
    evals = [v for t in turns for v in t["votes"][:votes]]
    return {
        "turns": len(turns), "wrong_answers": sum(not t["truth"] for t in turns),
        "decided": len(decided), "decided_rate": round(len(decided) / max(len(turns), 1), 4),
        "accuracy_on_decided": round(sum((t["decision"] > 0) == t["truth"] for t in decided) / len(decided), 4)
        if decided else None,
        "eval_votes": len(evals), "eval_votes_parsed": sum(parse_eval(v).score is not None for v in evals),
        "eval_votes_bare_numbers": sum(parse_eval(v).score is None and bool(_BARE.match(v)) for v in evals),
        "hinted": len(hinted), "hints_on_wrong": sum(not t["truth"] for t in hinted)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--episodes", type=int, default=1, help="episodes per user (each the row's group of sessions)")
    p.add_argument("--group-size", type=int, default=2, help="sessions per episode (the row's: 4)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=DATA / "llm_judge.json")
    args = p.parse_args()
    run = row_runs(ROW)["binary_rl"]
    cfg = load_config(run.recipe, list(run.overrides))
    env = PersonalEnv({**cfg.rollout.env_args, "group_size": args.group_size}, cfg.run.seed)
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp, serving_stack(str(run.recipe), SERVING, Path(tmp)) as gateway_url:
        engine_url = load_config(Path(tmp) / "config.yaml").engine_url
        turns = asyncio.run(play(env, gateway_url, cfg, args.episodes, args.seed))
        played = time.time()
        asyncio.run(judge(turns, cfg.judge, engine_url, env))
    result = {"benchmark": "llm_judge_probe", "row": ROW, "episodes": args.episodes, "group_size": args.group_size,
              "seed": args.seed,
              "votes": cfg.judge.votes, **summary(turns, cfg.judge.votes),
              "play_s": round(played - started, 1), "judge_s": round(time.time() - played, 1)}
    write_json(args.out, {**result, "per_turn": turns})
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
