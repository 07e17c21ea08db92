"""Streaming, tools, LangChain, feedback, n > 1 and token-exact tool sessions through the gateway."""
from __future__ import annotations

import time

import httpx

from envs.personal.preferences import CALCULATOR
from tests.gateway.test_gateway import SYSTEM, _metric, client, receive

TOOLS = [CALCULATOR]
ASK_TOOL = "What is 3 km plus 4 km?\nPlease use the calculator tool before answering."


def test_streaming_is_incremental_and_matches_the_recorded_turn(stack):
    cfg, judge, renderer = stack
    c = client(cfg)
    stream = c.chat.completions.create(model="m", messages=[SYSTEM, {"role": "user", "content": "Add 12 kg and 30 kg."}],
                                       max_tokens=40, temperature=0, stream=True, extra_headers={"X-Session-Id": "st-1"},
                                       stream_options={"include_usage": True})
    arrivals, pieces, finish, usage = [], [], None, None
    for ch in stream:
        if ch.usage:
            usage = ch.usage
        for choice in ch.choices:
            if choice.delta.content:
                pieces.append(choice.delta.content)
                arrivals.append(time.monotonic())
            finish = choice.finish_reason or finish
    assert len(pieces) > 3, pieces  # token by token, not one chunk at the end
    assert arrivals[-1] - arrivals[0] > 0
    assert finish in ("stop", "length") and usage.completion_tokens > 0
    httpx.post(f"{cfg.gateway_url}/v1/sessions/st-1/complete", json={"reward": 1})
    (record,) = receive(judge, 1)
    text = "".join(pieces)
    assert renderer.tokenizer.decode(record.response_ids, skip_special_tokens=True) == text
    assert len(record.response_ids) == usage.completion_tokens == len(record.rollout_logprobs)


def test_tool_call_round_trip_with_the_official_client(stack):
    cfg, judge, renderer = stack
    c = client(cfg)
    headers = {"X-Session-Id": "tools-1"}
    msgs = [SYSTEM, {"role": "user", "content": ASK_TOOL}]
    r1 = c.chat.completions.create(model="m", messages=msgs, tools=TOOLS, temperature=0, max_tokens=60,
                                   extra_headers=headers)
    choice = r1.choices[0]
    assert choice.finish_reason == "tool_calls", choice.message
    call = choice.message.tool_calls[0]
    assert call.function.name == "calculator" and "expression" in call.function.arguments
    msgs += [choice.message.model_dump(exclude_none=True),
             {"role": "tool", "tool_call_id": call.id, "content": "7"}]
    r2 = c.chat.completions.create(model="m", messages=msgs, tools=TOOLS, temperature=0, max_tokens=60,
                                   extra_headers=headers)
    # the tiny model's arithmetic is not the point: after the tool result it answers in plain text
    assert r2.choices[0].finish_reason == "stop" and r2.choices[0].message.content and not r2.choices[0].message.tool_calls
    breaks = _metric(cfg, "clawr1_gateway_prefix_breaks_total")
    httpx.post(f"{cfg.gateway_url}/v1/sessions/tools-1/complete", json={"reward": 1})
    first, second = receive(judge, 2)
    # the tool-call turn trains on its exact sampled ids; the next prompt extends them with the tool result only
    assert first.prompt_ids == renderer.encode_messages(msgs[:2], tools=[t for t in TOOLS])
    assert first.next_state.kind == "tool" and "<tool_response>" not in first.next_state.text
    tail = renderer.encode(renderer.continuation_text(msgs[2], msgs[3:], tools=TOOLS))
    assert second.prompt_ids == first.prompt_ids + first.response_ids + tail
    assert breaks == 0


def test_streaming_tool_calls(stack):
    cfg, _, _ = stack
    stream = client(cfg).chat.completions.create(
        model="m", messages=[SYSTEM, {"role": "user", "content": ASK_TOOL}], tools=TOOLS, temperature=0,
        max_tokens=60, stream=True, extra_headers={"X-Turn-Type": "side"})
    calls, finish, content = [], None, ""
    for ch in stream:
        for choice in ch.choices:
            calls += choice.delta.tool_calls or []
            content += choice.delta.content or ""
            finish = choice.finish_reason or finish
    assert finish == "tool_calls" and calls[0].function.name == "calculator" and "<tool_call>" not in content


