"""`clawr1 serve` with serve.backend=tinker, end to end on CPU: the engine API (what the gateway, the judge's teacher
and the trainer's publishing send) in front of Tinker sampling clients, with `clawr1 tinker-serve` on the tiny model
as the Tinker service, checked with clawr1's own engine clients against the unchanged Tinker SDK."""
from __future__ import annotations

import asyncio
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import torch

from clawr1.devtools import LoopProcess
from clawr1.engine_api.client import EngineClient, EngineError, Generation, SyncEngineClient
from tests.conftest import engine_metric, make_config
from tests.numerics import assert_close, forward_depth, logit_magnitude
from tests.tinker_serve_process import tinker_serve

tinker = pytest.importorskip("tinker", reason="needs the Tinker SDK (the `tinker` extra: scripts/setup.sh installs it)")
from tinker import types  # noqa: E402

pytestmark = pytest.mark.slow
KEY = "tml-clawr1-engine-test-7d2b"  # must appear in no log of either process
SDK_ENV = {"TINKER_TELEMETRY": "0"}
PROMPT = [11, 12, 13, 40, 42]
SAMPLING = {"max_new_tokens": 8, "temperature": 1.0, "sampling_seed": 7}


@dataclass
class Stack:
    engine_url: str  # `clawr1 serve` with serve.backend=tinker
    service: "tinker.ServiceClient"  # the test's own SDK client of the same Tinker service
    base: "tinker.SamplingClient"  # the base model, sampled directly
    model_name: str
    root: Path  # every file both processes write


@pytest.fixture(scope="module")
def stack(tiny_model, tmp_path_factory):
    root = tmp_path_factory.mktemp("tinker-engine")
    with tinker_serve(root / "tinker", str(tiny_model), KEY) as url:
        cfg = make_config(root / "run", "serve.backend=tinker", "trainer.backend=tinker", f"tinker.base_url={url}",
                          f"model.path={tiny_model}")
        engine = LoopProcess(cfg, "serve", env={"TINKER_API_KEY": KEY, **SDK_ENV})
        os.environ.update(SDK_ENV)
        service = tinker.ServiceClient(base_url=url, api_key=KEY)
        try:
            engine.wait_http(f"{cfg.engine_url}/health", timeout=180)
            base = service.create_sampling_client(base_model=Path(tiny_model).name).result()
            yield Stack(cfg.engine_url, service, base, Path(tiny_model).name, root)
        finally:
            service.close("success").result(timeout=30)
            engine.stop()


@pytest.fixture
def client(stack):
    c = SyncEngineClient(stack.engine_url)
    yield c
    c.close()


def score(url: str, tokens: list[int], first_scored: int) -> Generation:
    """The judge teacher's call: EngineClient.score (prompt log-probs, no token generated)."""
    async def run() -> Generation:
        c = EngineClient(url)
        try:
            return await c.score(tokens, first_scored)
        finally:
            await c.close()

    return asyncio.run(run())


def stream(url: str, prompt: list[int], params: dict) -> list[Generation]:
    async def run() -> list[Generation]:
        c = EngineClient(url)
        try:
            return [g async for g in c.generate_stream(prompt, params, return_logprob=True)]
        finally:
            await c.close()

    return asyncio.run(run())


def sdk_logprobs(sampler, tokens: list[int]) -> list[float]:
    return sampler.compute_logprobs(types.ModelInput.from_ints(tokens)).result()


def test_generate_returns_what_tinker_sampled_at_version_0(stack, client, tiny_model):
    g = client.generate(PROMPT, SAMPLING, return_logprob=True)
    assert g.output_ids and len(g.logprobs) == len(g.output_ids) and g.finish_reason in ("stop", "length")
    assert g.weight_version == 0 and g.versions == [0] * len(g.output_ids)
    # The same request (prompt, parameters, seed) sent straight through the SDK runs the same operations on the
    # same engine, alone: the same tokens and the same fp32 log-probs, bit for bit (fp32 -> JSON -> float is exact)
    direct = stack.base.sample(types.ModelInput.from_ints(PROMPT), 1, types.SamplingParams(
        max_tokens=8, temperature=1.0, seed=7)).result().sequences[0]
    assert g.output_ids == direct.tokens and g.logprobs == direct.logprobs
    # compute_logprobs of prompt + tokens is another computation of the same log-probs: one prefill of the whole
    # sequence instead of decode steps over the KV cache, i.e. the same fp32 sums in other shapes, each of the
    # forward_depth reductions rounding differently at most once at the logits' scale
    scored = sdk_logprobs(stack.base, PROMPT + g.output_ids)[len(PROMPT):]
    assert_close(torch.tensor(g.logprobs), torch.tensor(scored), torch.float32, forward_depth(tiny_model),
                 logit_magnitude(tiny_model, [PROMPT + g.output_ids]), "sampled vs compute_logprobs")


