"""Per-session token history: the heart of token-in/token-out.

A session remembers the messages it has seen and the exact token ids behind
them (prompt ids plus the sampled response ids). When the next request's
messages extend that history, its prompt is the recorded ids plus the ids of
only the new messages, so earlier responses are never re-tokenized. When they
do not (edited or compacted history), the session starts a new segment and the
break is counted.
"""
from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Optional

from clawr1.gateway.chat_template import ChatRenderer
from clawr1.protocol import NextState, TurnRecord


@dataclass
class Session:
    id: str
    segment: int = 0
    turns: int = 0
    messages: list[dict] = field(default_factory=list)  # history as the client will send it back
    token_ids: list[int] = field(default_factory=list)  # exact ids of that history
    pending: Optional[TurnRecord] = None  # the last sampled turn, waiting for what follows it
    last_seen: float = field(default_factory=time.monotonic)


def _same_message(a: dict, b: dict) -> bool:
    return a.get("role") == b.get("role") and (a.get("content") or "") == (b.get("content") or "")


def next_state_from(messages: list[dict]) -> NextState:
    """The new messages after a turn, as the judge sees them (role of the first, all their text)."""
    if not messages:
        return NextState(kind="none")
    role = messages[0].get("role", "user")
    text = "\n".join(str(m.get("content") or "") for m in messages)
    return NextState(kind="tool" if role == "tool" else "user", text=text)


class SessionStore:
    """Bounded session table: least recently used sessions go first, idle ones expire."""

    def __init__(self, renderer: ChatRenderer, max_sessions: int, ttl_s: float):
        self.renderer = renderer
        self.max_sessions = max_sessions
        self.ttl_s = ttl_s
        self.sessions: OrderedDict[str, Session] = OrderedDict()
        self.prefix_breaks = 0

    def get(self, session_id: str) -> Session:
        s = self.sessions.get(session_id)
        if s is None:
            s = self.sessions[session_id] = Session(session_id)
        self.sessions.move_to_end(session_id)
        s.last_seen = time.monotonic()
        return s

    def prompt_for(self, session: Session, messages: list[dict]) -> tuple[list[int], list[dict]]:
        """Prompt ids for `messages`, and the messages that are new since the recorded history."""
        hist = session.messages
        extends = bool(hist) and len(messages) > len(hist) and all(_same_message(a, b) for a, b in zip(hist, messages))
        if extends:
            new = messages[len(hist):]
            return session.token_ids + self.renderer.newline_ids + self.renderer.encode_messages(new), new
        if hist:
            self.prefix_breaks += 1
            session.segment += 1
        return self.renderer.encode_messages(messages), messages[-1:]

    def record(self, session: Session, messages: list[dict], reply: dict, prompt_ids: list[int],
               response_ids: list[int]) -> None:
        """Remember the history the client will send back next time, with its exact ids."""
        ids = prompt_ids + response_ids
        if not response_ids or response_ids[-1] != self.renderer.im_end_id:
            ids = ids + [self.renderer.im_end_id]  # template token closing a truncated reply; never trained
        session.messages = list(messages) + [reply]
        session.token_ids = ids
        session.turns += 1

    def expired(self) -> list[Session]:
        """Remove and return sessions idle past the TTL or beyond the size bound."""
        now = time.monotonic()
        out = []
        while self.sessions:
            sid, s = next(iter(self.sessions.items()))
            if now - s.last_seen > self.ttl_s or len(self.sessions) > self.max_sessions:
                out.append(self.sessions.pop(sid))
            else:
                break
        return out

    def close(self, session_id: str) -> Optional[Session]:
        return self.sessions.pop(session_id, None)
