"""The gateway with the official `openai` client: OpenAI shapes out, exact sampled tokens to the judge."""
from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest
import zmq

from clawr1 import protocol
from clawr1.protocol import TurnRecord

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}


def receive(judge: zmq.Socket, n: int, timeout_ms: int = 20000) -> list[TurnRecord]:
    out = []
    while len(out) < n:
        assert judge.poll(timeout_ms), f"got {len(out)} of {n} TurnRecords"
        out.append(protocol.decode(judge.recv_multipart()))
    return out


def client(cfg, **kw) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{cfg.gateway_url}/v1", api_key="unused", **kw)


def test_two_turn_session_records_exact_sampled_tokens(stack):
    cfg, judge, renderer = stack
    c = client(cfg)
    headers = {"X-Session-Id": "sess-a"}
    msgs = [SYSTEM, {"role": "user", "content": "What is 3 km plus 4 km?"}]
    r1 = c.chat.completions.create(model="m", messages=msgs, temperature=0, max_tokens=40, extra_headers=headers)
    answer = r1.choices[0].message.content
    assert r1.object == "chat.completion" and r1.usage.completion_tokens > 0
    msgs += [{"role": "assistant", "content": answer}, {"role": "user", "content": "No. Please put the answer in <ans> tags."}]
    r2 = c.chat.completions.create(model="m", messages=msgs, temperature=0, max_tokens=40, extra_headers=headers)
    done = httpx.post(f"{cfg.gateway_url}/v1/sessions/sess-a/complete", json={"reward": 1.0, "text": "ok"})
    assert done.status_code == 200
    first, second = receive(judge, 2)

    assert first.prompt_ids == renderer.encode_messages(msgs[:2])
    assert first.next_state.kind == "user" and first.next_state.text == "No. Please put the answer in <ans> tags."
    # token-in/token-out: the second prompt extends the first prompt and the exact sampled response
    tail = renderer.encode(renderer.continuation_text(msgs[2], msgs[3:]))
    assert second.prompt_ids == first.prompt_ids + first.response_ids + tail
    assert second.next_state.kind == "outcome" and second.next_state.reward == 1.0
    assert renderer.tokenizer.decode(first.response_ids, skip_special_tokens=True) == answer
    assert second.response_text == r2.choices[0].message.content
    # the recorded ids and log-probs are what the engine samples for that prompt
    again = httpx.post(f"{cfg.engine_url}/generate", json={
        "input_ids": first.prompt_ids, "sampling_params": {"max_new_tokens": 40, "temperature": 0},
        "return_logprob": True}).json()
    assert again["output_ids"] == first.response_ids
    # the same request alone on the same engine, greedy: the same kernels in the same order, bit for bit
    assert [e[0] for e in again["meta_info"]["output_token_logprobs"]] == first.rollout_logprobs
    assert first.versions == [0] * len(first.response_ids)
    assert (first.turn_index, second.turn_index, first.segment, second.segment) == (0, 1, 0, 0)


def test_edited_history_starts_a_new_segment_and_counts_a_prefix_break(stack):
    cfg, judge, renderer = stack
    c = client(cfg)
    headers = {"X-Session-Id": "sess-b"}
    before = _metric(cfg, "clawr1_gateway_prefix_breaks_total")
    msgs = [SYSTEM, {"role": "user", "content": "Add 2 g and 5 g."}]
    r1 = c.chat.completions.create(model="m", messages=msgs, max_tokens=20, extra_headers=headers)
    edited = [SYSTEM, {"role": "user", "content": "Add 2 g and 5 g."},
              {"role": "assistant", "content": r1.choices[0].message.content + " (edited)"},
              {"role": "user", "content": "Thanks! Next question: Add 1 m and 1 m."}]
    c.chat.completions.create(model="m", messages=edited, max_tokens=20, extra_headers=headers)
    httpx.post(f"{cfg.gateway_url}/v1/sessions/sess-b/complete", json={"reward": -1.0})
    first, second = receive(judge, 2)
    assert _metric(cfg, "clawr1_gateway_prefix_breaks_total") == before + 1
    assert second.segment == first.segment + 1
    assert second.prompt_ids == renderer.encode_messages(edited)


def test_session_by_url_and_by_user_field_and_async_client(stack):
    cfg, judge, _ = stack
    scoped = openai.OpenAI(base_url=f"{cfg.gateway_url}/s/sess-url/v1", api_key="unused")
    scoped.chat.completions.create(model="m", messages=[{"role": "user", "content": "Add 1 g and 1 g."}], max_tokens=8)

    async def with_async():
        a = openai.AsyncOpenAI(base_url=f"{cfg.gateway_url}/v1", api_key="unused")
        await a.chat.completions.create(model="m", messages=[{"role": "user", "content": "Add 2 g and 2 g."}],
                                        max_tokens=8, user="sess-user")
        await a.close()

    asyncio.run(with_async())
    for sid in ("sess-url", "sess-user"):
        assert httpx.post(f"{cfg.gateway_url}/v1/sessions/{sid}/complete", json={"reward": 0.0}).status_code == 200
    assert {r.session_id for r in receive(judge, 2)} == {"sess-url", "sess-user"}


def test_side_turns_are_never_recorded(stack):
    cfg, judge, _ = stack
    r = client(cfg).chat.completions.create(model="m", messages=[{"role": "user", "content": "Add 3 L and 3 L."}],
                                            max_tokens=8, n=2, extra_headers={"X-Turn-Type": "side"})
    assert len(r.choices) == 2
    assert not judge.poll(1500)


@pytest.mark.parametrize("body", [
    {"model": "m"},
    {"model": "m", "messages": []},
    {"model": "m", "messages": [{"role": "wizard", "content": "hi"}]},
    {"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 9},
    {"model": "m", "messages": "hello"},
    '{"model": "m", "messages": [{"role": "user", "content": "odd \\udc80"}]}',  # valid JSON; not Unicode text
])
def test_invalid_requests_get_openai_shaped_400s(stack, body):
    cfg, _, _ = stack
    raw = body if isinstance(body, str) else json.dumps(body)
    r = httpx.post(f"{cfg.gateway_url}/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["message"]


def test_official_client_raises_bad_request_and_unknown_session_is_404(stack):
    cfg, _, _ = stack
    with pytest.raises(openai.BadRequestError):
        client(cfg).chat.completions.create(model="m", messages=[{"role": "wizard", "content": "hi"}])
    r = httpx.post(f"{cfg.gateway_url}/v1/sessions/nobody/complete", json={"reward": 1})
    assert r.status_code == 404 and r.json()["error"]["code"] == "session_not_found"
    assert httpx.post(f"{cfg.gateway_url}/v1/chat/completions", content=b"{oops").status_code == 400


def _metric(cfg, name: str) -> float:
    for line in httpx.get(f"{cfg.gateway_url}/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise KeyError(name)