def test_a_batch_and_text_prompts_answer_as_the_embedded_engine(stack):
    batch = httpx.post(f"{stack.engine_url}/generate", timeout=120, json={
        "input_ids": [PROMPT, PROMPT[:3]], "sampling_params": {"max_new_tokens": 4}, "return_logprob": True}).json()
    assert len(batch) == 2 and all(len(r["meta_info"]["output_token_logprobs"]) == len(r["output_ids"]) for r in batch)
    text = httpx.post(f"{stack.engine_url}/generate", timeout=120,
                      json={"text": "hello there", "sampling_params": {"max_new_tokens": 4}}).json()
    assert isinstance(text["text"], str) and text["meta_info"]["completion_tokens"] == len(text["output_ids"]) > 0


def test_a_streamed_generate_is_one_chunk_with_the_whole_answer(stack, client):
    chunks = stream(stack.engine_url, PROMPT, SAMPLING)
    whole = client.generate(PROMPT, SAMPLING, return_logprob=True)
    assert len(chunks) == 1  # Tinker answers whole: no token-by-token chunks are made up
    final = chunks[0]
    assert final.finish_reason == whole.finish_reason and final.weight_version == 0
    assert (final.output_ids, final.logprobs) == (whole.output_ids, whole.logprobs)  # same seed, same engine


def test_the_teacher_score_is_compute_logprobs_on_the_base_model(stack):
    tokens = PROMPT + [44, 46, 48, 50]
    scored = score(stack.engine_url, tokens, len(PROMPT))
    assert scored.output_ids == [] and len(scored.prompt_logprobs) == 4
    # exact: the engine asks compute_logprobs of these tokens on the same base sampler, one prefill each time
    assert scored.prompt_logprobs == sdk_logprobs(stack.base, tokens)[len(PROMPT):]


def trained_sampler_path(stack: Stack, name: str) -> str:
    """One training step on a LoRA client of the same service, saved for sampling: its tinker:// path."""
    trainer = stack.service.create_lora_training_client(base_model=stack.model_name, rank=8)
    tokens = [11, 12, 13, 40, 42, 44, 46]
    datum = types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [0.0, 0.0, 1.0, 1.0, 1.0, 1.0]})
    trainer.forward_backward([datum], "cross_entropy").result()
    trainer.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    return trainer.save_weights_for_sampler(name).result().path


def test_an_update_switches_new_requests_and_in_flight_ones_finish_on_the_old_weights(stack, client):
    path = trained_sampler_path(stack, "engine-v1")
    tokens = PROMPT + [44, 46, 48, 50]
    before = score(stack.engine_url, tokens, len(PROMPT)).prompt_logprobs
    long_running: dict = {}
    runner = threading.Thread(target=lambda: long_running.update(g=SyncEngineClient(stack.engine_url).generate(
        PROMPT, {"max_new_tokens": 400, "ignore_eos": True}, return_logprob=True)))
    runner.start()
    deadline = time.monotonic() + 30
    while engine_metric(stack.engine_url, "running_requests") < 1 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert engine_metric(stack.engine_url, "running_requests") == 1

    reply = client.update_weights_from_disk(path, 1)  # the trainer's publish: pause, flush, load, continue
    runner.join(120)
    assert reply["success"] and client.weight_version() == 1
    assert long_running["g"].weight_version == 0 and len(long_running["g"].output_ids) == 400  # no error, old weights
    g = client.generate(PROMPT, SAMPLING, return_logprob=True)
    assert g.weight_version == 1 and g.versions == [1] * len(g.output_ids)
    after = score(stack.engine_url, tokens, len(PROMPT)).prompt_logprobs
    assert after != before
    assert after == sdk_logprobs(stack.service.create_sampling_client(model_path=path).result(), tokens)[len(PROMPT):]

    bad = "tinker://no-such-model/sampler_weights/nothing"
    with pytest.raises(EngineError, match="no-such-model"):
        client.update_weights_from_disk(bad, 2)
    assert client.weight_version() == 1
    assert score(stack.engine_url, tokens, len(PROMPT)).prompt_logprobs == after  # still the trained weights
    assert client.model_info()["tinker_model_path"] == path


