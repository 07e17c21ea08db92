"""Per-session token history: the heart of token-in/token-out.

A session remembers the messages it has seen and the exact token ids behind
them (prompt ids plus the sampled response ids), with their text. When the
next request's messages extend that history, its prompt is the recorded ids
plus the ids of only the new messages, so earlier responses are never
re-tokenized (their reasoning blocks and tool-call JSON stay exactly as
sampled, even though clients send back only the parsed message). When they do
not (edited or compacted history, other tools), the session starts a new
segment and the break is counted (`prefix_breaks`).

The new messages' text is the fresh render's suffix after the recorded text.
Where the model's template renders the recorded history otherwise (Qwen3's
drops earlier reasoning; a tool call's JSON re-rendered with other spacing),
the template is not prefix-stable for that turn: `on_template_break` keeps the
sampled ids and appends the new messages as the template renders them after
the reply (`keep_sampled`), or takes the fresh render (`rerender`). Either
way `template_breaks` counts the turn.

A request with n > 1 leaves n candidate continuations; the next request picks
one by the assistant message it sends back.

The store is the only code that changes a session, so its count of the token
ids all sessions hold (the memory bound `max_tokens`) stays exact.
"""
from __future__ import annotations

import json
import os
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import msgspec

from clawr1.chat import ChatRenderer, ChatTemplateError, Prompt
from clawr1.protocol import NextState, TurnRecord, encodable


@dataclass
class Candidate:
    """One sampled reply and the history it ends, waiting for what follows it."""

    messages: list[dict]  # history as the client will send it back, ending with this reply
    token_ids: list[int]  # exact ids of that history
    text: str  # what those ids decode to
    record: TurnRecord
    canonical: list[tuple]  # `canonical` of each message, to compare the next request against


@dataclass
class Session:
    id: str
    segment: int = 0
    turns: int = 0
    tools: Optional[list[dict]] = None
    candidates: list[Candidate] = field(default_factory=list)
    last_seen: float = field(default_factory=time.monotonic)  # its last request's start or reply's end
    busy: int = 0  # requests of this session being answered: it does not expire meanwhile
    counted: int = 0  # the tokens of this session in the store's total (0 once it left the table)

    @property
    def size(self) -> int:
        return sum(len(c.token_ids) for c in self.candidates)

    def pending(self) -> list[TurnRecord]:
        return [c.record for c in self.candidates]


class SavedCandidate(msgspec.Struct):
    messages: list[dict[str, Any]]
    token_ids: list[int]
    record: TurnRecord
    text: str = ""  # saved before the text was kept: decoded from token_ids when loaded


class SavedSession(msgspec.Struct):
    """A session as a stopped gateway leaves it, so a resumed run continues it token-exact."""

    id: str
    segment: int
    turns: int
    tools: Optional[list[dict[str, Any]]]
    candidates: list[SavedCandidate]