def test_langchain_chat_openai_works_unmodified(stack):
    from langchain_core.messages import HumanMessage, SystemMessage, ToolMessage
    from langchain_openai import ChatOpenAI

    cfg, judge, _ = stack
    llm = ChatOpenAI(base_url=f"{cfg.gateway_url}/s/lc-1/v1", api_key="unused", model="m", temperature=0,
                     max_tokens=60)
    history = [SystemMessage(SYSTEM["content"]), HumanMessage(ASK_TOOL)]
    ai = llm.bind_tools([CALCULATOR]).invoke(history)
    assert ai.tool_calls and ai.tool_calls[0]["name"] == "calculator"
    history += [ai, ToolMessage("7", tool_call_id=ai.tool_calls[0]["id"])]
    final = llm.bind_tools([CALCULATOR]).invoke(history)
    assert isinstance(final.content, str) and final.content and not final.tool_calls
    plain = ChatOpenAI(base_url=f"{cfg.gateway_url}/v1", api_key="unused", model="m", max_tokens=20,
                       default_headers={"X-Turn-Type": "side"}).invoke("Add 1 g and 2 g.")
    assert isinstance(plain.content, str)
    httpx.post(f"{cfg.gateway_url}/v1/sessions/lc-1/complete", json={"reward": 1})
    first, second = receive(judge, 2)
    assert second.prompt_ids[: len(first.prompt_ids) + len(first.response_ids)] == first.prompt_ids + first.response_ids


def test_feedback_sends_the_pending_turn_with_its_score(stack):
    cfg, judge, _ = stack
    c = client(cfg)
    c.chat.completions.create(model="m", messages=[{"role": "user", "content": "Add 5 L and 1 L."}], max_tokens=10,
                              extra_headers={"X-Session-Id": "fb-1"})
    r = httpx.post(f"{cfg.gateway_url}/v1/feedback", json={"session_id": "fb-1", "score": -1, "text": "Use tags."})
    assert r.status_code == 200 and r.json()["turn_index"] == 0
    (record,) = receive(judge, 1)
    assert record.next_state.kind == "feedback" and record.next_state.score == -1 and record.next_state.text == "Use tags."
    again = httpx.post(f"{cfg.gateway_url}/v1/feedback", json={"session_id": "fb-1", "turn_index": 0, "score": 1})
    assert again.status_code == 404 and again.json()["error"]["code"] == "turn_not_found"
    assert httpx.post(f"{cfg.gateway_url}/v1/feedback", json={"session_id": "fb-1"}).status_code == 400


def test_n_choices_on_a_main_turn_become_one_group(stack):
    cfg, judge, renderer = stack
    c = client(cfg)
    msgs = [{"role": "user", "content": "Add 8 m and 9 m."}]
    r = c.chat.completions.create(model="m", messages=msgs, n=3, max_tokens=16, seed=5,
                                  extra_headers={"X-Session-Id": "n-1", "X-Task-Id": "add"})
    assert [ch.index for ch in r.choices] == [0, 1, 2]
    picked = r.choices[1].message.content
    c.chat.completions.create(model="m", messages=msgs + [{"role": "assistant", "content": picked},
                                                          {"role": "user", "content": "Thanks!"}],
                              max_tokens=8, extra_headers={"X-Session-Id": "n-1"})
    records = receive(judge, 3)
    assert len({rec.group_id for rec in records}) == 1 and records[0].group_id
    assert {rec.task_id for rec in records} == {"add"}
    followed = [rec for rec in records if rec.next_state.kind == "user"]
    assert len(followed) == 1 and followed[0].response_text == picked and followed[0].next_state.text == "Thanks!"
    assert sorted(rec.turn_index for rec in records) == [0, 1, 2]
    httpx.post(f"{cfg.gateway_url}/v1/sessions/n-1/complete", json={})
    receive(judge, 1)


