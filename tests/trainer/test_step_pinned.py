"""The trainer's losses, advantages and gradients on a fixed batch, pinned to the values the code gave when the
test was written: a refactor of the step, the balance planner or the OPD gate must leave them as they are.

The model is a random tiny Qwen2 (tests/trainer/families.py) run in float64, so the numbers hang on no warm start
and no float32 matmul kernel. The logits are cast to float32 for the log-softmax (trainer/model.py), and that is
where machines differ: a log-sum-exp over K = 250 logits summed in another order is off by at most K fp32 eps.
The pinned numbers are weighted means (weights summing to 1) of such log-probs times advantages (at most about 3)
and importance weights (at most tis_cap = 2), and the log-prob enters both: 250 eps at magnitude 3 * (1 + 2),
2.7e-4. A change of the shaping moves them by 1e-3 or more.
"""
from __future__ import annotations

import random

import pytest
import torch

from clawr1.config import AlgoConfig
from clawr1.protocol import Sample
from tests.numerics import tolerance
from tests.trainer.families import save_random_model
from tests.trainer.test_parallel import synthetic_samples
from tests.trainer.test_step import RecordingOptimizer

TOLERANCE = tolerance(torch.float32, magnitude=3 * (1 + 2), depth=250)
VOCAB = 250  # tests/trainer/families.py's tiny checkpoints
STEP_KEYS = ("pg_loss", "adv_rl_mean", "adv_rl_std", "adv_opd_mean", "adv_opd_std", "entropy", "tis_mean")

# (batch, algo settings) -> the step's stats and the gradient's norm
CASES = {
    "plain": ("full", {}),
    "shaped": ("full", {"opd_center": "sample", "opd_clip": 0.5, "balance": "std", "w_topk": 0.3}),
    "seq-mean": ("full", {"loss_aggregation": "seq-mean-token-mean", "w_rl": 0.5, "w_opd": 2.0, "minibatches": 2}),
    "masked": ("masked", {"balance": "std"}),
}
PINNED_STEPS = {
    'plain': {'pg_loss': 0.15563755296170712, 'adv_rl_mean': -0.011363636363636364, 'adv_rl_std': 0.7832670243313954,
        'adv_opd_mean': -0.25599823412687883, 'adv_opd_std': 0.38777410756010633, 'entropy': 5.506406017185486,
        'tis_mean': 1.0247276542113, 'grad_norm': 0.7856065662691667},
    'shaped': {'pg_loss': 0.006512645515613258, 'adv_rl_mean': -0.011363636363636364, 'adv_rl_std': 0.7832670243313954,
        'adv_opd_mean': -0.006449137304140174, 'adv_opd_std': 0.31446543929425963, 'entropy': 5.506406017185486,
        'tis_mean': 1.0247276542113, 'grad_norm': 1.145140271405656},
    'seq-mean': {'pg_loss': 0.44317276030778885, 'adv_rl_mean': -0.011363636363636364, 'adv_rl_std': 0.7832670243313954,
        'adv_opd_mean': -0.2559982548589292, 'adv_opd_std': 0.387774077165775, 'entropy': 5.506406095839038,
        'tis_mean': 1.0247276542113, 'grad_norm': 2.0825358811844525},
    'masked': {'pg_loss': 0.3214967269450426, 'adv_rl_mean': -0.011904761904761904, 'adv_rl_std': 0.7867057236931799,
        'adv_opd_mean': -0.2420231917194117, 'adv_opd_std': 0.389179779693904, 'entropy': 5.506422801684308,
        'tis_mean': 1.0204331797938193, 'grad_norm': 1.1444068570161707},
}
# the balance planner (algo.balance=std, centred and clipped OPD) on the batch with partial loss masks
PINNED_SCALES = (1.2711233309775782, 3.0123810756409797)
# the OPD gate's window on the batch with partial loss masks: (summed gap, score) per scored sample with a teacher
PINNED_WINDOW = [(-0.14835981440696244, 1.0),
                 (-3.878460759583753, -1.0),
                 (-1.135942648134213, -1.0),
                 (-8.352803993127038, -1.0),
                 (-1.3559464047457892, 1.0),
                 (-2.389152145044015, 1.0)]


