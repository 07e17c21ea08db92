"""The embedded engine through its real HTTP server, checked against a plain transformers forward."""
from __future__ import annotations

import asyncio

import httpx
import pytest
import torch

from clawr1.tinymodel.chatml import IM_END
from tests.numerics import assert_as_exact_as

ENGINE_OVERRIDES = ("serve.max_running_requests=8",)


@pytest.fixture(scope="module")
def hf(tiny_model):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(tiny_model).eval(), AutoTokenizer.from_pretrained(tiny_model)


@pytest.fixture(scope="module")
def hf64(tiny_model):
    """The same model in float64: exact arithmetic, near enough, for "as exact as fp32 allows"."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float64).eval()


def prompt_ids(tok, text="What is 3 km plus 4 km?"):
    from clawr1.chat import ChatRenderer

    return ChatRenderer(tok).encode_messages([{"role": "user", "content": text}])


def hf_logprobs(model, ids: list[int], start: int) -> list[float]:
    """log P(ids[i] | ids[:i]) for i >= start, with a plain full-sequence forward."""
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0], -1)
    return [float(logp[i - 1, ids[i]]) for i in range(start, len(ids))]


def post(url, body):
    return httpx.post(f"{url}/generate", json=body, timeout=60)


def test_greedy_generation_shape_and_exact_logprobs(engine, hf, hf64):
    model, tok = hf
    ids = prompt_ids(tok)
    r = post(engine, {"input_ids": ids, "sampling_params": {"max_new_tokens": 40, "temperature": 0},
                      "return_logprob": True})
    assert r.status_code == 200
    out = r.json()
    meta = out["meta_info"]
    assert meta["completion_tokens"] == len(out["output_ids"]) == len(meta["output_token_logprobs"])
    assert [e[1] for e in meta["output_token_logprobs"]] == out["output_ids"]
    assert all(e[2] is None for e in meta["output_token_logprobs"])
    assert meta["weight_version"] == "0" and meta["weight_versions"] == [{"version": "0", "start": 0, "end": len(out["output_ids"])}]
    eos = tok.convert_tokens_to_ids(IM_END)
    if meta["finish_reason"]["type"] == "stop":  # the stop token is kept in ids and log-probs, cut from text
        assert out["output_ids"][-1] == eos and meta["finish_reason"] == {"type": "stop", "matched": eos}
        assert IM_END not in out["text"]
    got = [e[0] for e in meta["output_token_logprobs"]]
    # the engine decodes with a KV cache: as exact as fp32 allows, against fp64, next to HF's fp32 full forward
    honest, exact = (hf_logprobs(m, ids + out["output_ids"], len(ids)) for m in (model, hf64))
    assert_as_exact_as(got, exact, honest, what="decode log-probs")


def test_prompt_logprobs_follow_sglang_layout(engine, hf, hf64):
    model, tok = hf
    ids = prompt_ids(tok)
    start = 5
    r = post(engine, {"input_ids": ids, "sampling_params": {"max_new_tokens": 0}, "return_logprob": True,
                      "logprob_start_len": start, "top_logprobs_num": 3})
    out = r.json()
    entries = out["meta_info"]["input_token_logprobs"]
    assert len(entries) == len(ids) - start and entries[0] == [None, ids[start], None]
    assert [e[1] for e in entries] == ids[start:]
    # prefill: as exact as fp32 allows, against fp64, next to HF's fp32 forward
    honest, exact = hf_logprobs(model, ids, start + 1), hf_logprobs(hf64, ids, start + 1)
    assert_as_exact_as([e[0] for e in entries[1:]], exact, honest, what="prompt log-probs")
    tops = out["meta_info"]["input_top_logprobs"]
    assert tops[0] is None and len(tops[1]) == 3 and tops[1][0][0] >= tops[1][1][0]
    assert out["output_ids"] == [] and out["meta_info"]["finish_reason"] == {"type": "length", "length": 0}


def test_sampling_seed_makes_sampling_repeatable(engine, hf):
    ids = prompt_ids(hf[1])
    body = lambda seed: {"input_ids": ids, "sampling_params": {"max_new_tokens": 30, "sampling_seed": seed}}  # noqa: E731
    a, b = post(engine, body(7)).json(), post(engine, body(7)).json()
    assert a["output_ids"] == b["output_ids"]
    others = {tuple(post(engine, body(s)).json()["output_ids"]) for s in range(8, 14)}
    assert len(others) > 1


def test_stop_strings_and_max_tokens(engine, hf):
    ids = prompt_ids(hf[1])
    out = post(engine, {"input_ids": ids, "sampling_params": {"max_new_tokens": 3, "ignore_eos": True}}).json()
    assert len(out["output_ids"]) == 3 and out["meta_info"]["finish_reason"] == {"type": "length", "length": 3}
    full = post(engine, {"input_ids": ids, "sampling_params": {"max_new_tokens": 30, "temperature": 0}}).json()["text"]
    stop = full[3:6]
    cut = post(engine, {"input_ids": ids, "sampling_params": {"max_new_tokens": 30, "temperature": 0, "stop": [stop]}}).json()
    assert cut["text"] == full[: full.find(stop)] and cut["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}


@pytest.mark.parametrize("body,message", [
    ({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 2, "seed": 3}}, "unknown sampling_params field"),
    ({"input_ids": []}, "input_ids cannot be empty"),
    ({"input_ids": [1, 10**9]}, "input_ids must be integers"),
    ({"input_ids": [1, 2], "sampling_params": {"top_p": 0}}, "top_p"),
    ({"input_ids": [1, 2], "return_logprob": True, "logprob_start_len": 5}, "higher than the number of input tokens"),
    ({}, "give either text or input_ids"),
])
def test_bad_requests_get_400_with_a_message(engine, body, message):
    r = post(engine, body)
    assert r.status_code == 400 and message in r.json()["error"]["message"]


def test_non_json_body_is_a_400(engine):
    r = httpx.post(f"{engine}/generate", content=b"{not json", timeout=10)
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]


def test_batch_and_concurrent_requests(engine, hf):
    ids = prompt_ids(hf[1])
    batch = post(engine, {"input_ids": [ids, ids[:-3] + ids[-3:]], "sampling_params": {"max_new_tokens": 5, "temperature": 0}})
    assert isinstance(batch.json(), list) and len(batch.json()) == 2
    assert batch.json()[0]["output_ids"] == batch.json()[1]["output_ids"]

    async def many():
        async with httpx.AsyncClient(timeout=60) as c:
            return await asyncio.gather(*(c.post(f"{engine}/generate", json={
                "input_ids": ids, "sampling_params": {"max_new_tokens": 12, "temperature": 0}}) for _ in range(12)))

    replies = asyncio.run(many())
    assert {r.status_code for r in replies} == {200}
    assert len({tuple(r.json()["output_ids"]) for r in replies}) == 1  # batched decode changes nothing


def test_update_weights_from_disk_bumps_the_version_and_changes_outputs(engine, hf, tmp_path, tiny_model):
    from clawr1.trainer.hf_io import load_hf_state, write_weights_dir

    model, tok = hf
    ids = prompt_ids(tok)
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 0}, "return_logprob": True, "logprob_start_len": 1}
    before = [e[0] for e in post(engine, body).json()["meta_info"]["input_token_logprobs"][1:]]
    state = load_hf_state(tiny_model)
    state["model.norm.weight"] = state["model.norm.weight"] * 1.5
    path = write_weights_dir(state, tmp_path / "v5")
    r = httpx.post(f"{engine}/update_weights_from_disk", json={"model_path": str(path), "weight_version": "5"}, timeout=60)
    assert r.status_code == 200 and r.json()["success"] is True
    assert httpx.get(f"{engine}/get_model_info").json()["weight_version"] == "5"
    after = post(engine, body).json()
    assert after["meta_info"]["weight_version"] == "5"
    assert max(abs(a - e[0]) for a, e in zip(before, after["meta_info"]["input_token_logprobs"][1:])) > 1e-3
    bad = httpx.post(f"{engine}/update_weights_from_disk", json={"model_path": str(tmp_path / "nothing")}, timeout=60)
    assert bad.status_code == 400 and bad.json()["success"] is False
    assert httpx.get(f"{engine}/get_model_info").json()["weight_version"] == "5"
    # put the original weights back for the other tests of this module
    restore = write_weights_dir(load_hf_state(tiny_model), tmp_path / "v0")
    httpx.post(f"{engine}/update_weights_from_disk", json={"model_path": str(restore), "weight_version": "0"}, timeout=60)