def _arguments(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def canonical(message: dict) -> tuple:
    """What must match for a client's message to be the one we recorded (ids and formatting aside)."""
    calls = tuple(
        (c.get("function", c).get("name"), json.dumps(_arguments(c.get("function", c).get("arguments")), sort_keys=True))
        for c in (message.get("tool_calls") or []))
    return message.get("role"), message.get("content") or "", calls


def next_state_from(messages: list[dict]) -> NextState:
    """The new messages after a turn, as the judge sees them (role of the first, all their text)."""
    if not messages:
        return NextState(kind="none")
    role = messages[0].get("role", "user")
    text = "\n".join(str(m.get("content") or "") for m in messages)
    return NextState(kind="tool" if role == "tool" else "user", text=text)


SEGMENTS_PER_START = 1_000_000  # a gateway's sessions start at segment start * this: ids stay unique across restarts


def next_start(path: Path) -> int:
    """How many times a gateway of this run started before (counted in `path`, durably)."""
    starts = int(path.read_text()) if path.exists() else 0
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        f.write(str(starts + 1))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return starts


class SessionStore:
    """Bounded session table: idle sessions expire; beyond max_sessions or max_tokens the least recently
    used go first."""

    def __init__(self, renderer: ChatRenderer, max_sessions: int, ttl_s: float, max_tokens: int = 50_000_000,
                 on_template_break: str = "keep_sampled"):
        self.renderer = renderer
        self.on_template_break = on_template_break
        self.max_sessions = max_sessions
        self.max_tokens = max_tokens
        self.ttl_s = ttl_s
        self.sessions: OrderedDict[str, Session] = OrderedDict()
        self.prefix_breaks = 0  # requests whose history is not an extension of a recorded one
        self.template_breaks = 0  # extensions where the template re-renders the recorded history otherwise
        self.tokens = 0
        self.segment_base = 0  # a new session's first segment (see SEGMENTS_PER_START)
        # the next segment of sessions that left the table, so one that comes back gets fresh turn ids (bounded)
        self.retired: OrderedDict[str, int] = OrderedDict()

    def get(self, session_id: str) -> Session:
        s = self.sessions.get(session_id)
        if s is None:
            segment = self.retired.pop(session_id, self.segment_base)
            s = self.sessions[session_id] = Session(session_id, segment=segment)
        self.sessions.move_to_end(session_id)
        s.last_seen = time.monotonic()
        return s

    def prompt_for(self, session: Session, messages: list[dict], tools: Optional[list[dict]], wanted: list[tuple],
                   template_kwargs: Optional[dict] = None) -> tuple[Prompt, list[tuple[TurnRecord, NextState]]]:
        """The prompt for `messages` (`wanted`: their canonical forms), and each pending turn with what followed it."""
        fresh = self.renderer.render(messages, tools, True, template_kwargs)
        for chosen in session.candidates:
            hist = chosen.canonical
            if session.tools == tools and len(wanted) > len(hist) and wanted[: len(hist)] == hist:
                new = messages[len(hist):]
                outcome = [(c.record, next_state_from(new) if c is chosen else NextState(kind="none"))
                           for c in session.candidates]
                return self._extended(chosen, new, tools, fresh, template_kwargs), outcome
        outcome = [(c.record, next_state_from(messages[-1:]) if i == 0 else NextState(kind="none"))
                   for i, c in enumerate(session.candidates)]
        if session.candidates:
            self.prefix_breaks += 1
            session.segment += 1
        return Prompt(self.renderer.encode(fresh), fresh), outcome

    def _extended(self, chosen: Candidate, new: list[dict], tools: Optional[list[dict]], fresh: str,
                  template_kwargs: Optional[dict]) -> Prompt:
        """The recorded history plus the new messages: exactly the fresh render where the template is
        prefix-stable, else as `on_template_break` says."""
        if fresh.startswith(chosen.text):
            new_text = fresh[len(chosen.text):]
        else:
            self.template_breaks += 1
            if self.on_template_break == "rerender":
                return Prompt(self.renderer.encode(fresh), fresh)
            try:
                new_text = self.renderer.continuation_text(chosen.messages[-1], new, tools, template_kwargs)
            except ChatTemplateError:  # the template renders no reply on its own: the fresh render it is
                return Prompt(self.renderer.encode(fresh), fresh)
        return Prompt(chosen.token_ids + self.renderer.encode(new_text), chosen.text + new_text)

    def record(self, session: Session, messages: list[dict], tools: Optional[list[dict]],
               replies: list[tuple[dict, list[int], TurnRecord]], prompt: Prompt, asked: list[tuple]) -> None:
        """Remember each reply's history, with its exact ids, as a candidate for the next request
        (`asked`: the canonical forms of `messages`)."""
        session.tools = tools
        session.candidates = []
        for reply, response_ids, record in replies:
            ids = prompt.ids + response_ids
            if not response_ids or response_ids[-1] not in self.renderer.end_ids:
                # the template's token closing a truncated reply; never trained
                ids = ids + [self.renderer.turn_end_id]
                response_ids = [*response_ids, self.renderer.turn_end_id]
            text = prompt.text + self.renderer.decode(response_ids)
            session.candidates.append(Candidate(list(messages) + [reply], ids, text, record, asked + [canonical(reply)]))
        self._recount(session)
        self.touch(session)  # its turns wait the TTL from their reply, however long the reply took

    def touch(self, session: Session) -> None:
        session.last_seen = time.monotonic()
        if self.sessions.get(session.id) is session:
            self.sessions.move_to_end(session.id)

    def release(self, session: Session, records: list[TurnRecord]) -> None:
        """Forget these pending turns (they went to the judge) and the history they held."""
        gone = {id(r) for r in records}
        session.candidates = [c for c in session.candidates if id(c.record) not in gone]
        self._recount(session)

    def _recount(self, session: Session) -> None:
        if self.sessions.get(session.id) is session:  # a session that left the table counts for nothing
            self.tokens += session.size - session.counted
            session.counted = session.size

    def expired(self) -> list[Session]:
        """Remove and return sessions idle past the TTL (never one with a request being answered), or beyond the
        session or token bounds, least recently used first."""
        now = time.monotonic()
        out = []
        for sid in list(self.sessions):
            s = self.sessions[sid]
            over = len(self.sessions) > self.max_sessions or self.tokens > self.max_tokens
            if over or (now - s.last_seen > self.ttl_s and not s.busy):
                out.append(self.close(sid))
            elif not s.busy:
                break  # the rest were used more recently
        return out

    def save(self, path: Path) -> int:
        """Write every session with its pending turns to `path` (atomically); returns how many."""
        saved = [SavedSession(s.id, s.segment, s.turns, s.tools,
                              [SavedCandidate(c.messages, c.token_ids, c.record, c.text) for c in s.candidates])
                 for s in self.sessions.values()]
        try:
            data = msgspec.msgpack.encode(saved)
        except (UnicodeEncodeError, OverflowError):  # a client's JSON msgpack cannot hold: saved encodable
            data = msgspec.msgpack.encode(encodable(msgspec.to_builtins(saved)))
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
        return len(saved)

    def load(self, path: Path) -> int:
        """Take back the sessions a stopped gateway saved (the file is consumed); returns how many."""
        saved = msgspec.msgpack.decode(path.read_bytes(), type=list[SavedSession])
        for s in saved:
            session = self.get(s.id)
            session.segment, session.turns, session.tools = s.segment, s.turns, s.tools
            session.candidates = [Candidate(c.messages, c.token_ids, c.text or self.renderer.decode(c.token_ids), c.record,
                                            [canonical(m) for m in c.messages])
                                  for c in s.candidates]
            self._recount(session)
        path.unlink()
        return len(saved)

    def close(self, session_id: str) -> Optional[Session]:
        s = self.sessions.pop(session_id, None)
        if s is not None:
            self.tokens -= s.counted
            s.counted = 0
            self.retired[session_id] = s.segment + 1
            while len(self.retired) > 4 * self.max_sessions:
                self.retired.popitem(last=False)
        return s
