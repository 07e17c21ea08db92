"""Invariant 7: for the same weights and tokens, engine and trainer log-probs agree (fp32 CPU)."""
from __future__ import annotations

import httpx
import torch

from clawr1.chat import ChatRenderer
from tests.numerics import assert_close, forward_depth, logit_magnitude, tolerance


def test_engine_sampled_logprobs_equal_megatron_logprobs(engine, tiny_model, megatron_tp1):
    from transformers import AutoTokenizer

    from clawr1.trainer.model import build_policy, pack, packed_logprobs

    renderer = ChatRenderer(AutoTokenizer.from_pretrained(tiny_model))
    policy = build_policy(tiny_model)
    prompts, responses, engine_lps = [], [], []
    for i, q in enumerate(["What is 3 km plus 4 km?", "Add 10 g and 7 g.", "How much is 2 L and 9 L together?"]):
        ids = renderer.encode_messages([{"role": "system", "content": "You are a helpful assistant."},
                                        {"role": "user", "content": q}])
        out = httpx.post(f"{engine}/generate", json={
            "input_ids": ids, "sampling_params": {"max_new_tokens": 40, "sampling_seed": i}, "return_logprob": True},
            timeout=60).json()
        prompts.append(ids)
        responses.append(out["output_ids"])
        engine_lps += [e[0] for e in out["meta_info"]["output_token_logprobs"]]
    packed = pack([p + r for p, r in zip(prompts, responses)], [len(p) for p in prompts])
    trainer_lps = packed_logprobs(policy, packed).tolist()
    assert len(trainer_lps) == len(engine_lps) == sum(map(len, responses))
    # megatron's full forward and the engine's KV-cache decode: the same sums in another order, each log-prob
    # rounding at the logits' scale (z_i - logsumexp(z))
    scale = logit_magnitude(tiny_model, [p + r for p, r in zip(prompts, responses)])
    assert_close(trainer_lps, engine_lps, torch.float32, forward_depth(tiny_model) + 1, scale, "log-probs")


def test_at_temperature_0_7_rollout_trainer_and_teacher_log_probs_agree(engine, tiny_model, megatron_tp1):
    """Defect 5: log-probs sampled at T=0.7, recomputed by the trainer at the sample's temperature and scored by the
    teacher at it, are one distribution; at T=1 they would not be."""
    import asyncio

    from transformers import AutoTokenizer

    from clawr1.engine_api.client import EngineClient
    from clawr1.judge.teacher import Teacher
    from clawr1.trainer.model import build_policy, pack, packed_logprobs

    renderer = ChatRenderer(AutoTokenizer.from_pretrained(tiny_model))
    policy = build_policy(tiny_model)
    prompt = renderer.encode_messages([{"role": "user", "content": "What is 12 m plus 30 m?"}])
    out = httpx.post(f"{engine}/generate", json={
        "input_ids": prompt, "sampling_params": {"max_new_tokens": 30, "temperature": 0.7, "sampling_seed": 3},
        "return_logprob": True}, timeout=60).json()
    response, rollout = out["output_ids"], [e[0] for e in out["meta_info"]["output_token_logprobs"]]
    packed = pack([prompt + response], [len(prompt)])
    at_07 = packed_logprobs(policy, packed, torch.full((len(response),), 0.7)).tolist()
    at_1 = packed_logprobs(policy, packed, 1.0).tolist()
    # as above, at the logits' scale over T (the division by 0.7 rounds once more)
    depth, scale = forward_depth(tiny_model) + 2, logit_magnitude(tiny_model, [prompt + response]) / 0.7
    assert_close(at_07, rollout, torch.float32, depth, scale, "log-probs at T=0.7")
    assert max(abs(a - b) for a, b in zip(at_1, rollout)) > 10 * tolerance(torch.float32, scale, depth)  # T matters: 10x the bound

    async def teacher_scores():
        client = EngineClient(engine)
        try:
            plain = await client.score(prompt + response, first_scored=len(prompt), temperature=0.7)
            hinted = await Teacher(client, renderer).score(prompt, response, "Be brief.", temperature=0.7)
            return plain, hinted
        finally:
            await client.close()

    plain, hinted = asyncio.run(teacher_scores())
    assert_close(plain.prompt_logprobs, rollout, torch.float32, depth, scale, "teacher's log-probs at T=0.7")
    assert hinted.temperature == 0.7 and len(hinted.generation.prompt_logprobs) == len(response)