def test_too_large_body_is_a_413_and_tool_schemas_are_checked(stack):
    cfg, _, _ = stack
    big = {"model": "m", "messages": [{"role": "user", "content": "x" * (cfg.gateway.max_request_bytes + 10)}]}
    r = httpx.post(f"{cfg.gateway_url}/v1/chat/completions", json=big)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    bad_tool = {"type": "function", "function": {"name": "has space", "parameters": {"type": "object"}}}
    r = httpx.post(f"{cfg.gateway_url}/v1/chat/completions",
                   json={"messages": [{"role": "user", "content": "hi"}], "tools": [bad_tool]})
    assert r.status_code == 400 and "name" in r.json()["error"]["message"]
    bad_params = {"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}
    r = httpx.post(f"{cfg.gateway_url}/v1/chat/completions",
                   json={"messages": [{"role": "user", "content": "hi"}], "tools": [bad_params]})
    assert r.status_code == 400 and "object" in r.json()["error"]["message"]


def test_metrics_are_prometheus_text(stack):
    cfg, _, _ = stack
    text = httpx.get(f"{cfg.gateway_url}/metrics").text
    for name in ("clawr1_gateway_requests_total", "clawr1_gateway_prefix_breaks_total", "clawr1_gateway_sessions_open",
                 "clawr1_gateway_judge_queue_depth", "clawr1_gateway_request_seconds_bucket",
                 "clawr1_gateway_completion_tokens_total"):
        assert name in text, name
    assert "# TYPE clawr1_gateway_request_seconds histogram" in text


def test_session_id_header_and_error_shape_of_both_routes(stack):
    """Non-streaming turns are answered ahead of FastAPI, streaming ones by it: both name the session the same way."""
    cfg, _, _ = stack
    url = f"{cfg.gateway_url}/v1/chat/completions"
    ask = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    plain = httpx.post(url, json={**ask, "user": "alice smith"})
    streamed = httpx.post(url, json={**ask, "user": "bob smith", "stream": True})
    anonymous = httpx.post(url, json=ask)
    side = httpx.post(url, json=ask, headers={"X-Turn-Type": "side"})
    assert plain.status_code == streamed.status_code == anonymous.status_code == side.status_code == 200
    assert plain.headers["x-session-id"] == "alice%20smith" and streamed.headers["x-session-id"] == "bob%20smith"
    assert anonymous.headers["x-session-id"].startswith("anon-") and "x-session-id" not in side.headers
    assert plain.headers["content-type"] == "application/json" and plain.json()["object"] == "chat.completion"
    for body in ({**ask, "temperature": 3}, {**ask, "temperature": 3, "stream": True}):
        err = httpx.post(url, json=body).json()["error"]
        assert err["param"] == "temperature" and err["type"] == "invalid_request_error"


def _expected_logprobs(record, renderer) -> list[float]:
    """The recorded (sampled) log-probs of the content tokens: the stop token is not content."""
    stop = renderer.end_ids
    return [lp for t, lp in zip(record.response_ids, record.rollout_logprobs) if t not in stop]


def test_logprobs_in_openai_shape_are_the_sampled_ones(stack):
    cfg, judge, renderer = stack
    c = client(cfg)
    msgs = [SYSTEM, {"role": "user", "content": "Add 5 m and 6 m."}]
    r = c.chat.completions.create(model="m", messages=msgs, max_tokens=20, logprobs=True, top_logprobs=3,
                                  extra_headers={"X-Session-Id": "lp-1"})
    content = r.choices[0].logprobs.content
    assert r.system_fingerprint.startswith("clawr1-v")
    httpx.post(f"{cfg.gateway_url}/v1/sessions/lp-1/complete", json={"reward": 1})
    (record,) = receive(judge, 1)
    assert [e.logprob for e in content] == _expected_logprobs(record, renderer)
    assert b"".join(bytes(e.bytes) for e in content).decode() == r.choices[0].message.content
    for e in content:
        assert len(e.top_logprobs) == 3 and e.top_logprobs[0].logprob >= e.top_logprobs[-1].logprob
        assert e.logprob <= e.top_logprobs[0].logprob + 1e-6  # nothing beats the most likely token
    plain = c.chat.completions.create(model="m", messages=msgs, max_tokens=5, extra_headers={"X-Turn-Type": "side"})
    assert plain.choices[0].logprobs is None  # only when asked


def test_streamed_logprobs_add_up_to_the_turn(stack):
    cfg, judge, renderer = stack
    c = client(cfg)
    stream = c.chat.completions.create(model="m", messages=[SYSTEM, {"role": "user", "content": "Add 1 g and 8 g."}],
                                       max_tokens=24, logprobs=True, stream=True, extra_headers={"X-Session-Id": "lp-2"})
    entries, text, fingerprints = [], "", set()
    for ch in stream:
        fingerprints.add(ch.system_fingerprint)
        for choice in ch.choices:
            text += choice.delta.content or ""
            if choice.logprobs and choice.logprobs.content:
                entries += choice.logprobs.content
    httpx.post(f"{cfg.gateway_url}/v1/sessions/lp-2/complete", json={"reward": 1})
    (record,) = receive(judge, 1)
    assert [e.logprob for e in entries] == _expected_logprobs(record, renderer)
    assert b"".join(bytes(e.bytes) for e in entries).decode() == text
    assert any(f and f.startswith("clawr1-v") for f in fingerprints)


def test_an_image_is_refused_with_a_clear_400_not_dropped(stack):
    import openai
    import pytest

    cfg, _, _ = stack
    parts = [{"type": "text", "text": "What is in this picture?"},
             {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]
    with pytest.raises(openai.BadRequestError) as err:
        client(cfg).chat.completions.create(model="m", messages=[{"role": "user", "content": parts}], max_tokens=4)
    assert "'image_url' is not supported: this policy reads text only" in str(err.value)
    assert err.value.body["param"] == "messages.0.content"




def test_score_gives_the_policys_log_probs_with_and_without_the_hint(stack):
    cfg, _, renderer = stack
    msgs = [SYSTEM, {"role": "user", "content": "Add 5 m and 6 m."}]
    plain = httpx.post(f"{cfg.gateway_url}/v1/score", json={"messages": msgs, "response": "11 meters"}).json()
    hinted = httpx.post(f"{cfg.gateway_url}/v1/score", json={"messages": msgs, "response": "11 meters",
                                                             "hint": "Please write units as symbols like km."}).json()
    n = len(renderer.encode_text("11 meters")) + 1  # and the end-of-message token
    assert plain["tokens"] == hinted["tokens"] == n == len(plain["logprobs"]) == len(hinted["logprobs"])
    assert all(lp <= 0 for lp in plain["logprobs"]) and plain["logprobs"] != hinted["logprobs"]
    bad = httpx.post(f"{cfg.gateway_url}/v1/score", json={"messages": msgs, "response": "x", "temperature": 0})
    assert bad.status_code == 400
