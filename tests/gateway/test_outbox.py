"""The gateway outbox: served turns stay durable until acknowledged, across restarts and rewrites."""
from __future__ import annotations

import os

from clawr1.gateway.outbox import Outbox
from clawr1.protocol import NextState, TurnAck, TurnRecord, turn_key


def turn(session: str, index: int, text: str = "hi") -> TurnRecord:
    return TurnRecord(session_id=session, turn_index=index, prompt_ids=[1, 2, 3], response_ids=[4, 5],
                      rollout_logprobs=[-0.1, -0.2], versions=[0, 0], messages=[{"role": "user", "content": text}])


def answered(record: TurnRecord, text: str = "thanks") -> TurnRecord:
    record.next_state, record.sent_at = NextState(kind="user", text=text), 1.0
    return record


def test_a_reopened_outbox_has_every_unacknowledged_turn_and_the_ledger(tmp_path):
    box = Outbox(tmp_path / "outbox.log")
    a, b, c = turn("s", 0), turn("s", 1), turn("t", 0)
    for r in (a, b, c):
        box.served_turn(r)
    box.next_state(answered(a))
    box.next_state(answered(b))
    box.ack(TurnAck(keys=[turn_key(a)], reason="sample"))
    box.close()  # or killed: every write is in the file at once

    again = Outbox(tmp_path / "outbox.log")
    assert again.counts() == {"outbox_served": 3, "outbox_open": 2, "outbox_acked_sample": 1}
    assert [turn_key(r) for r in again.due(0.0)] == [turn_key(b)]  # c has no next state yet
    assert again.due(0.0)[0].next_state.text == "thanks"
    orphans = again.orphans(live_keys=set())  # c's session died with the old gateway
    assert [turn_key(r) for r in orphans] == [turn_key(c)] and orphans[0].next_state.kind == "none"
    again.ack(TurnAck(keys=[turn_key(b)], reason="sample"))
    again.ack(TurnAck(keys=[turn_key(c), "never/0/9"], reason="no_signal"))  # an unknown key counts for nothing
    assert again.counts() == {"outbox_served": 3, "outbox_open": 0, "outbox_acked_no_signal": 1,
                              "outbox_acked_sample": 2}


def test_a_turn_sent_recently_is_not_due_until_the_resend_interval(tmp_path):
    box = Outbox(tmp_path / "outbox.log")
    r = answered(turn("s", 0))
    box.served_turn(r)
    box.next_state(r)
    box.mark_sent(r)
    sent = box.open[turn_key(r)].sent_at
    assert box.due(60.0, now=sent + 59) == [] and box.due(60.0, now=sent + 61) == [r]


def test_the_log_is_rewritten_once_acknowledged_turns_dominate(tmp_path):
    path = tmp_path / "outbox.log"
    box = Outbox(path, rewrite_after=50)
    one_turn = 0
    for i in range(200):
        r = answered(turn("s", i, text="x" * 200))
        box.served_turn(r)
        box.next_state(r)
        if i != 7:
            box.ack(TurnAck(keys=[turn_key(r)], reason="sample"))
        one_turn = one_turn or path.stat().st_size
    # at most a rewrite period's entries (and the one open turn), not 200 turns'
    assert path.stat().st_size <= (50 + 2) * one_turn < 200 * one_turn / 3
    box.close()
    again = Outbox(path)
    assert again.counts() == {"outbox_served": 200, "outbox_open": 1, "outbox_acked_sample": 199}
    assert [r.turn_index for r in again.due(0.0)] == [7]
    assert not (tmp_path / "outbox.log.rewrite").exists() and os.listdir(tmp_path) == ["outbox.log"]


def test_what_msgpack_cannot_hold_is_made_encodable_not_a_server_error(tmp_path):
    box = Outbox(tmp_path / "outbox.log")
    r = turn("s\udc80", 0, text="a\ud800b")  # lone surrogates: valid JSON escapes, not Unicode
    r.messages[0]["n"] = 2**70  # a JSON integer beyond 64 bits
    box.served_turn(r)
    assert (r.session_id, r.messages[0]) == ("s?", {"role": "user", "content": "a?b", "n": str(2**70)})
    r.next_state, r.sent_at = NextState(kind="user", text="no\ud801"), 1.0
    box.next_state(r)  # the judge gets the same, encodable record
    assert r.next_state.text == "no?"
    box.close()
    again = Outbox(tmp_path / "outbox.log").open[turn_key(r)].record
    assert again.messages[0]["content"] == "a?b" and again.next_state.text == "no?"
