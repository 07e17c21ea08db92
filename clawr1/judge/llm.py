"""The `llm` judge: PRM votes and hints from a language model behind any OpenAI-compatible endpoint
(or SGLang's native /generate), m of each per turn, all at once."""
from __future__ import annotations

import asyncio
import os
from collections import Counter
from typing import Optional

import aiohttp
import orjson

from clawr1.config import JudgeConfig
from clawr1.tinymodel.chatml import render_text
from clawr1.judge.rules import Verdict
from clawr1.judge.votes import (EVAL_SYSTEM, HINT_SYSTEM, Vote, agreement, best_hint, majority, parse_eval, parse_hint,
                                render_context)
from clawr1.protocol import TurnRecord


class LlmJudge:
    def __init__(self, cfg: JudgeConfig, url: str = ""):
        self.url = (url or cfg.llm_url).rstrip("/")
        if not self.url:
            raise ValueError("judge.backend=llm (or env with prm_coef) needs judge.llm_url, or `clawr1 run` to start "
                             "a PRM engine")
        self.cfg = cfg
        self.counts: Counter = Counter()
        self.agreement_sum = 0.0
        self._session: Optional[aiohttp.ClientSession] = None
        key = os.environ.get(cfg.llm_api_key_env, "")
        self._headers = {"Authorization": f"Bearer {key}"} if key else {}

    @property
    def http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600), headers=self._headers)
        return self._session

    async def complete(self, system: str, user: str) -> str:
        """One vote's text; an empty string when the endpoint fails (counted as an abstention)."""
        c = self.cfg
        try:
            if c.llm_api == "openai":
                body = {"model": c.llm_model, "messages": [{"role": "system", "content": system},
                                                           {"role": "user", "content": user}],
                        "temperature": c.vote_temperature, "max_tokens": c.vote_max_tokens}
                async with self.http.post(self.url + "/chat/completions", json=body) as r:
                    if r.status != 200:
                        self.counts["endpoint_errors"] += 1
                        return ""
                    return orjson.loads(await r.read())["choices"][0]["message"]["content"] or ""
            text = render_text([{"role": "system", "content": system}, {"role": "user", "content": user}],
                               add_generation_prompt=True)
            body = {"text": text, "sampling_params": {"temperature": c.vote_temperature, "max_new_tokens": c.vote_max_tokens}}
            async with self.http.post(self.url + "/generate", json=body) as r:
                if r.status != 200:
                    self.counts["endpoint_errors"] += 1
                    return ""
                return orjson.loads(await r.read()).get("text", "")
        except (aiohttp.ClientError, asyncio.TimeoutError, KeyError, IndexError, orjson.JSONDecodeError):
            self.counts["endpoint_errors"] += 1
            return ""

    async def verdict(self, record: TurnRecord, with_hints: bool = True) -> Verdict:
        ns = record.next_state
        if ns is None or ns.kind == "none" or not (ns.text or ns.score is not None or ns.reward is not None):
            return Verdict(None, reason="no next state")
        context = render_context(record.messages, record.response_text, ns.kind, ns.text or f"(score {ns.score})",
                                 self.cfg.last_k_turns)
        m = self.cfg.votes
        texts = await asyncio.gather(*([self.complete(EVAL_SYSTEM, context) for _ in range(m)] +
                                        ([self.complete(HINT_SYSTEM, context) for _ in range(m)] if with_hints else [])))
        evals = [parse_eval(t) for t in texts[:m]]
        hints = [parse_hint(t, self.cfg.min_hint_chars) for t in texts[m:]]
        return self._decide(evals, hints)

    def _decide(self, evals: list[Vote], hints: list[Vote]) -> Verdict:
        decision = majority(evals)
        hint = best_hint(hints)
        self.counts["votes"] += len(evals) + len(hints)
        self.counts["abstentions"] += sum(v.score is None for v in evals + hints)
        self.counts["hint_votes"] += len(hints)
        self.counts["hints_accepted"] += sum(v.score == 1 and bool(v.hint) for v in hints)
        self.counts["decisions"] += decision is not None
        self.agreement_sum += agreement(evals, decision)
        return Verdict(None if decision is None else float(decision), hint=hint[: self.cfg.max_hint_chars],
                       votes=[v.score if v.score is not None else 2 for v in evals], reason="llm votes")

    def report(self) -> dict:
        c = self.counts
        return {"vote_agreement": self.agreement_sum / max(c["decisions"], 1),
                "abstention_rate": c["abstentions"] / max(c["votes"], 1),
                "hint_acceptance_rate": c["hints_accepted"] / max(c["hint_votes"], 1),
                "llm_endpoint_errors": c["endpoint_errors"]}

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
