"""Every SGLang endpoint clawr1 calls, on a live SGLang 0.5.23 server on CPU (`clawr1 serve`, serve.backend=sglang),
through clawr1's own clients: generation with log-probs and tops, prompt scoring, streaming, model and server info,
weight updates from disk (during a generation, and refused), pause with abort, flush, continue, and LoRA adapters
(load from disk and from tensors, unload, a missing one)."""
from __future__ import annotations

import asyncio
import shutil
import threading
import time

import pytest
import torch
from safetensors.torch import load_file, save_file

from clawr1.engine_api.client import EngineClient, EngineError, Generation, SyncEngineClient
from clawr1.engine_api.lora import adapter_name
from tests.numerics import assert_close, forward_depth, logit_magnitude
from tests.serving.test_lora_serving import peft_logprobs, random_peft_adapter

pytestmark = pytest.mark.slow
PROMPT = [1, 17, 42, 99, 7, 230, 11, 5, 64]
# A generation long enough that a pause or update sent at its first tokens lands inside it on any CPU (seconds of
# decoding, against milliseconds for the call): the tiny model's whole context of 1,024 less the prompt.
LONG = 1000


def run(coro):
    return asyncio.run(coro)


async def _call(url: str, method: str, *args, **kw) -> Generation:
    """One EngineClient call (generate or score) on its own client."""
    client = EngineClient(url)
    try:
        return await getattr(client, method)(*args, **kw)
    finally:
        await client.close()


def generate(url: str, ids: list[int], params: dict, **kw) -> Generation:
    return run(_call(url, "generate", ids, params, **kw))


async def _stream(url: str, ids: list[int], params: dict, on_chunk=None) -> list[Generation]:
    client = EngineClient(url)
    chunks = []
    try:
        async for chunk in client.generate_stream(ids, params):
            chunks.append(chunk)
            if on_chunk is not None:
                on_chunk(chunk)
    finally:
        await client.close()
    return chunks


def scored(url: str, ids: list[int] = PROMPT, **kw) -> list[float]:
    return run(_call(url, "score", ids, 1, **kw)).prompt_logprobs


def bound(tiny_model, sequences: list[list[int]]) -> tuple[int, float]:
    """The error model of one forward against another (tests/numerics.py): depth and the logits' scale."""
    return forward_depth(tiny_model) + 1, logit_magnitude(tiny_model, sequences)


@pytest.fixture
def client(sglang_engine):
    c = SyncEngineClient(sglang_engine[0], timeout_s=120)
    yield c
    c.close()


def test_sampled_log_probs_equal_the_trainers_and_the_scored_ones(sglang_engine, tiny_model, megatron_tp1):
    from clawr1.trainer.model import build_policy, pack, packed_logprobs

    url = sglang_engine[0]
    prompts, gens = [PROMPT, PROMPT[:5], [3, 1, 4, 1, 5, 9, 2, 6]], []
    for seed, prompt in enumerate(prompts):
        gens.append(generate(url, prompt, {"max_new_tokens": 24, "sampling_seed": seed, "ignore_eos": True},
                             top_logprobs_num=3))
    sequences = [p + g.output_ids for p, g in zip(prompts, gens)]
    sampled = [lp for g in gens for lp in g.logprobs]
    trainer = packed_logprobs(build_policy(tiny_model), pack(sequences, [len(p) for p in prompts])).tolist()
    depth, scale = bound(tiny_model, sequences)
    assert len(sampled) == len(trainer) == 72
    assert_close(sampled, trainer, torch.float32, depth, scale, "SGLang's sampled log-probs vs the trainer's")
    # the same tokens scored as a prompt (one prefill, not decode steps)
    rescored = [lp for p, g in zip(prompts, gens) for lp in run(_call(url, "score", p + g.output_ids, len(p))).prompt_logprobs]
    assert_close(rescored, sampled, torch.float32, depth, scale, "scored vs sampled")
    for g in gens:  # three tops a token, best first, the best at least the sampled token's
        assert all(len(ids) == 3 and len(lps) == 3 for ids, lps in zip(g.top_ids, g.top_logprobs))
        assert all(lps == sorted(lps, reverse=True) for lps in g.top_logprobs)
        assert all(lps[0] >= lp - scale * depth * torch.finfo(torch.float32).eps
                   for lps, lp in zip(g.top_logprobs, g.logprobs))


