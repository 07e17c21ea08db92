"""LoRA adapters in the embedded engine (a real `clawr1 serve` process on loopback): adapters written by the
`peft` library, loaded from disk or from tensors, picked per request with `lora_path`, and swapped version by
version under streaming clients without a failed request."""
from __future__ import annotations

import asyncio
import json
import random

import httpx
import pytest
import torch

from clawr1.engine_api.client import EngineClient, EngineError, SyncEngineClient
from tests.numerics import assert_as_exact_as, assert_close, forward_depth, logit_magnitude

ENGINE_OVERRIDES = ("serve.max_loras=6", "serve.max_running_requests=40")
MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
PROMPT = [1, 17, 42, 99, 7, 230, 11]


def random_peft_adapter(model_path, seed: int, out_dir):
    """A rank-4 adapter on every linear, saved by peft itself, with random (non-zero) B."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(model_path),
                           LoraConfig(r=4, lora_alpha=8, target_modules=MODULES, init_lora_weights=False))
    model.save_pretrained(out_dir)
    return out_dir


@pytest.fixture(scope="module")
def peft_dirs(tiny_model, tmp_path_factory):
    return [random_peft_adapter(tiny_model, seed, tmp_path_factory.mktemp(f"adapter{seed}")) for seed in (1, 2)]


def peft_logprobs(tiny_model, adapter_dir, ids: list[int], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """log p of ids[1:] under the base (adapter_dir None) or the base with a peft adapter, computed in `dtype`."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=dtype)
    if adapter_dir is not None:
        model = PeftModel.from_pretrained(model, str(adapter_dir)).to(dtype)
    with torch.no_grad():
        logp = torch.log_softmax(model.eval()(input_ids=torch.tensor([ids])).logits[0], dim=-1)
    return logp[:-1].gather(1, torch.tensor(ids[1:])[:, None])[:, 0]


def generate(url: str, **body) -> httpx.Response:
    payload = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 6, "temperature": 0.0},
               "return_logprob": True, "logprob_start_len": 0, **body}
    return httpx.post(f"{url}/generate", json=payload, timeout=60)


def all_logprobs(reply: dict) -> torch.Tensor:
    meta = reply["meta_info"]
    return torch.tensor([e[0] for e in meta["input_token_logprobs"][1:]] + [e[0] for e in meta["output_token_logprobs"]])


def adapter_tensors(d):
    from safetensors.torch import load_file

    return json.loads((d / "adapter_config.json").read_text()), load_file(str(d / "adapter_model.safetensors"))


def test_an_adapter_from_disk_serves_the_peft_models_log_probs(engine, tiny_model, peft_dirs):
    client = SyncEngineClient(engine)
    try:
        reply = client.load_lora_adapter("disk-a", str(peft_dirs[0]))
        assert reply["loaded_adapters"]["disk-a"] == str(peft_dirs[0])
        adapted, base = generate(engine, lora_path="disk-a").json(), generate(engine).json()
        # as exact as fp32 allows, against peft in fp64, next to peft's own fp32 forward
        for reply, adapter in ((adapted, peft_dirs[0]), (base, None)):
            ids = PROMPT + reply["output_ids"]
            honest, exact = (peft_logprobs(tiny_model, adapter, ids, dtype) for dtype in (torch.float32, torch.float64))
            assert_as_exact_as(all_logprobs(reply), exact, honest, what=f"adapter {adapter}")
        assert (all_logprobs(adapted)[:len(PROMPT) - 1] - all_logprobs(base)[:len(PROMPT) - 1]).abs().max() > 1e-2
    finally:
        client.unload_lora_adapter("disk-a")
        client.close()


def test_a_batch_of_mixed_adapters_equals_each_request_alone(engine, tiny_model, peft_dirs):
    client = SyncEngineClient(engine)
    try:
        for name, d in (("mix-a", peft_dirs[0]), ("mix-b", peft_dirs[1])):
            config, tensors = adapter_tensors(d)
            client.load_lora_adapter_from_tensors(name, config, tensors)
        alone = {name: all_logprobs(generate(engine, lora_path=name).json()) for name in ("mix-a", "mix-b", None)}
        assert (alone["mix-a"] - alone["mix-b"]).abs().max() > 1e-2
        names = ["mix-a", "mix-b", None, "mix-b"]
        batch = generate(engine, input_ids=[PROMPT] * 4, lora_path=names).json()
        # batched and alone: the same sums in another order (other matmul shapes), rounding at the logits' scale
        scale = logit_magnitude(tiny_model, [PROMPT + r["output_ids"] for r in batch])
        for name, reply in zip(names, batch):
            assert_close(all_logprobs(reply), alone[name], torch.float32, forward_depth(tiny_model) + 1, scale, name)
    finally:
        for name in ("mix-a", "mix-b"):
            client.unload_lora_adapter(name)
        client.close()


