"""Weight swaps while requests run, pause/continue, and tensor updates, on a real engine process."""
from __future__ import annotations

import base64
import json
import threading
import time

import httpx

from tests.serving.test_engine_api import prompt_ids


def stream(url: str, body: dict, chunks: list) -> None:
    with httpx.stream("POST", f"{url}/generate", json={**body, "stream": True}, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data:") and line[5:].strip() != "[DONE]":
                chunks.append((time.monotonic(), json.loads(line[5:])))


def long_request(tok, n: int = 120) -> dict:
    return {"input_ids": prompt_ids(tok), "sampling_params": {"max_new_tokens": n, "ignore_eos": True},
            "return_logprob": True}


def test_weight_update_lands_between_decode_steps_of_a_running_stream(engine, tiny_model, tmp_path):
    from transformers import AutoTokenizer

    from clawr1.trainer.hf_io import load_hf_state, write_weights_dir

    tok = AutoTokenizer.from_pretrained(tiny_model)
    path = write_weights_dir(load_hf_state(tiny_model), tmp_path / "v7")
    t, chunks = stream_until(engine, long_request(tok), 10)
    r = httpx.post(f"{engine}/update_weights_from_disk", json={"model_path": str(path), "weight_version": "7"}, timeout=60)
    assert r.status_code == 200 and r.json()["success"]
    t.join()
    final = chunks[-1][1]["meta_info"]
    assert final["finish_reason"] == {"type": "length", "length": 120}
    spans = final["weight_versions"]
    assert [s["version"] for s in spans] == ["0", "7"] and spans[0]["end"] == spans[1]["start"] >= 10
    assert spans[-1]["end"] == 120
    assert len(chunks) == 120  # one chunk per token, cumulative, as SGLang streams


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
    t, running = stream_until(engine, long_request(tok, 60), chunks=5)
    assert httpx.post(f"{engine}/pause_generation", json={"mode": "in_place"}).json()["status"] == "ok"
    held = len(running)
    queued: list = []
    t2 = threading.Thread(target=stream, args=(engine, long_request(tok, 5), queued))
    t2.start()  # a new request while paused is accepted and waits; it is not refused
    time.sleep(0.5)
    assert len(running) <= held + 1 and not queued
    assert httpx.post(f"{engine}/continue_generation").json()["status"] == "ok"
    t.join()
    t2.join()
    assert running[-1][1]["meta_info"]["finish_reason"]["type"] == "length" and len(queued) == 5


def test_pause_abort_finishes_running_requests_with_abort(engine, tiny_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    t, running = stream_until(engine, long_request(tok, 200), chunks=3)
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
