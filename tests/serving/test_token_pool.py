"""The embedded engine's KV cache is one pool of token positions: requests wait for room in it rather than fail,
the pool is sized from the memory budget, and the engine still refuses weights that cannot fit."""
from __future__ import annotations

import itertools
import json
import threading

import pytest

from clawr1.serving.memory import GIB, EngineMemoryError, plan_engine, size_pool
from clawr1.serving.model_runner import PAGE_TOKENS, TokenPool


def test_pages_are_reserved_per_request_and_come_back_when_it_ends():
    import torch

    pool = TokenPool(layers=1, slots=4, tokens=4 * PAGE_TOKENS, kv_heads=1, head_dim=2, dtype=torch.float32)
    first = pool.take(2 * PAGE_TOKENS + 1)  # three pages
    assert pool.free_tokens == PAGE_TOKENS and pool.fits(PAGE_TOKENS) and not pool.fits(PAGE_TOKENS + 1)
    second = pool.take(PAGE_TOKENS)
    assert not pool.fits(1)
    assert not set(pool.positions[first].tolist()) & set(pool.positions[second].tolist())
    pool.release(first)
    assert pool.free_tokens == 3 * PAGE_TOKENS and pool.fits(3 * PAGE_TOKENS)


def test_past_a_requests_filled_part_the_gather_reads_only_its_own_first_position():
    import torch

    pool = TokenPool(layers=1, slots=2, tokens=4 * PAGE_TOKENS, kv_heads=1, head_dim=2, dtype=torch.float32)
    short, long = pool.take(PAGE_TOKENS), pool.take(2 * PAGE_TOKENS)
    pool.lengths[short], pool.lengths[long] = 2, 20
    index = pool.gather_index([short, long], longest=21)
    own = pool.positions[short]
    assert index[0, :3].tolist() == own[:3].tolist() and set(index[0, 3:].tolist()) == {int(own[0])}
    assert index[1].tolist() == pool.positions[long][:21].tolist()


def test_requests_that_do_not_fit_together_wait_their_turn_and_none_fails(tiny_model):
    """A pool of 4 pages holds one request of prompt + 40 new tokens at a time: five sent at once run one after
    another (none overlaps another), every one finishes, and each gives what a roomy engine gives."""
    from transformers import AutoTokenizer

    from clawr1.serving.engine import Engine, GenerateRequest, SamplingParams

    ids = AutoTokenizer.from_pretrained(tiny_model)("three plus four is")["input_ids"]
    assert len(ids) + 40 <= 4 * PAGE_TOKENS < 2 * (len(ids) + 40)

    def run(engine: Engine, n: int) -> tuple[list[dict], list[tuple[int, int]]]:
        ticks, done, spans, lock = itertools.count(), threading.Event(), {}, threading.Lock()
        results: dict[int, dict] = {}

        def on_event(i: int):
            def record(event: dict) -> None:
                with lock:
                    tick = next(ticks)
                    spans.setdefault(i, [tick, tick])[1] = tick
                    if event["type"] == "done":
                        results[i] = event
                        if len(results) == n:
                            done.set()
            return record

        for i in range(n):
            params = SamplingParams(max_new_tokens=40, temperature=0, ignore_eos=True)
            engine.submit(GenerateRequest(list(ids), params, stream=True), on_event(i))
        assert done.wait(300), "requests did not finish"
        return [results[i] for i in range(n)], [tuple(spans[i]) for i in range(n)]

    tight = Engine(tiny_model, max_running=8, max_context=64, max_total_tokens=4 * PAGE_TOKENS)
    roomy = Engine(tiny_model, max_running=8, max_context=64)
    try:
        got, spans = run(tight, 5)
        want, _ = run(roomy, 1)
    finally:
        tight.stop()
        roomy.stop()
    assert all(r["meta_info"]["finish_reason"]["type"] == "length" for r in got)
    assert {tuple(r["output_ids"]) for r in got} == {tuple(want[0]["output_ids"])}
    ordered = sorted(spans)
    assert all(a[1] < b[0] for a, b in zip(ordered, ordered[1:])), f"requests overlapped in a one-request pool: {spans}"


def test_a_pool_smaller_than_one_context_is_refused(tiny_model):
    from clawr1.serving.engine import Engine

    with pytest.raises(ValueError, match="cannot hold one request"):
        Engine(tiny_model, max_running=2, max_context=64, max_total_tokens=32)


def write_header_only_model(path, config: dict) -> None:
    """A model directory whose safetensors header names the tensors of `config` with no data behind it: enough for
    the plan, which reads only headers."""
    h, layers, vocab = config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]
    q = config["num_attention_heads"] * config["head_dim"]
    kv = config["num_key_value_heads"] * config["head_dim"]
    shapes = {"model.embed_tokens.weight": [vocab, h], "lm_head.weight": [vocab, h]}
    for i in range(layers):
        for name, shape in (("q", [q, h]), ("k", [kv, h]), ("v", [kv, h]), ("o", [h, q])):
            shapes[f"model.layers.{i}.self_attn.{name}_proj.weight"] = shape
        for name in ("gate", "up"):
            shapes[f"model.layers.{i}.mlp.{name}_proj.weight"] = [config["intermediate_size"], h]
        shapes[f"model.layers.{i}.mlp.down_proj.weight"] = [h, config["intermediate_size"]]
    header = json.dumps({k: {"dtype": "F32", "shape": s, "data_offsets": [0, 0]} for k, s in shapes.items()}).encode()
    path.mkdir()
    (path / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header)
    (path / "config.json").write_text(json.dumps(config))


