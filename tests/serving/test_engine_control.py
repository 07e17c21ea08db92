"""Weight swaps while requests run, pause/continue/flush, and tensor updates, on a real engine process."""
from __future__ import annotations

import base64
import json
import threading
import time

import httpx
import pytest
import torch

from clawr1.devtools import LoopProcess
from clawr1.engine_api.client import SyncEngineClient
from tests.conftest import make_config
from tests.serving.test_engine_api import prompt_ids


def stream(url: str, body: dict, chunks: list) -> None:
    with httpx.stream("POST", f"{url}/generate", json={**body, "stream": True}, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data:") and line[5:].strip() != "[DONE]":
                chunks.append((time.monotonic(), json.loads(line[5:])))


# A stream is held at a known token by an in-place pause (`hold`) before a step that must land inside it, so no
# test bets that the step is quicker than the stream's remaining decode steps.
def long_request(tok, n: int = 600) -> dict:
    return {"input_ids": prompt_ids(tok), "sampling_params": {"max_new_tokens": n, "ignore_eos": True},
            "return_logprob": True}


def test_weight_update_lands_between_decode_steps_of_a_running_stream(engine, tiny_model, tmp_path):
    from transformers import AutoTokenizer

    from clawr1.trainer.hf_io import load_hf_state, write_weights_dir

    tok = AutoTokenizer.from_pretrained(tiny_model)
    path = write_weights_dir(load_hf_state(tiny_model), tmp_path / "v7")
    before = engine_metric(engine, "generated_tokens_total")
    t, chunks = stream_until(engine, long_request(tok), 10)
    held_at = hold(engine, chunks, before)  # the stream still runs when the update lands, however slow the load is
    r = httpx.post(f"{engine}/update_weights_from_disk", json={"model_path": str(path), "weight_version": "7"}, timeout=60)
    assert r.status_code == 200 and r.json()["success"]
    assert httpx.post(f"{engine}/continue_generation").json()["status"] == "ok"
    t.join()
    final = chunks[-1][1]["meta_info"]
    assert final["finish_reason"] == {"type": "length", "length": 600}
    spans = final["weight_versions"]
    assert [s["version"] for s in spans] == ["0", "7"] and spans[0]["end"] == spans[1]["start"] == held_at >= 10
    assert spans[-1]["end"] == 600
    assert len(chunks) == 600  # one chunk per token, cumulative, as SGLang streams


def engine_metric(url: str, name: str) -> int:
    """One of the engine's /metrics values, e.g. generated_tokens_total (tokens sampled so far)."""
    text = httpx.get(f"{url}/metrics").text
    return int(next(line.split()[1] for line in text.splitlines() if line.startswith(f"clawr1_engine_{name} ")))


def hold(url: str, received: list, before: int) -> int:
    """Pause in place (the running stream keeps its slot and stops at a token boundary), wait until every token
    it sampled before the pause has arrived, and return that count: the stream is held at a known token.
    `before` is the engine's generated_tokens_total before the stream started (no other request runs)."""
    assert httpx.post(f"{url}/pause_generation", json={"mode": "in_place"}).json()["status"] == "ok"
    sampled = engine_metric(url, "generated_tokens_total") - before  # a paused engine samples nothing more
    wait_for(lambda: len(received) >= sampled, f"the {sampled} tokens sampled before the pause")
    assert len(received) == sampled
    return sampled


def wait_for(condition, what: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"waited {timeout_s} s for {what}"
        time.sleep(0.01)


def stream_until(url: str, body: dict, chunks: int) -> tuple[threading.Thread, list]:
    """Stream a request in a thread; return once it has produced `chunks` chunks."""
    received: list = []
    t = threading.Thread(target=stream, args=(url, body, received))
    t.start()
    deadline = time.monotonic() + 120
    while len(received) < chunks:
        assert t.is_alive() and time.monotonic() < deadline, f"the stream stopped after {len(received)} chunks"
        time.sleep(0.01)
    return t, received


def test_pause_in_place_holds_requests_and_continue_finishes_them(engine, tiny_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    before = engine_metric(engine, "generated_tokens_total")
    t, running = stream_until(engine, long_request(tok), chunks=5)
    held = hold(engine, running, before)
    sampled_at_hold = engine_metric(engine, "generated_tokens_total")
    queued: list = []
    t2 = threading.Thread(target=stream, args=(engine, long_request(tok, 5), queued))
    t2.start()  # a new request while paused is accepted and waits; it is not refused
    wait_for(lambda: engine_metric(engine, "waiting_requests") == 1, "the new request to queue")
    sampled_while_paused = engine_metric(engine, "generated_tokens_total") - sampled_at_hold
    assert sampled_while_paused == 0 and len(running) == held < 600 and not queued
    assert httpx.post(f"{engine}/continue_generation").json()["status"] == "ok"
    t.join()
    t2.join()
    assert running[-1][1]["meta_info"]["finish_reason"]["type"] == "length" and len(queued) == 5


def test_pause_abort_finishes_running_requests_with_abort(engine, tiny_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    t, running = stream_until(engine, long_request(tok), chunks=3)
    httpx.post(f"{engine}/pause_generation", json={})
    t.join()
    assert running[-1][1]["meta_info"]["finish_reason"]["type"] == "abort"
    httpx.post(f"{engine}/continue_generation")
    ok = httpx.post(f"{engine}/generate", json={"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2}})
    assert ok.status_code == 200


def test_update_weights_from_tensor(engine, tiny_model):
    from safetensors.torch import save

    from clawr1.trainer.hf_io import load_hf_state

    norm = load_hf_state(tiny_model)["model.norm.weight"]
    blob = base64.b64encode(save({"model.norm.weight": norm.clone()})).decode()
    r = httpx.post(f"{engine}/update_weights_from_tensor",
                   json={"serialized_named_tensors": [blob], "load_format": "safetensors", "weight_version": "9"})
    assert r.status_code == 200 and r.json()["success"]
    assert httpx.get(f"{engine}/get_model_info").json()["weight_version"] == "9"
    bad = httpx.post(f"{engine}/update_weights_from_tensor", json={"serialized_named_tensors": [blob], "load_format": "direct"})
    assert bad.status_code == 400 and "load_format" in bad.json()["message"]
    wrong = base64.b64encode(save({"model.norm.weight": norm[:3].clone()})).decode()
    bad = httpx.post(f"{engine}/update_weights_from_tensor", json={"serialized_named_tensors": [wrong]})
    assert bad.status_code == 400 and "shape" in bad.json()["message"]
    assert httpx.get(f"{engine}/get_model_info").json()["weight_version"] == "9"


# ---------------------------------------------------------------- no cache entry survives a weight change


@pytest.fixture(scope="module")
def perturbed(tiny_model, tmp_path_factory):
    """The tiny model with every weight moved by a few percent: a second weight set, as a full HF directory."""
    from clawr1.trainer.hf_io import load_hf_state, write_weights_dir

    gen = torch.Generator().manual_seed(3)
    state = {k: v + 0.05 * v.float().std().nan_to_num(0.1) * torch.randn(v.shape, generator=gen).to(v.dtype)
             for k, v in load_hf_state(tiny_model).items()}
    return write_weights_dir(state, tmp_path_factory.mktemp("perturbed") / "model", copy_from=tiny_model)


@pytest.fixture(scope="module")
def cold_engine(perturbed, tmp_path_factory):
    """A second engine process that starts on the perturbed weights: what a cold request under them gets."""
    cfg = make_config(tmp_path_factory.mktemp("cold"), f"model.path={perturbed}")
    proc = LoopProcess(cfg, "serve")
    try:
        proc.wait_http(f"{cfg.engine_url}/health")
        yield cfg.engine_url
    finally:
        proc.stop()


@pytest.fixture
def swap(engine, tiny_model, tmp_path):
    """swap(path, version) loads weights as the trainer does (SyncEngineClient); the tiny model is put back after."""
    from clawr1.trainer.hf_io import load_hf_state, write_weights_dir

    client = SyncEngineClient(engine, retry_interval_s=0.05)
    client.update_protocol()  # asked now, so a swap lands quickly
    yield lambda path, version: client.update_weights_from_disk(str(path), version)
    client.update_weights_from_disk(str(write_weights_dir(load_hf_state(tiny_model), tmp_path / "restore")), 0)
    client.close()


def greedy(ids: list[int], n: int) -> dict:
    return {"input_ids": ids, "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True},
            "return_logprob": True, "logprob_start_len": 0}


def generate(url: str, body: dict) -> dict:
    r = httpx.post(f"{url}/generate", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def logprobs(reply: dict, key: str = "output_token_logprobs") -> list:
    return [e[0] for e in reply["meta_info"][key]]


def test_the_embedded_engine_says_what_it_is(engine):
    client = SyncEngineClient(engine)
    try:
        proto = client.update_protocol()
    finally:
        client.close()
    assert (proto.engine, proto.pause_mode, proto.session) == ("clawr1-embedded", "retract", False)
    assert httpx.get(f"{engine}/get_server_info").json()["engine"] == "clawr1-embedded"


def test_after_a_weight_update_a_cached_prompt_gets_exactly_the_logprobs_of_a_cold_request(
        engine, tiny_model, perturbed, cold_engine, swap):
    from transformers import AutoTokenizer

    body = greedy(prompt_ids(AutoTokenizer.from_pretrained(tiny_model)), 12)
    before = generate(engine, body)  # the prompt (and these tokens) went through the engine's cache
    swap(perturbed, 3)
    after, cold = generate(engine, body), generate(cold_engine, body)
    assert after["meta_info"]["weight_version"] == "3" and cold["meta_info"]["weight_version"] == "0"
    assert after["output_ids"] == cold["output_ids"]
    assert logprobs(after) == logprobs(cold)  # exactly: same tokens, same computation
    assert logprobs(after, "input_token_logprobs")[1:] == logprobs(cold, "input_token_logprobs")[1:]
    changed = [abs(a - b) for a, b in zip(logprobs(before, "input_token_logprobs")[1:],
                                          logprobs(after, "input_token_logprobs")[1:])]
    assert max(changed) > 1e-2  # the new weights do differ


def test_a_request_running_across_an_update_continues_exactly_as_a_cold_one(engine, tiny_model, perturbed,
                                                                            cold_engine, swap):
    """Paused with retract, it is recomputed on the new weights: none of its old-weight KV is reused."""
    from transformers import AutoTokenizer

    prompt, n = prompt_ids(AutoTokenizer.from_pretrained(tiny_model)), 800
    body = greedy(prompt, n)
    before = engine_metric(engine, "generated_tokens_total")
    t, chunks = stream_until(engine, body, 10)
    held_at = hold(engine, chunks, before)  # still running when the swap lands; the swap's own pause retracts it
    swap(perturbed, 4)
    t.join()
    final = chunks[-1][1]
    meta = final["meta_info"]
    spans = meta["weight_versions"]
    assert len(spans) == 2 and spans[1] == {"version": "4", "start": spans[0]["end"], "end": n}
    assert meta["finish_reason"] == {"type": "length", "length": n} and meta["num_retractions"] == 1
    k = spans[1]["start"]
    assert k == held_at and 10 <= k < n
    cold = generate(cold_engine, greedy(prompt + final["output_ids"][:k], n - k))
    assert cold["output_ids"] == final["output_ids"][k:]
    assert logprobs(cold) == [e[0] for e in meta["output_token_logprobs"]][k:]


def test_flush_cache_is_refused_while_requests_hold_kv_as_in_sglang(engine, tiny_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    flush = lambda: httpx.get(f"{engine}/flush_cache", timeout=30)  # noqa: E731
    assert flush().status_code == 200  # idle
    before = engine_metric(engine, "generated_tokens_total")
    t, running = stream_until(engine, long_request(tok, 800), chunks=3)
    hold(engine, running, before)  # paused in place, it keeps its KV: refused
    refused = flush()
    assert refused.status_code == 400 and refused.text.startswith("Cache not flushed because there are pending "
                                                                  "requests. #queue-req: 0, #running-req: 1")
    httpx.post(f"{engine}/pause_generation", json={"mode": "retract"})  # back to the queue: accepted while paused
    accepted = flush()
    assert accepted.status_code == 200 and accepted.text.startswith("Cache flushed.")
    httpx.post(f"{engine}/continue_generation")
    stream_until_more(running, 3)
    httpx.post(f"{engine}/pause_generation", json={"mode": "abort"})  # ends it
    t.join()
    assert running[-1][1]["meta_info"]["finish_reason"]["type"] == "abort"
    assert running[-1][1]["meta_info"]["num_retractions"] == 1
    assert flush().status_code == 200
    bad = httpx.post(f"{engine}/pause_generation", json={"mode": "soft"})
    assert bad.status_code == 400 and "pause mode must be" in bad.json()["error"]["message"]
    httpx.post(f"{engine}/continue_generation")


def stream_until_more(received: list, more: int) -> None:
    start, deadline = len(received), time.monotonic() + 60
    while len(received) < start + more:
        assert time.monotonic() < deadline, "the stream did not continue"
        time.sleep(0.01)