@pytest.mark.parametrize("call, status, named", [
    (lambda url: httpx.post(f"{url}/load_lora_adapter", json={"lora_name": "a", "lora_path": "/x"}), 400,
     "load_lora_adapter is not supported with serve.backend=tinker"),
    (lambda url: httpx.post(f"{url}/update_weights_from_tensor", content=b"x",
                            headers={"Content-Type": "application/octet-stream"}), 400,
     "update_weights_from_tensor is not supported with serve.backend=tinker"),
    (lambda url: httpx.post(f"{url}/generate", json={"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 2},
                                                     "return_logprob": True, "top_logprobs_num": 2}), 400,
     "top_logprobs_num > 0 is not supported with serve.backend=tinker"),
    (lambda url: httpx.post(f"{url}/generate", json={"input_ids": PROMPT, "image_data": ["x.png"]}), 400,
     "image_data is not supported with serve.backend=tinker"),
])
def test_what_tinker_cannot_do_is_refused_by_name(stack, call, status, named):
    resp = call(stack.engine_url)
    assert resp.status_code == status and named in resp.text


def test_the_key_is_in_no_log_or_file_of_either_process(stack):
    logs = sorted(stack.root.rglob("*.log"))
    assert any(p.name == "serve.log" for p in logs) and any("tinker-serve" in p.name for p in logs)
    written = [p for p in stack.root.rglob("*") if p.is_file() and KEY.encode() in p.read_bytes()]
    assert not written


# ---- the translation alone (no service)

def test_the_embedded_stop_rules_cut_what_tinker_returned():
    from clawr1.serving.engine import SamplingParams
    from clawr1.serving.tinker_client_engine import finish_point

    def decode(ids: list[int]) -> str:
        return "".join(chr(ord("a") + i) for i in ids)

    tokens = [0, 1, 2, 3, 4]  # "abcde"; 2 is an end id
    assert finish_point(tokens, "stop", SamplingParams(max_new_tokens=9), [2], decode).keep == 3
    assert finish_point(tokens, "length", SamplingParams(max_new_tokens=5, ignore_eos=True), [2], decode).reason == \
        {"type": "length", "length": 5}
    cut = finish_point(tokens, "stop", SamplingParams(max_new_tokens=9, stop=["bc"], ignore_eos=True), [2], decode)
    assert (cut.keep, cut.reason, cut.text_cut) == (3, {"type": "stop", "matched": "bc"}, 1)
    by_id = finish_point(tokens, "stop", SamplingParams(max_new_tokens=9, stop_token_ids=[1]), [], decode)
    assert (by_id.keep, by_id.reason) == (2, {"type": "stop", "matched": 1})


def test_a_tinker_call_slower_than_the_timeout_fails_with_504(tiny_model):
    from clawr1.serving.tinker_client_engine import Sampler, TinkerCallError, TinkerEngine

    class NeverDone:  # an SDK future whose answer does not come: result_async(timeout) raises TimeoutError
        async def result_async(self, timeout: float):
            async with asyncio.timeout(timeout):
                await asyncio.Event().wait()

    async def run() -> TinkerCallError:
        engine = TinkerEngine(None, Sampler(None, 0), "m", Path(tiny_model), None, timeout_s=0.05)
        with pytest.raises(TinkerCallError) as caught:
            await engine.call("sample", NeverDone())
        return caught.value

    error = asyncio.run(run())
    assert error.status == 504 and "tinker.request_timeout_s" in str(error)
