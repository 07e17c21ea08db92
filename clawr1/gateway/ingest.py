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
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import msgspec

from clawr1.gateway.openai_types import TurnFeedback
from clawr1.gateway.sessions import next_state_from
from clawr1.record_log import RecordLog
from clawr1.protocol import NextState


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
