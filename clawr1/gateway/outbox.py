"""The gateway's outbox: every main turn it serves is durable until the judge says it is done with it.

One record log, RUN_DIR/gateway/outbox.log, holds three kinds of entries:

- the TurnRecord, written when the turn is served (before its reply leaves the gateway);
- an OutboxNextState, when what followed the turn arrives and the turn is queued for the judge;
- a TurnAck, when the judge reports the turn done: its Sample acknowledged by the pool ("sample"), or
  dropped with a reason (no_signal, refused, error...).

Writes go to the file at once (a killed gateway loses nothing the kernel has) and are fsynced as a group
every `SYNC_EVERY_S`. A restarted gateway replays the log: turns with a next state and no ack are sent to
the judge again, and turns whose session died with the old gateway get the next state "none". The pool's
idempotent sample ids make every resend harmless. When acknowledged entries make up most of the log, it is
rewritten with only the open turns and the running totals (an `OutboxTotals` entry), so disk stays bounded.
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

import msgspec

from clawr1.protocol import NextState, OutboxNextState, TurnAck, TurnRecord, make_encodable, turn_key
from clawr1.record_log import RecordLog

SYNC_EVERY_S = 0.05
REWRITE_AFTER = 4096  # acknowledged turns since the last rewrite before the log is rewritten (gateway.outbox_rewrite_after)


class OutboxTotals(msgspec.Struct, tag=True, kw_only=True):
    """Written first in a rewritten log: what the entries it dropped had counted."""

    served: int
    acked: dict[str, int]


Entry = Union[TurnRecord, OutboxNextState, TurnAck, OutboxTotals]


@dataclass
class OpenTurn:
    record: TurnRecord
    sent_at: float = 0.0  # monotonic time it last went to the judge; 0: not yet


class Outbox:
    def __init__(self, path: Path, rewrite_after: int = REWRITE_AFTER):
        self.path = Path(path)
        self.rewrite_after = rewrite_after
        self.served = 0  # main turns logged, since the run began
        self.acked: Counter = Counter()  # by reason
        self.open: dict[str, OpenTurn] = {}  # served, not yet acknowledged
        self._acked_since_rewrite = 0
        self._dirty = False
        self._last_sync = time.monotonic()
        self.log = RecordLog(self.path, Entry, fsync=False)
        for entry in self.log.replay():
            self._apply(entry)

    # ------------------------------------------------------------ state
    def _apply(self, entry: Entry) -> None:
        if isinstance(entry, TurnRecord):
            self.served += 1
            self.open[turn_key(entry)] = OpenTurn(entry)
        elif isinstance(entry, OutboxNextState):
            turn = self.open.get(entry.key)
            if turn is not None:
                turn.record.next_state, turn.record.sent_at = entry.next_state, entry.sent_at
        elif isinstance(entry, TurnAck):
            for key in entry.keys:
                if self.open.pop(key, None) is not None:
                    self.acked[entry.reason] += 1
                    self._acked_since_rewrite += 1
        else:
            self.served, self.acked = entry.served, Counter(entry.acked)

    def _write(self, entry: Entry, record: Optional[TurnRecord] = None) -> None:
        """Append `entry`; when it fails to encode, `record` (a client's JSON: the turn it is about) is made
        encodable in place, for the judge too, and it is written again."""
        try:
            self.log.append(entry)
        except (UnicodeEncodeError, OverflowError):
            if record is None:
                raise
            make_encodable(record)
            self.log.append(entry)
        self._dirty = True

    # ------------------------------------------------------------ the gateway's side
    def served_turn(self, record: TurnRecord) -> None:
        """A main turn was served: log it (its next state comes later)."""
        self._write(record, record)
        self._apply(record)

    def next_state(self, record: TurnRecord) -> None:
        """The turn's next state arrived (already set on `record`): log it; the turn is now due for the judge."""
        if turn_key(record) not in self.open:  # served before this outbox existed (resumed from sessions.bin), or
            self.served_turn(record)            # ingested: logged now, with its next state
        entry = OutboxNextState(key=turn_key(record), next_state=record.next_state, sent_at=record.sent_at)
        self._write(entry, record)  # the next state is a client's text too
        self._apply(entry)

    def mark_sent(self, record: TurnRecord) -> None:
        turn = self.open.get(turn_key(record))
        if turn is not None:
            turn.sent_at = time.monotonic()

    def ack(self, ack: TurnAck) -> None:
        self._write(ack)
        self._apply(ack)
        if self._acked_since_rewrite >= self.rewrite_after and self._acked_since_rewrite > 2 * len(self.open):
            self.rewrite()

    def due(self, resend_after_s: float, now: Optional[float] = None) -> list[TurnRecord]:
        """Turns with a next state that went to the judge over `resend_after_s` ago, or never, unacknowledged."""
        now = time.monotonic() if now is None else now
        return [t.record for t in self.open.values()
                if t.record.next_state is not None and (t.sent_at == 0.0 or now - t.sent_at >= resend_after_s)]

    def orphans(self, live_keys: set[str]) -> list[TurnRecord]:
        """Open turns still waiting for a next state that no session holds any more (their gateway died): they
        get the next state "none", which the judge drops as no signal, so the ledger still closes."""
        out = []
        for key, turn in list(self.open.items()):
            if turn.record.next_state is None and key not in live_keys:
                turn.record.next_state, turn.record.sent_at = NextState(kind="none"), time.time()
                self.next_state(turn.record)
                out.append(turn.record)
        return out

    # ------------------------------------------------------------ durability and size
    def sync(self) -> None:
        """fsync what was written since the last sync (group commit); cheap when nothing was."""
        if self._dirty:
            self.log.sync()
            self._dirty = False
        self._last_sync = time.monotonic()

    def rewrite(self) -> None:
        """Replace the log by the running totals and the open turns (atomically)."""
        entries: list[Entry] = [OutboxTotals(served=self.served - len(self.open), acked=dict(self.acked))]
        for key, turn in self.open.items():
            entries.append(turn.record)
            if turn.record.next_state is not None:
                entries.append(OutboxNextState(key=key, next_state=turn.record.next_state, sent_at=turn.record.sent_at))
        self.log.rewrite(entries)
        self._acked_since_rewrite = 0
        self._dirty = False

    def counts(self) -> dict[str, int]:
        """The ledger: served = acknowledged (by reason) + open."""
        return {"outbox_served": self.served, "outbox_open": len(self.open),
                **{f"outbox_acked_{reason}": n for reason, n in sorted(self.acked.items())}}

    def close(self) -> None:
        self.sync()
        self.log.close()

