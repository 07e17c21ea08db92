"""trainer.weight_sync=http: safetensors bytes streamed into a real engine's /update_weights_from_tensor."""
from __future__ import annotations

import httpx
import pytest
import torch
from safetensors.torch import save

from clawr1.engine_api.client import EngineError, SyncEngineClient
from clawr1.trainer.hf_io import load_hf_state
from clawr1.trainer.publish import HttpSink

PROMPT = {"input_ids": [5, 6, 7, 8, 9], "sampling_params": {"max_new_tokens": 4, "temperature": 0.0},
          "return_logprob": True}


def greedy_logprobs(url: str) -> list[float]:
    reply = httpx.post(f"{url}/generate", json=PROMPT, timeout=60).json()
    return [e[0] for e in reply["meta_info"]["output_token_logprobs"]]


def version(url: str) -> str:
    return httpx.get(f"{url}/model_info").json()["weight_version"]


@pytest.fixture
def client(engine):
    c = SyncEngineClient(engine)
    yield c
    c.close()


def test_the_http_sink_streams_every_weight_and_the_version(engine, tiny_model, client):
    state = load_hf_state(tiny_model)
    before = greedy_logprobs(engine)
    changed = {**state, "model.norm.weight": state["model.norm.weight"] * 3}
    assert HttpSink([client]).push(changed, 5) == "http"
    assert version(engine) == "5" and greedy_logprobs(engine) != before
    HttpSink([client]).push(state, 6)
    assert version(engine) == "6"
    # the original weights again, the same kernels on the same shapes: bit for bit
    assert greedy_logprobs(engine) == before
    assert "clawr1_engine_paused 0" in httpx.get(f"{engine}/metrics").text  # continued after each update


def test_a_raw_push_takes_the_version_from_a_header_too(engine, tiny_model):
    norm = load_hf_state(tiny_model)["model.norm.weight"]
    r = httpx.post(f"{engine}/update_weights_from_tensor", content=save({"model.norm.weight": norm}),
                   headers={"Content-Type": "application/octet-stream", "X-Weight-Version": "11"})
    assert r.status_code == 200 and r.json()["success"]
    assert version(engine) == "11"


@pytest.mark.parametrize("body, message", [
    (b"", "the body is empty"),
    (b"not a safetensors file", "the body is not a safetensors file"),
    (save({"model.norm.weight": torch.zeros(3)}), "model.norm.weight: shape (3,) does not fit"),
    (save({"model.nope": torch.zeros(3)}), "unexpected ['model.nope']"),
])
def test_a_bad_raw_push_is_refused_and_changes_nothing(engine, client, body, message):
    was = version(engine)
    r = httpx.post(f"{engine}/update_weights_from_tensor?weight_version=99", content=body,
                   headers={"Content-Type": "application/octet-stream"})
    assert r.status_code == 400 and message in r.json()["message"]
    with pytest.raises(EngineError, match="update_weights_from_tensor"):
        client.update_weights_from_tensor_bytes(body, 99)
    assert version(engine) == was
