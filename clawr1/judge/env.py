"""The `env` judge: outcome rewards from environments, optionally plus a PRM step score.

An environment reports its outcome through the gateway's complete endpoint, which
arrives as the next state of the session's last turn. With env_reward=all_turns,
the session's earlier turns wait here (bounded) and all get the outcome, as
trajectory-level GRPO expects; with last_turn only the last turn does. A PRM
(the llm judge's majority vote, -1/0/+1) adds prm_coef * vote to every turn.
"""
from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Optional

from clawr1.config import JudgeConfig
from clawr1.judge.llm import LlmJudge
from clawr1.judge.rules import Verdict
from clawr1.protocol import TurnRecord, turn_key


class EnvJudge:
    def __init__(self, cfg: JudgeConfig, prm_url: str = ""):
        self.cfg = cfg
        self.prm = LlmJudge(cfg, prm_url) if cfg.prm_coef else None
        self.held: OrderedDict[str, list[TurnRecord]] = OrderedDict()
        self.dropped_held = 0
        self.evicted: list[TurnRecord] = []  # held turns pushed out by max_held_sessions, for the judge to report

    async def verdicts(self, record: TurnRecord) -> list[tuple[TurnRecord, Verdict]]:
        """The turns that are ready to become samples now, each with its verdict."""
        ns = record.next_state
        is_outcome = ns is not None and ns.kind == "outcome"
        if self.cfg.env_reward == "all_turns" and not is_outcome:
            self._hold(record)
            return []
        ready = self.held.pop(record.session_id, []) + [record] if is_outcome else [record]
        outcome: Optional[float] = ns.reward if is_outcome else None
        prm_scores = await self._prm_scores(ready)
        out = []
        for r, prm in zip(ready, prm_scores):
            score = outcome if (outcome is not None and (r is record or self.cfg.env_reward == "all_turns")) else None
            if prm is not None:
                score = (score or 0.0) + self.cfg.prm_coef * prm
            out.append((r, Verdict(score, reason="outcome" if outcome is not None else "prm")))
        return out

    async def _prm_scores(self, records: list[TurnRecord]) -> list[Optional[float]]:
        """The PRM majority for every turn at once (None without a PRM, a next state, or a decision)."""
        if self.prm is None:
            return [None] * len(records)

        async def one(r: TurnRecord) -> Optional[float]:
            return (await self.prm.verdict(r, with_hints=False)).score if r.next_state is not None else None

        return list(await asyncio.gather(*(one(r) for r in records)))

    def _hold(self, record: TurnRecord) -> None:
        held = self.held.setdefault(record.session_id, [])
        if all(turn_key(r) != turn_key(record) for r in held):  # a resent turn is held once
            held.append(record)
        self.held.move_to_end(record.session_id)
        while len(self.held) > self.cfg.max_held_sessions:
            _, lost = self.held.popitem(last=False)
            self.dropped_held += len(lost)  # counted, and visible in the judge's metrics
            self.evicted += lost

    async def close(self) -> None:
        if self.prm is not None:
            await self.prm.close()
