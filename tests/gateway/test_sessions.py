"""The session store owns every change to a session: its token count equals the tokens actually held, always."""
from __future__ import annotations

import random

import pytest
from transformers import AutoTokenizer

from clawr1.gateway.service import Gateway
from clawr1.gateway.sessions import canonical
from clawr1.protocol import TurnRecord
from tests.conftest import make_config

TURNS = 10_000


def held_tokens(gw: Gateway) -> int:
    return sum(len(c.token_ids) for s in gw.sessions.sessions.values() for c in s.candidates)


def one_turn(gw: Gateway, rng: random.Random, sid: str, histories: dict[str, list[dict]]) -> None:
    """A chat turn as the gateway runs it: prompt (emitting what was pending), n sampled replies, recorded."""
    history = histories.get(sid) or [{"role": "system", "content": "be brief"}]
    if rng.random() < 0.05 and len(history) > 2:  # an edited history: a prefix break
        history = history[:1] + [{"role": "user", "content": "start over"}]
    messages = history + [{"role": "user", "content": f"question {rng.randrange(1000)}"}]
    session = gw.sessions.get(sid)
    asked = [canonical(m) for m in messages]
    prompt, outcomes = gw.sessions.prompt_for(session, messages, None, asked)
    gw._emit(session, outcomes)
    replies = []
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        response = [rng.randrange(10, 500) for _ in range(rng.randint(1, 30))]
        record = TurnRecord(session_id=sid, turn_index=session.turns, prompt_ids=prompt.ids, response_ids=response,
                            rollout_logprobs=[-1.0] * len(response), versions=[0] * len(response), messages=messages)
        session.turns += 1
        replies.append(({"role": "assistant", "content": f"answer {len(replies)}"}, response, record))
    gw.sessions.record(session, messages, None, replies, prompt, asked)
    histories[sid] = messages + [replies[0][0]]
    gw._evict()


@pytest.mark.parametrize("max_tokens", [20_000_000, 4000])  # plenty, and a bound that keeps evicting
def test_token_count_equals_the_tokens_held_at_every_step(tiny_model, tmp_path, max_tokens):
    cfg = make_config(tmp_path, f"gateway.max_session_tokens={max_tokens}", "gateway.max_sessions=40")
    gw = Gateway(cfg, AutoTokenizer.from_pretrained(tiny_model), judge_addr=None)
    rng, histories = random.Random(0), {}
    open_counts = []
    for _ in range(TURNS):
        sid = f"s{rng.randrange(60)}"
        op = rng.random()
        session = gw.sessions.sessions.get(sid)
        if op < 0.08 and session is not None and session.pending():
            gw.feedback(sid, None, 1.0, "thanks")
        elif op < 0.12:
            gw.complete(sid, 1.0, "done")
            histories.pop(sid, None)
        else:
            one_turn(gw, rng, sid, histories)
        while not gw.judge_queue.empty():
            gw.judge_queue.get_nowait()
        assert gw.sessions.tokens == held_tokens(gw)
        open_counts.append(len(gw.sessions.sessions))
    assert gw.sessions.tokens <= max_tokens
    # the bound evicts the least recently used sessions, not all of them
    later = open_counts[TURNS // 2:]
    assert min(later) >= 1 and sum(later) / len(later) >= 5
    assert gw.sessions.prefix_breaks > 0


def test_sessions_holding_what_msgpack_cannot_hold_are_still_saved_and_taken_back(tiny_model, tmp_path):
    cfg = make_config(tmp_path)
    gw = Gateway(cfg, AutoTokenizer.from_pretrained(tiny_model), judge_addr=None)
    histories = {"s0": [{"role": "user", "content": "hi", "note": "odd \udc80", "n": 2**70}]}  # a client's JSON
    one_turn(gw, random.Random(0), "s0", histories)
    assert gw.sessions.save(tmp_path / "sessions.bin") == 1  # a stopping gateway must not crash here
    again = Gateway(cfg, AutoTokenizer.from_pretrained(tiny_model), judge_addr=None)
    assert again.sessions.load(tmp_path / "sessions.bin") == 1
    kept = again.sessions.sessions["s0"].candidates[0].messages[0]
    assert kept["note"] == "odd ?" and kept["n"] == str(2**70)


def test_a_turn_longer_than_the_ttl_still_gets_what_its_user_says_next(tiny_model, tmp_path, monkeypatch):
    """A real model on a slow machine answers in more than gateway.session_ttl_s: the session must not expire while
    the reply is written, and the reply waits the TTL from its end for the user's next message."""
    import clawr1.gateway.sessions as sessions

    clock = [0.0]
    monkeypatch.setattr(sessions.time, "monotonic", lambda: clock[0])
    gw = Gateway(make_config(tmp_path, "gateway.session_ttl_s=3"), AutoTokenizer.from_pretrained(tiny_model),
                 judge_addr=None)
    first = [{"role": "user", "content": "What is 2 plus 3?"}]
    session = gw.sessions.get("u")
    session.busy += 1  # as the gateway holds a session while its request is answered
    prompt, _ = gw.sessions.prompt_for(session, first, None, [canonical(m) for m in first])
    clock[0] = 10.0  # the reply took 10 s
    gw._evict()
    assert gw.sessions.sessions.get("u") is session  # not expired while answering
    record = TurnRecord(session_id="u", turn_index=0, prompt_ids=prompt.ids, response_ids=[11, 12],
                        rollout_logprobs=[-1.0, -1.0], versions=[0, 0], messages=first)
    reply = {"role": "assistant", "content": "5"}
    gw.sessions.record(session, first, None, [(reply, [11, 12], record)], prompt, [canonical(m) for m in first])
    session.busy -= 1
    gw._evict()
    clock[0] = 12.0  # the user answers 2 s after the reply
    follow = first + [reply, {"role": "user", "content": "No. Just the number, please."}]
    again = gw.sessions.get("u")
    assert again is session
    _, outcomes = gw.sessions.prompt_for(again, follow, None, [canonical(m) for m in follow])
    assert [(r is record, ns.kind, ns.text) for r, ns in outcomes] == [(True, "user", "No. Just the number, please.")]