QWEN3_06B_SHAPE = {"hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16,
                   "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 40960}


def test_qwen3_06b_shaped_weights_get_a_pool_within_a_24_gib_machine_by_default(tmp_path):
    """Every request's whole context would need 28 GiB of KV cache (32 x 4,096 tokens); the pool takes what the
    budget leaves beside the weights, so the defaults serve it."""
    write_header_only_model(tmp_path / "m", QWEN3_06B_SHAPE)
    plan = plan_engine(tmp_path / "m", "float32", slots=32, context_length=0)
    assert plan.context == 4096 and plan.token_bytes == 2 * 28 * 8 * 128 * 4
    assert plan.kv_cache_bytes == 28 * GIB  # what the plan by requests reserved, and refused
    sized = size_pool(plan, budget_gb=20.0, fraction=0.85)
    assert plan.context <= sized.pool_tokens < plan.pool_tokens
    assert sized.total_bytes <= 0.85 * 20 * GIB < sized.total_bytes + sized.token_bytes
    roomy = size_pool(plan, budget_gb=64.0, fraction=0.85)
    assert roomy.pool_tokens == 32 * 4096  # never more than every request's whole context


def test_weights_that_do_not_fit_are_refused_with_the_keys_to_change(tmp_path):
    write_header_only_model(tmp_path / "m", QWEN3_06B_SHAPE)
    plan = plan_engine(tmp_path / "m", "float32", slots=32, context_length=0)
    with pytest.raises(EngineMemoryError) as refused:
        size_pool(plan, budget_gb=2.0, fraction=0.85)  # weights alone are 2.8 GiB
    text = str(refused.value)
    assert "the engine needs" in text and "serve.memory_budget_gb is 2.00 GiB" in text
    assert "the weights alone do not fit" in text.lower() and "serve.dtype=bfloat16" in text
    with pytest.raises(EngineMemoryError, match="Lower serve.context_length"):  # weights fit, one context not
        size_pool(plan, budget_gb=4.0, fraction=0.85)
    with pytest.raises(EngineMemoryError, match="serve.max_total_tokens"):
        size_pool(plan, budget_gb=8.0, fraction=0.85, pool_tokens=32 * 4096)
    assert size_pool(plan, budget_gb=8.0, fraction=0.85, pool_tokens=8192).pool_tokens == 8192


def test_requests_admitted_with_the_same_tokens_are_prefilled_once_and_answer_as_if_alone(tiny_model):
    """Four requests queued while the engine is paused are admitted in one step: three with the same prompt share
    one prefill (their keys and values copied, cached_tokens says so), and each answers exactly what it answers
    alone: the same greedy tokens and prompt log-probs, and a seeded sample its own seed's tokens."""
    from transformers import AutoTokenizer

    from clawr1.serving.engine import Engine, GenerateRequest, SamplingParams

    tok = AutoTokenizer.from_pretrained(tiny_model)
    same, other = tok("three plus four is")["input_ids"], tok("two plus two is")["input_ids"]

    def request(ids: list[int], **params) -> GenerateRequest:
        return GenerateRequest(list(ids), SamplingParams(max_new_tokens=12, ignore_eos=True, **params),
                               return_logprob=True, logprob_start_len=0)

    def run(engine: Engine, requests: list[GenerateRequest]) -> list[dict]:
        done, results, lock = threading.Event(), {}, threading.Lock()

        def on_event(i: int):
            def record(event: dict) -> None:
                if event["type"] == "done":
                    with lock:
                        results[i] = event
                        if len(results) == len(requests):
                            done.set()
            return record

        engine.pause("in_place")
        for i, req in enumerate(requests):
            engine.submit(req, on_event(i))
        engine.resume()
        assert done.wait(300), "requests did not finish"
        return [results[i] for i in range(len(requests))]

    batch = [request(same, temperature=0), request(same, temperature=0), request(same, sampling_seed=5),
             request(other, temperature=0)]
    shared = Engine(tiny_model, max_running=8, max_context=64)
    alone = Engine(tiny_model, max_running=8, max_context=64)
    try:
        together = run(shared, batch)
        separately = [run(alone, [request(r.input_ids, **(
            {"temperature": 0} if r.params.greedy else {"sampling_seed": 5}))])[0] for r in batch]
        saved = shared.prompt_tokens_shared
    finally:
        shared.stop()
        alone.stop()
    assert saved == 2 * len(same)
    assert [r["meta_info"]["cached_tokens"] for r in together] == [0, len(same), len(same), 0]
    for got, want in zip(together, separately):
        assert got["output_ids"] == want["output_ids"]
        assert got["meta_info"]["input_token_logprobs"] == want["meta_info"]["input_token_logprobs"]
    assert together[0]["output_ids"] != together[3]["output_ids"]
