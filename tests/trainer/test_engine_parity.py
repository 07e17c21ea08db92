"""Invariant 7: for the same weights and tokens, engine and trainer log-probs agree (fp32 CPU)."""
from __future__ import annotations

import httpx

from clawr1.gateway.chat_template import ChatRenderer


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
    diffs = [abs(a - b) for a, b in zip(trainer_lps, engine_lps)]
    assert sum(diffs) / len(diffs) < 1e-5
    assert max(diffs) < 1e-4
