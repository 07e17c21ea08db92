"""Pre-collected conversations as turns for the judge (black-box offline training).

Every assistant turn of a conversation becomes a turn whose next state is what
followed it: explicit feedback on that turn, else the next message(s), else (for
the last turn) the conversation's outcome reward. A turn with none of these is
skipped. Logs carry no token ids, so this is the one place where training tokens
come from text: the prompt is the chat template rendered up to the turn, the
response its rendered content. The behaviour log-probs are the current policy's
(an engine scores the response), so training on them is imitation weighted by the
judge's reward, not on-policy RL.

Turn ids are derived from content (the session id given, if any, the conversation
up to the turn and the tools), and a durable ledger remembers them, so ingesting
the same file twice adds nothing the second time.
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import msgspec

from clawr1.chat import ChatRenderer, ChatTemplateError
from clawr1.engine_api.client import EngineError
from clawr1.gateway.errors import GatewayError, PromptLimits, engine_errors
from clawr1.gateway.judge_link import JudgeLink
from clawr1.gateway.metrics import Metrics
from clawr1.gateway.openai_types import IngestRequest, TurnFeedback, tool_dicts
from clawr1.gateway.router import EngineRouter
from clawr1.gateway.sessions import next_state_from
from clawr1.record_log import RecordLog
from clawr1.protocol import NextState, TurnRecord

QUEUE_WAIT_S = 30.0  # an ingest request waits this long for room in the judge queue, then gets a 503


class IngestedTurn(msgspec.Struct):
    turn_id: str


@dataclass
class LoggedTurn:
    index: int  # among the conversation's assistant turns
    prompt_messages: list[dict]  # everything before the turn
    reply: dict  # the assistant message
    next_state: Optional[NextState]
    turn_id: str


def content_id(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:24]


def _next_state(messages: list[dict], at: int, feedback: Optional[TurnFeedback],
                reward: Optional[float]) -> Optional[NextState]:
    if feedback is not None and (feedback.score is not None or feedback.text):
        return NextState(kind="feedback", text=feedback.text, score=feedback.score)
    following = []
    for m in messages[at + 1:]:
        if m["role"] == "assistant":
            break
        following.append(m)
    if following:
        return next_state_from(following)
    if at == len(messages) - 1 and reward is not None:
        return NextState(kind="outcome", reward=reward, done=True)
    return None


def logged_turns(messages: list[dict], tools: Optional[list[dict]], session: str, feedback: list[TurnFeedback],
                 reward: Optional[float]) -> list[LoggedTurn]:
    """Each assistant turn of a conversation, with what followed it (None: nothing did)."""
    by_turn = {f.turn: f for f in feedback}
    out = []
    for at, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        index = len(out)
        out.append(LoggedTurn(index, messages[:at], message, _next_state(messages, at, by_turn.get(index), reward),
                              content_id(session, messages[:at + 1], tools)))
    return out


class IngestLedger:
    """The turn ids already ingested into this run, durably (RUN_DIR/gateway/ingested.log)."""

    def __init__(self, run_dir: Path, fsync: bool = True):
        self.log = RecordLog(Path(run_dir) / "gateway" / "ingested.log", IngestedTurn, fsync)
        self.ids = {t.turn_id for t in self.log.replay()}

    def __contains__(self, turn_id: str) -> bool:
        return turn_id in self.ids

    def add(self, turn_ids: list[str]) -> None:
        if turn_ids:
            self.log.append_many([IngestedTurn(t) for t in turn_ids])
            self.ids.update(turn_ids)

    def close(self) -> None:
        self.log.close()


class Ingester:
    """`POST /v1/ingest`: every assistant turn of a logged conversation to the judge, with what followed it."""

    def __init__(self, run_dir: Path, renderer: ChatRenderer, router: EngineRouter, limits: PromptLimits,
                 judge: JudgeLink, metrics: Metrics):
        self.run_dir, self.renderer, self.router, self.limits = run_dir, renderer, router, limits
        self.judge, self.metrics = judge, metrics
        self.ledger: Optional[IngestLedger] = None  # opened on first use (a run that ingests nothing has none)

    async def ingest(self, req: IngestRequest) -> dict:
        """Counts and reasons: {"conversation_id", "session_id", "turns", "ingested", "duplicates", "skipped"}."""
        if self.ledger is None:
            self.ledger = IngestLedger(self.run_dir)
        messages = [m.as_dict() for m in req.messages]
        tools = tool_dicts(req.tools)
        conversation = content_id(req.session_id, messages, tools)
        session = f"ingest-{req.session_id or conversation}"
        turns = logged_turns(messages, tools, session, req.feedback, req.reward)
        out: dict = {"conversation_id": conversation, "session_id": session, "turns": len(turns), "ingested": 0,
                     "duplicates": 0, "skipped": []}
        added = []
        try:
            for turn in turns:
                reason = await self._ingest_turn(turn, session, tools)
                if reason == "":
                    added.append(turn.turn_id)
                elif reason == "duplicate":
                    out["duplicates"] += 1
                else:
                    why, _, detail = reason.partition(": ")
                    out["skipped"].append({"turn": turn.index, "reason": why, "detail": detail})
        finally:  # what was queued stays queued, also when a later turn fails: a retry adds only the rest
            self.ledger.add(added)
            self.metrics.inc("ingested_turns", len(added), help="turns of pre-collected logs sent to the judge")
        out["ingested"] = len(added)
        return out

    def close(self) -> None:
        if self.ledger is not None:
            self.ledger.close()

    async def _ingest_turn(self, turn: LoggedTurn, session: str, tools: Optional[list[dict]]) -> str:
        """Queue one logged turn for the judge; "" when queued, else why not ("duplicate" or a reason to skip)."""
        if turn.turn_id in self.ledger:
            return "duplicate"
        if not turn.prompt_messages:
            return "no prompt before it"
        if turn.next_state is None:
            return "no next state"
        try:
            prompt = self.renderer.encode_messages(turn.prompt_messages, tools=tools)
            response = self.renderer.reply_ids(turn.prompt_messages, turn.reply, tools)
        except ChatTemplateError as e:
            return f"not renderable: {e}"
        if not self.limits.fits(prompt, response):
            return f"over the context limit: {len(prompt)} + {len(response)} tokens"
        with engine_errors():
            try:
                scored = await self.router.call(session, lambda e: e.score(prompt + response,
                                                                           first_scored=len(prompt)))
            except EngineError as e:
                if not 400 <= e.status < 500:
                    raise
                return f"over the context limit: the engine refused it ({str(e)[:200]})"
        now = time.time()
        record = TurnRecord(
            session_id=session, turn_index=turn.index, prompt_ids=prompt, response_ids=response,
            rollout_logprobs=scored.prompt_logprobs, versions=[scored.weight_version] * len(response), temperature=1.0,
            messages=turn.prompt_messages, tools=tools, response_text=str(turn.reply.get("content") or ""),
            finish_reason="stop", next_state=turn.next_state, created_at=now, sent_at=now, ingested=True)
        if not await self.judge.put(record, QUEUE_WAIT_S):  # the outbox sends it later; a retry is a duplicate
            raise GatewayError(503, f"the judge queue stayed full for {QUEUE_WAIT_S:.0f}s; retry later",
                               "judge_busy", code="judge_busy")
        return ""