def test_a_stream_grows_by_prefixes_to_the_plain_greedy_reply(sglang_engine):
    url = sglang_engine[0]
    params = {"max_new_tokens": 16, "temperature": 0.0, "ignore_eos": True}
    plain = generate(url, PROMPT, params)
    chunks = run(_stream(url, PROMPT, params))
    assert len(chunks) > 1
    for a, b in zip(chunks, chunks[1:]):
        assert b.output_ids[:len(a.output_ids)] == a.output_ids  # cumulative: each chunk extends the last
    assert chunks[-1].output_ids == plain.output_ids and chunks[-1].finish_reason == "length"


def test_model_and_server_info_name_the_release_and_its_update_protocol(sglang_engine, client):
    url = sglang_engine[0]
    info = client.model_info()
    assert info["model_type"] == "qwen2" and "weight_version" in info
    proto = client.update_protocol()
    assert (proto.engine, proto.pause_mode, proto.session) == ("sglang 0.5.23", "retract", True)
    for path in ("/server_info", "/get_server_info"):
        assert client.http.get(path).json()["version"] == "0.5.23", path
    assert generate(url, PROMPT, {"max_new_tokens": 1}).weight_version == client.weight_version()


def halved_norm_checkpoint(tiny_model, out_dir):
    """The tiny model with its final norm's weight halved: the same shapes, other log-probs."""
    shutil.copytree(tiny_model, out_dir)
    tensors = load_file(str(out_dir / "model.safetensors"))
    tensors["model.norm.weight"] = tensors["model.norm.weight"] * 0.5
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    return out_dir


def test_a_disk_update_changes_the_weights_and_the_old_ones_come_back_exactly(sglang_engine, client, tiny_model,
                                                                              tmp_path):
    url = sglang_engine[0]
    before, version = scored(url), client.weight_version()
    client.update_weights_from_disk(str(halved_norm_checkpoint(tiny_model, tmp_path / "halved")), version + 1)
    assert client.weight_version() == version + 1
    changed = scored(url)
    assert max(abs(a - b) for a, b in zip(changed, before)) > 0.1
    client.update_weights_from_disk(str(tiny_model), version + 2)
    assert client.weight_version() == version + 2
    assert scored(url) == before  # the same weights, kernels and shapes: bit for bit


def test_a_bad_weights_path_is_refused_and_the_old_weights_keep_serving(sglang_engine, client, tmp_path):
    url = sglang_engine[0]
    before, version = scored(url), client.weight_version()
    with pytest.raises(EngineError) as refused:
        client.update_weights_from_disk(str(tmp_path / "no-such-checkpoint"), version + 1)
    assert refused.value.status == 400 and "no-such-checkpoint" in str(refused.value)
    assert client.weight_version() == version
    assert scored(url) == before  # not paused, not changed


def test_an_update_during_a_generation_retracts_it_onto_the_new_weights(sglang_engine, client, tiny_model):
    url, version = sglang_engine[0], client.weight_version()
    started = threading.Event()
    result: list = []

    def generate():
        result.append(run(_stream(url, PROMPT, {"max_new_tokens": LONG, "ignore_eos": True},
                                  on_chunk=lambda c: len(c.output_ids) >= 8 and started.set())))

    worker = threading.Thread(target=generate)
    worker.start()
    assert started.wait(120)
    client.update_weights_from_disk(str(tiny_model), version + 1)
    worker.join(300)
    final = result[0][-1]
    assert final.finish_reason == "length" and len(final.output_ids) == LONG  # nothing cut
    spans = [v for i, v in enumerate(final.versions) if i == 0 or final.versions[i - 1] != v]
    assert spans == [version, version + 1]  # its first tokens on the old version, the rest on the new


def test_pause_with_abort_ends_running_requests_and_continue_serves_again(sglang_engine, client):
    url = sglang_engine[0]
    started = threading.Event()
    result: list = []
    worker = threading.Thread(target=lambda: result.append(run(_stream(
        url, PROMPT, {"max_new_tokens": LONG, "ignore_eos": True}, on_chunk=lambda c: started.set()))))
    worker.start()
    assert started.wait(120)
    client.pause_generation("abort")
    worker.join(120)
    assert result[0][-1].finish_reason == "abort" and len(result[0][-1].output_ids) < LONG
    client.flush_cache()  # accepted once nothing runs (it retries while refused, and raises past its timeout)
    client.continue_generation()
    assert generate(url, PROMPT, {"max_new_tokens": 4, "ignore_eos": True}).finish_reason == "length"


