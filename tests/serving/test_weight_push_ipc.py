"""trainer.weight_sync=ipc: buckets shared in place into a real engine's /update_weights_from_ipc, in clawr1's
no-pickle format. On CPU, shared memory stands in for the CUDA IPC handles a GPU trainer shares."""
from __future__ import annotations

import httpx
import pytest
import torch

from clawr1.engine_api import ipc
from clawr1.engine_api.client import EngineError, SyncEngineClient
from clawr1.trainer.hf_io import load_hf_state
from clawr1.trainer.publish import HttpSink, IpcSink
from tests.serving.test_weight_push_http import greedy_logprobs, version


@pytest.fixture
def client(engine):
    c = SyncEngineClient(engine)
    yield c
    c.close()


def test_buckets_keep_the_order_and_their_bound_and_views_read_back_every_value():
    state = {"a": torch.randn(100), "b": torch.randn(3, 7).to(torch.bfloat16), "c": torch.randn(1000),
             "d": torch.arange(5, dtype=torch.float16)}
    names = ipc.buckets_of(state, bucket_bytes=1024)
    assert [n for bucket in names for n in bucket] == list(state)  # in order, each once
    assert names == [["a", "b"], ["c"], ["d"]]  # c (4,000 bytes) is a bucket alone
    buckets = [ipc.pack(state, n, torch.device("cpu")) for n in names]  # alive while the payload is read
    body = ipc.payload(buckets, version=3)
    assert body["format"] == "clawr1-ipc-v1" and {b["kind"] for b in body["buckets"]} == {"cpu_shm"}
    assert all(e["offset"] % ipc.ALIGN == 0 for b in body["buckets"] for e in b["tensors"])
    opened, v = ipc.open_payload(body)
    assert v == 3 and list(opened) == list(state)
    for name, t in state.items():
        assert opened[name].dtype == t.dtype and torch.equal(opened[name], t)


def test_the_ipc_sink_loads_every_weight_and_the_version_as_http_does(engine, tiny_model, client):
    state = load_hf_state(tiny_model)
    changed = {**state, "model.norm.weight": state["model.norm.weight"] * 3}
    before = greedy_logprobs(engine)
    assert IpcSink([client], bucket_bytes=1 << 20).push(changed, 7) == "ipc"  # several buckets
    assert version(engine) == "7"
    by_ipc = greedy_logprobs(engine)
    assert by_ipc != before
    HttpSink([client]).push(changed, 8)
    assert greedy_logprobs(engine) == by_ipc  # the same weights, bit for bit
    IpcSink([client], bucket_bytes=1 << 30).push(state, 9)  # one bucket
    assert version(engine) == "9" and greedy_logprobs(engine) == before  # the original weights: bit for bit
    assert "clawr1_engine_paused 0" in httpx.get(f"{engine}/metrics").text


def _one_bucket(state: dict) -> tuple[dict, torch.Tensor]:
    """A payload and its bucket, which must outlive the request (freed, its shared memory is gone)."""
    flat, entries = ipc.pack(state, list(state), torch.device("cpu"))
    return ipc.payload([(flat, entries)], version=40), flat


def test_a_bad_payload_is_refused_and_changes_nothing(engine, tiny_model, client):
    norm = load_hf_state(tiny_model)["model.norm.weight"]
    was = version(engine)
    unaligned, kept = _one_bucket({"model.norm.weight": norm})
    unaligned["buckets"][0]["tensors"][0]["offset"] = 4
    wrong_shape, kept_too = _one_bucket({"model.norm.weight": torch.zeros(3)})
    freed, flat = _one_bucket({"model.norm.weight": norm})
    del flat
    for body, message in [({"format": "pickle"}, "format must be 'clawr1-ipc-v1'"),
                          (unaligned, "not aligned to 256"),
                          (wrong_shape, "model.norm.weight: shape (3,) does not fit"),
                          (freed, "cannot open its handle")]:
        with pytest.raises(EngineError, match=message.replace("(", r"\(").replace(")", r"\)")):
            client.update_weights_from_ipc(body)
        assert version(engine) == was