@pytest.fixture(scope="module")
def policy(tmp_path_factory, megatron_tp1):
    from clawr1.trainer.model import build_policy

    path = save_random_model("qwen2-tied", tmp_path_factory.mktemp("pinned"), seed=0)
    return build_policy(path, dtype=torch.float64)


def pinned_batch(policy, masked: bool) -> list[Sample]:
    """12 samples of every kind; rollout and teacher log-probs are the policy's own plus fixed noise, so the
    importance weights and gaps are of the size a run sees. `masked`: the first two response tokens of every
    third sample (each with a teacher) are left out of the loss, as a tool's output inside a response would be."""
    from clawr1.trainer.model import pack, packed_logprobs

    rng = random.Random(12)
    samples = synthetic_samples(12, vocab=VOCAB, seed=11)
    for i, s in enumerate(samples):
        own = packed_logprobs(policy, pack([s.tokens], [s.prompt_len])).tolist()
        s.rollout_logprobs = [x + rng.uniform(-0.3, 0.3) for x in own]
        if s.teacher_logprobs is not None:
            s.teacher_logprobs = [x + rng.uniform(-1.0, 0.5) for x in own]
        if masked and i % 3 == 1:
            s.loss_mask = [0, 0] + s.loss_mask[2:]
    return samples


def step_values(policy, samples: list[Sample], algo: AlgoConfig) -> dict[str, float]:
    from clawr1.trainer.step import train_step

    opt = RecordingOptimizer(policy.model)
    stats = train_step(policy, opt, samples, algo, 150)  # several micro-batches
    grad_norm = sum(float(g.double().pow(2).sum()) for g in opt.grads.values()) ** 0.5
    return {**{k: stats[k] for k in STEP_KEYS}, "grad_norm": grad_norm}


def planner_values(policy) -> tuple[tuple[float, float], list[tuple[float, float]]]:
    from clawr1.trainer.step import OpdSignalWindow, plan_batch

    samples = pinned_batch(policy, masked=True)
    plan, _ = plan_batch(samples, AlgoConfig(balance="std", opd_center="sample", opd_clip=0.5), 0, {})
    window = OpdSignalWindow(64)
    window.add(samples)
    return (plan.rl_scale, plan.opd_scale), list(window.pairs)


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_step_gives_the_pinned_losses_and_gradient(policy, case):
    batch, settings = CASES[case]
    values = step_values(policy, pinned_batch(policy, batch == "masked"), AlgoConfig(**settings))
    assert values == pytest.approx(PINNED_STEPS[case], abs=TOLERANCE, rel=0)


def test_the_planner_and_the_gate_give_the_pinned_signals(policy):
    scales, window = planner_values(policy)
    assert scales == pytest.approx(PINNED_SCALES, abs=TOLERANCE, rel=0)
    assert [g for g, _ in window] == pytest.approx([g for g, _ in PINNED_WINDOW], abs=TOLERANCE, rel=0)
    assert [r for _, r in window] == [r for _, r in PINNED_WINDOW]


def test_the_step_and_the_planner_shape_the_same_tokens(policy):
    """With partial loss masks and rollout log-probs that are the policy's own, the loss's OPD advantages (against
    the policy) are the ones the balance planner measured (against the rollout): same tokens, same centring."""
    from clawr1.trainer.model import pack, packed_logprobs
    from clawr1.trainer.step import batch_signals, train_step

    samples = pinned_batch(policy, masked=True)
    for s in samples:
        s.rollout_logprobs = packed_logprobs(policy, pack([s.tokens], [s.prompt_len])).tolist()
    algo = AlgoConfig(opd_center="sample", opd_clip=0.5)
    planned = batch_signals(samples, {}, algo)[1].double()
    stats = train_step(policy, RecordingOptimizer(policy.model), samples, algo, 150)
    assert planned.numel() == sum(sum(s.loss_mask) for s in samples if s.teacher_logprobs is not None)
    assert (stats["adv_opd_mean"], stats["adv_opd_std"]) == pytest.approx(
        (float(planned.mean()), float(planned.std(unbiased=False))), abs=TOLERANCE, rel=0)