def test_names_clash_and_unknown_adapters_are_400(engine, peft_dirs):
    client = SyncEngineClient(engine)
    config, tensors = adapter_tensors(peft_dirs[0])
    try:
        client.load_lora_adapter_from_tensors("named", config, tensors)
        with pytest.raises(EngineError, match="already loaded") as clash:
            client.load_lora_adapter_from_tensors("named", config, tensors)
        assert clash.value.status == 400
        reply = generate(engine, lora_path="nope")
        assert reply.status_code == 400 and "nope" in reply.text and "named" in reply.text
        batch = generate(engine, input_ids=[PROMPT, PROMPT], lora_path=["named", "nope"])
        assert batch.status_code == 400
        bad = {k: (v[:, :-1] if k.endswith("lora_A.weight") else v) for k, v in tensors.items()}
        with pytest.raises(EngineError, match="do not fit"):
            client.load_lora_adapter_from_tensors("bad-shape", config, bad)
        with pytest.raises(EngineError, match="max_lora_rank"):
            client.load_lora_adapter_from_tensors("too-big", {**config, "r": 1000}, tensors)
        with pytest.raises(EngineError, match="not loaded"):
            client.unload_lora_adapter("nope")
        after = client.unload_lora_adapter("named")
        assert "named" not in after["loaded_adapters"] and "bad-shape" not in after["loaded_adapters"]
        assert generate(engine, lora_path="named").status_code == 400
        assert generate(engine).status_code == 200
    finally:
        client.close()


def test_a_versioned_swap_under_32_streaming_clients_cuts_no_request(engine, peft_dirs):
    """20 publishes: load policy@vN, route new requests to it, unload policy@v(N-1). An unload waits for the
    adapter's in-flight requests, so no started request is cut; a request that named the old version but
    reached the engine after its unload began is refused before its first token (a 400 the gateway answers
    by sending it again to the newest version: tests/gateway/test_lora_routing.py)."""
    config, tensors = adapter_tensors(peft_dirs[0])
    publishes, clients = 20, 32

    async def scenario() -> tuple[list[str], list[tuple[str, int]], int]:
        current = {"name": "policy@v0"}
        failures, served, refused = [], [], [0]
        done = asyncio.Event()
        admin = SyncEngineClient(engine)
        await asyncio.to_thread(admin.load_lora_adapter_from_tensors, "policy@v0", config, tensors)

        async def user(i: int) -> None:
            client, rng = EngineClient(engine), random.Random(i)
            try:
                while not done.is_set():
                    name, started, last = current["name"], False, None
                    try:
                        async for last in client.generate_stream(PROMPT, {"max_new_tokens": rng.randint(2, 12),
                                                                          "temperature": 1.0}, lora_path=name):
                            started = True
                        if last is None or last.finish_reason not in ("stop", "length"):
                            failures.append(f"{name}: finish {last and last.finish_reason}")
                        else:
                            served.append((name, last.weight_version))
                    except EngineError as e:
                        if started or e.status != 400 or "is being unloaded" not in str(e) and "is not loaded" not in str(e):
                            failures.append(f"{name}: {e}")
                        refused[0] += 1
            finally:
                await client.close()

        async def publisher() -> None:
            for version in range(1, publishes + 1):
                scaled = {k: v * (1 + version / 10) if "lora_B" in k else v for k, v in tensors.items()}
                new, old = f"policy@v{version}", current["name"]
                await asyncio.to_thread(admin.load_lora_adapter_from_tensors, new, config, scaled)
                current["name"] = new
                await asyncio.to_thread(admin.unload_lora_adapter, old)  # answers once old's requests are done
                await asyncio.sleep(0.05)
            done.set()

        await asyncio.gather(publisher(), *(user(i) for i in range(clients)))
        final = await asyncio.to_thread(admin.unload_lora_adapter, current["name"])
        admin.close()
        assert final["loaded_adapters"] == {}
        return failures, served, refused[0]

    failures, served, refused = asyncio.run(scenario())
    assert failures == []
    assert len(served) >= clients and refused < len(served)
    assert all(version == int(name.split("@v")[1]) for name, version in served)  # tokens carry the adapter's version
    assert len({name for name, _ in served}) >= publishes // 2  # the clients followed the swaps


def test_an_engine_without_lora_says_so(served_without_lora):
    reply = httpx.post(f"{served_without_lora}/load_lora_adapter", json={"lora_name": "x", "lora_path": "/nowhere"},
                       timeout=10)
    assert reply.status_code == 400 and "not enabled" in reply.json()["error_message"]
    assert generate(served_without_lora, lora_path="x").status_code == 400


@pytest.fixture
def served_without_lora(tiny_model, tmp_path, loops):
    from tests.conftest import make_config

    cfg = make_config(tmp_path)
    proc = loops(cfg, "serve")
    proc.wait_http(f"{cfg.engine_url}/health")
    return cfg.engine_url
