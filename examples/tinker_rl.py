"""A minimal RL loop written only against the Tinker SDK (`pip install tinker==0.38.0`): it runs unchanged on
Tinker's service or on `clawr1 tinker-serve` (docs/tinker.md).

    python examples/tinker_rl.py --base-url http://127.0.0.1:PORT --base-model NAME [--steps 2]

The task: continue a prompt; the reward is the share of sampled tokens with an even id. Each step
samples a group of completions per prompt from the current weights, centres the rewards within the group
(GRPO), trains with `importance_sampling` (or --loss ppo), takes an AdamW step, and saves new sampler weights.
Prints one JSON line per step: the mean reward, the loss, and a probe (the log-prob of a fixed continuation
under the new sampler weights, which moves when the weights do).
The API key comes from TINKER_API_KEY, as the SDK reads it.
"""
from __future__ import annotations

import argparse
import json

import tinker
from tinker import types

PROMPTS = [[11, 12, 13], [21, 22, 23, 24]]
PROBE = [11, 12, 13, 40, 42, 44]  # a prompt and a fixed continuation


def reward(tokens: list[int]) -> float:
    return sum(t % 2 == 0 for t in tokens) / max(1, len(tokens))


def datum(prompt: list[int], seq: types.SampledSequence, advantage: float) -> types.Datum:
    """Tinker's next-token alignment: the input is the sequence without its last token; only completion tokens
    carry an advantage (the prompt positions get 0, so they do not train)."""
    full = prompt + list(seq.tokens)
    n_prompt = len(prompt) - 1
    return types.Datum(model_input=types.ModelInput.from_ints(full[:-1]), loss_fn_inputs={
        "target_tokens": full[1:],
        "logprobs": [0.0] * n_prompt + list(seq.logprobs),
        "advantages": [0.0] * n_prompt + [advantage] * len(seq.tokens)})


def probe_logprob(sampler: tinker.SamplingClient) -> float:
    """log p(PROBE's continuation | its prompt) under the sampler's weights."""
    scored = sampler.compute_logprobs(types.ModelInput.from_ints(PROBE)).result()
    return float(sum(scored[3:]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default=None, help="the Tinker API (default: TINKER_BASE_URL, else Tinker's)")
    parser.add_argument("--base-model", required=True)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--group", type=int, default=4, help="completions per prompt")
    parser.add_argument("--loss", default="importance_sampling", choices=["importance_sampling", "ppo", "cispo"])
    parser.add_argument("--lr", type=float, default=5e-3)
    args = parser.parse_args()

    service = tinker.ServiceClient(base_url=args.base_url)
    trainer = service.create_lora_training_client(base_model=args.base_model, rank=args.rank).result()
    sampler = trainer.save_weights_and_get_sampling_client().result()
    print(json.dumps({"step": 0, "probe_logprob": probe_logprob(sampler)}), flush=True)
    params = types.SamplingParams(max_tokens=6, temperature=1.0)
    for step in range(1, args.steps + 1):
        data, rewards = [], []
        for prompt in PROMPTS:
            group = sampler.sample(types.ModelInput.from_ints(prompt), args.group, params).result().sequences
            scores = [reward(list(s.tokens)) for s in group]
            mean = sum(scores) / len(scores)
            data += [datum(prompt, s, r - mean) for s, r in zip(group, scores)]
            rewards += scores
        fwd = trainer.forward_backward(data, args.loss)
        opt = trainer.optim_step(types.AdamParams(learning_rate=args.lr))
        loss = fwd.result().metrics["loss:sum"]
        opt.result()
        sampler = trainer.save_weights_and_get_sampling_client().result()
        print(json.dumps({"step": step, "reward_mean": sum(rewards) / len(rewards), "loss": loss,
                          "probe_logprob": probe_logprob(sampler)}), flush=True)
    service.close("success").result()  # the session ends before the interpreter does (nothing left in flight)


if __name__ == "__main__":
    main()
