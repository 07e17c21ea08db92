"""Bring your own model: `clawr1 run recipes/live/cpu.yaml model.path=DIR` with a tiny Qwen3 and a tiny
Llama 3.1 (random weights, their real tokenizers and chat templates, taught one reply in their own format;
clawr1/tinymodel/family.py). The official openai client gets tool calls (streamed and not) and, from Qwen3,
reasoning_content; the run trains; the published weights' HF log-probs equal the engine's."""
from __future__ import annotations

import json
import math
import time
from pathlib import Path

import httpx
import openai
import pytest
from transformers import AutoTokenizer

from clawr1.chat import ChatRenderer
from clawr1.config import ModelConfig, load_config
from clawr1.tinymodel.family import TEACH_TOOLS, ensure_family_model
from tests.conftest import FAMILIES
from tests.e2e.test_live import LiveRun, client, steps
from tests.numerics import assert_as_exact_as

pytestmark = pytest.mark.slow
TRAIN_STEPS = 3
QUESTION = [{"role": "user", "content": "What is 1 plus 2?"}]


@pytest.fixture(scope="module", params=FAMILIES)
def family_model(request):
    """The tiny family model, built once into the model cache beside the tiny Qwen2 model."""
    return request.param, ensure_family_model(request.param, Path(ModelConfig().cache_dir).expanduser())


def reply_parts(c: openai.OpenAI, stream: bool, **kwargs) -> tuple[str, str, list[tuple[str, dict]], str]:
    """(reasoning, content, [(tool name, arguments)], finish reason) of one greedy reply, streamed or not."""
    args = dict(model="m", messages=QUESTION, tools=TEACH_TOOLS, temperature=0, max_tokens=64, **kwargs)
    if not stream:
        choice = c.chat.completions.create(**args).choices[0]
        calls = [(t.function.name, json.loads(t.function.arguments)) for t in choice.message.tool_calls or []]
        return (choice.message.model_extra.get("reasoning_content") or "", choice.message.content or "", calls,
                choice.finish_reason)
    reasoning, content, calls, finish = "", "", {}, ""
    for chunk in c.chat.completions.create(stream=True, **args):
        for choice in chunk.choices:
            reasoning += choice.delta.model_extra.get("reasoning_content") or ""
            content += choice.delta.content or ""
            for t in choice.delta.tool_calls or []:
                name, text = calls.get(t.index, ("", ""))
                calls[t.index] = (name + (t.function.name or ""), text + (t.function.arguments or ""))
            finish = choice.finish_reason or finish
    return reasoning, content, [(n, json.loads(a)) for _, (n, a) in sorted(calls.items())], finish


def served_turn(engine_url: str, prompt: list[int], max_new_tokens: int, tries: int = 8) -> tuple[dict, int]:
    """A turn sampled at temperature 1 whose every token one weight version produced, and that version (the
    trainer may still be stepping: a turn that spans a swap is asked again)."""
    for seed in range(tries):
        served = httpx.post(f"{engine_url}/generate", json={
            "input_ids": prompt, "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 1.0,
                                                     "sampling_seed": seed}, "return_logprob": True},
            timeout=300).json()
        spans = served["meta_info"]["weight_versions"]
        if len(spans) == 1:
            return served, int(spans[0]["version"])
    raise AssertionError(f"no turn of {tries} came from a single weight version")


def hf_logprobs(model_dir, prompt: list[int], response: list[int], dtype: str = "float32") -> list[float]:
    """Log-probs of the response under the HF model, computed in `dtype` throughout (fp32, as the engine takes
    them: fp32's log-softmax over a 150k vocabulary is itself ~6e-5 from fp64's on the tiny Qwen3, so both sides
    must round alike)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).eval()
    with torch.no_grad():
        logits = model(torch.tensor([prompt + response])).logits[0, len(prompt) - 1:-1]
    return logits.log_softmax(-1).gather(1, torch.tensor(response)[:, None])[:, 0].tolist()


def test_a_model_from_a_directory_serves_the_openai_client_and_trains(family_model, tmp_path):
    family, model_dir = family_model
    run_dir = tmp_path / "run"
    run = LiveRun(run_dir, f"model.path={model_dir}", "pool.batch_size=4", "trainer.keep_weight_versions=100",
                  "trainer.max_tokens_per_microbatch=1024", "gateway.session_ttl_s=5")
    try:
        url = run.wait_ready()
        c = openai.OpenAI(base_url=url, api_key="unused", max_retries=0)
        plain, streamed = reply_parts(c, stream=False), reply_parts(c, stream=True)
        assert plain == streamed
        reasoning, content, calls, finish = plain
        assert calls == [("add", {"a": 1, "b": 2})] and finish == "tool_calls" and content == ""
        assert reasoning == ("The user wants a sum." if family == "qwen3" else "")
        renderer = ChatRenderer(AutoTokenizer.from_pretrained(model_dir))
        if family == "qwen3":  # chat_template_kwargs reach the template: thinking off adds an empty think block
            ask = dict(model="m", messages=QUESTION, max_tokens=1)
            on = c.chat.completions.create(**ask).usage.prompt_tokens
            off = c.chat.completions.create(**ask, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
            assert off.usage.prompt_tokens - on == len(renderer.encode_text("<think>\n\n</think>\n\n"))
            with pytest.raises(openai.BadRequestError, match="tokenize"):
                c.chat.completions.create(**ask, extra_body={"chat_template_kwargs": {"tokenize": True}})

        users = client(url, "--users", "4")
        try:
            deadline, start = 600, time.monotonic()
            while steps(run_dir) < TRAIN_STEPS:
                assert users.poll() is None and time.monotonic() - start < deadline, f"{steps(run_dir)} steps"
                time.sleep(2)
        finally:
            users.terminate()
            users.communicate(timeout=60)

        # a served turn, sampled at temperature 1, and the published weights of the version that served it
        cfg = load_config(run_dir / "config.yaml")
        prompt = renderer.encode_messages(QUESTION)
        served, version = served_turn(cfg.engine_url, prompt, max_new_tokens=24)
        assert version >= TRAIN_STEPS
        engine_lps = [e[0] for e in served["meta_info"]["output_token_logprobs"]]
        published = run_dir / "weights" / f"v{version:06d}"
        reference = hf_logprobs(published, prompt, served["output_ids"])
        exact = hf_logprobs(published, prompt, served["output_ids"], dtype="float64")
        assert len(engine_lps) == len(reference) > 0
        # the engine decodes with a KV cache: as exact as fp32 allows, against fp64, next to HF's fp32 forward
        assert_as_exact_as(engine_lps, exact, reference, what="served log-probs")
        assert all(math.isfinite(x) for x in engine_lps)
        code, out = run.interrupt()
        assert code == 130, out[-3000:]
    finally:
        run.kill()