def test_a_peft_adapter_serves_as_peft_computes_and_the_base_is_untouched(sglang_engine, client, tiny_model,
                                                                         tmp_path):
    url = sglang_engine[0]
    adapter = random_peft_adapter(tiny_model, 1, tmp_path / "a1")
    base = scored(url)
    assert client.load_lora_adapter("peft-a1", str(adapter))["success"]
    served = scored(url, lora_path="peft-a1")
    depth, scale = bound(tiny_model, [PROMPT])
    assert_close(served, peft_logprobs(tiny_model, adapter, PROMPT), torch.float32, depth, scale, "adapter vs PEFT")
    assert max(abs(a - b) for a, b in zip(served, base)) > 0.01
    assert scored(url) == base  # a request without the adapter
    client.unload_lora_adapter("peft-a1")


def test_adapter_tensors_are_not_sent_to_sglang_on_cpu_and_the_publisher_loads_from_disk(sglang_engine, client,
                                                                                        tiny_model, tmp_path):
    """SGLang on CPU cannot take pickled tensors (its scheduler dies unpickling them): the client refuses to send
    them, and the adapter publisher loads the PEFT directory it writes instead."""
    import json

    from clawr1.config import load_config
    from clawr1.trainer.publish import AdapterSink

    url = sglang_engine[0]
    adapter = random_peft_adapter(tiny_model, 2, tmp_path / "a2")
    config = json.loads((adapter / "adapter_config.json").read_text())
    tensors = load_file(str(adapter / "adapter_model.safetensors"))
    assert not client.update_protocol().adapter_tensors
    with pytest.raises(EngineError, match="takes adapters from disk only"):
        client.load_lora_adapter_from_tensors("tensors-a2", config, tensors)
    sink = AdapterSink(load_config(None, [f"run.dir={tmp_path / 'run'}"]), [client])
    sink.push_adapters({0: tensors}, config, version=1)
    assert_close(scored(url, lora_path=adapter_name(0, 1)), peft_logprobs(tiny_model, adapter, PROMPT),
                 torch.float32, *bound(tiny_model, [PROMPT]), "published adapter vs PEFT")
    client.unload_lora_adapter(adapter_name(0, 1))


def test_a_missing_adapter_is_a_clear_error_and_the_engine_serves_on(sglang_engine, client, tmp_path):
    url = sglang_engine[0]
    with pytest.raises(EngineError) as never_loaded:
        scored(url, lora_path="never-loaded")
    assert never_loaded.value.status == 400 and "never been loaded" in str(never_loaded.value)
    with pytest.raises(EngineError) as bad_path:
        client.load_lora_adapter("bad", str(tmp_path / "no-such-adapter"))
    assert "no-such-adapter" in str(bad_path.value)
    assert len(scored(url)) == len(PROMPT) - 1


def test_an_unloaded_adapter_named_again_comes_back_from_its_path_while_the_path_exists(sglang_engine, client,
                                                                                       tiny_model, tmp_path):
    """SGLang re-loads an evicted adapter a request names, from the path it remembers (a behaviour of 0.5.23 no
    stand-in had). clawr1's adapter publisher deletes every version's directory when it unloads it, so a stale
    name fails with an error the gateway retries on the newest version (tests/gateway/test_lora_routing.py)."""
    url = sglang_engine[0]
    adapter = random_peft_adapter(tiny_model, 3, tmp_path / "a3")
    client.load_lora_adapter(adapter_name(0, 1), str(adapter))
    first = scored(url, lora_path=adapter_name(0, 1))
    client.unload_lora_adapter(adapter_name(0, 1))
    assert scored(url, lora_path=adapter_name(0, 1)) == first  # re-loaded from disk
    client.unload_lora_adapter(adapter_name(0, 1))
    shutil.rmtree(adapter)
    with pytest.raises(EngineError) as gone:
        scored(url, lora_path=adapter_name(0, 1))
    assert gone.value.status == 400 and "LoRA adapter" in str(gone.value)  # what the gateway's retry looks for
    assert len(scored(url)) == len(PROMPT) - 1


def test_the_kernel_stand_in_fails_loudly_when_called(sglang):
    import subprocess

    probe = subprocess.run([sglang, "-c", "import sgl_kernel.kvcacheio as k; k.transfer_kv_all_layer(1, 2)"],
                           capture_output=True, text=True)
    assert probe.returncode != 0
    assert "KernelMissing: sgl_kernel.kvcacheio.transfer_kv_all_layer was called" in probe.stderr
