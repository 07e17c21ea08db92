"""A training step does not depend on how the batch is cut into micro-batches; the lr schedule's values."""
from __future__ import annotations

import copy

import pytest
import torch

from clawr1.config import AlgoConfig, TrainerConfig
from clawr1.trainer.optim import lr_factor
from clawr1.trainer.step import micro_batches
from tests.numerics import assert_all_close, assert_close, forward_depth, grad_depth
from tests.trainer.test_parallel import synthetic_samples


class RecordingOptimizer:
    """Keeps the gradients instead of stepping, so two packings can be compared."""

    def __init__(self, model):
        self.model, self.grads = model, None

    def zero_grad(self):
        self.model.zero_grad(set_to_none=True)

    def step(self):
        self.grads = {n: p.grad.clone() for n, p in self.model.named_parameters()}
        return {"grad_norm": 0.0, "lr": 0.0}


def test_gradient_is_independent_of_micro_batch_packing(tiny_model, megatron_tp1):
    from clawr1.trainer.model import build_policy
    from clawr1.trainer.step import train_step

    policy = build_policy(tiny_model)
    samples = synthetic_samples(10, seed=5)
    results = []
    for budget in (60, 150, 100_000):  # many micro-batches ... one
        opt = RecordingOptimizer(policy.model)
        stats = train_step(policy, opt, samples, AlgoConfig(w_rl=1.0, w_opd=0.7), budget)
        results.append((stats["pg_loss"], opt.grads))
    assert len(micro_batches(samples, 60)) > 5 and len(micro_batches(samples, 100_000)) == 1
    (loss0, g0) = results[0]
    for loss, g in results[1:]:  # the same sums in another order (other packings, other matmul shapes)
        assert_close(loss, loss0, torch.float32, forward_depth(tiny_model) + 2, max(1.0, abs(loss0)), "loss")
        assert_all_close(g, g0, torch.float32, grad_depth(tiny_model), what="grads")


def test_micro_batches_respect_the_budget_and_keep_order():
    samples = synthetic_samples(10, seed=1)
    mbs = micro_batches(samples, 80)
    assert [s for mb in mbs for s in mb] == samples
    assert all(sum(len(s.tokens) for s in mb) <= 80 or len(mb) == 1 for mb in mbs)


def test_lr_schedules():
    constant = lr_factor(TrainerConfig(lr_schedule="constant", warmup_steps=4), 100)
    assert [constant(s) for s in (0, 1, 3, 4, 99)] == [0.25, 0.5, 1.0, 1.0, 1.0]
    cosine = lr_factor(TrainerConfig(lr_schedule="cosine", warmup_steps=0, min_lr_ratio=0.1), 100)
    assert cosine(0) == 1.0
    # float64: pi * progress, a cosine, and four products and sums, at magnitude 1
    assert_close([cosine(50), cosine(100)], [0.55, 0.1], torch.float64, 6, 1.0)
    with pytest.raises(ValueError, match="'constant' or 'cosine'"):
        TrainerConfig(lr_schedule="linear")


def test_opd_compares_the_student_at_the_temperature_the_teacher_was_scored_at(tiny_model, megatron_tp1):
    """A teacher scored at T=1 (SGLang: raw logits) for a sample drawn at T=0.7: the OPD gap uses the student at T=1."""
    from clawr1.trainer.model import build_policy, pack, packed_logprobs
    from clawr1.trainer.step import train_step

    policy = build_policy(tiny_model)
    samples = synthetic_samples(4, seed=2, topk=0)
    for s in samples:
        s.temperature = 0.7
        packed = pack([s.tokens], [s.prompt_len])
        s.teacher_logprobs = packed_logprobs(policy, packed, 1.0).tolist()  # the teacher is the student itself
        s.teacher_temperature = 1.0
    algo = AlgoConfig(w_rl=0.0, w_opd=1.0)
    stats = train_step(policy, RecordingOptimizer(policy.model), samples, algo, 100_000)
    # no gap but rounding: the teacher's log-probs came from a pack of one, the step's from a pack of four (the
    # same sums in another order), each a forward pass and a log-softmax at the log-probs' magnitude
    largest = max(abs(v) for s in samples for v in s.teacher_logprobs)
    assert_close(stats["adv_opd_mean"], 0.0, torch.float32, forward_depth(tiny_model) + 1, largest, "OPD mean")
    assert_close(stats["adv_opd_std"], 0.0, torch.float32, forward_depth(tiny_model) + 1, largest, "OPD std")
    for s in samples:
        s.teacher_temperature = 0.7  # mislabelled: now the gap is the temperature's, not the hint's
    stats = train_step(policy, RecordingOptimizer(policy.model), samples, algo, 100_000)
    assert stats["adv_opd_std"] > 1e-2


def test_the_personal_envs_groups_get_group_normalized_advantages():
    """A grouped episode of the personal env, turned into Samples as the judge makes them (an ungrouped turn is
    its own group), gets GRPO advantages per question's first answers and the EMA baseline for retries."""
    import asyncio
    import random

    from clawr1.protocol import Sample
    from clawr1.trainer.step import plan_batch
    from envs.personal.env import PersonalEnv
    from envs.personal.preferences import render_answer
    from envs.personal.questions import Question
    from tests.envs.test_personal import GroupAgent

    env = PersonalEnv({"kinds": ["format"], "questions_per_session": 2, "implicit_rate": 0.0, "group_size": 4,
                       "max_corrections": 1})
    good = render_answer(Question("q", 1, 1, "g"), {"format": env.profile["format"], "units": "symbol",
                                                    "tone": "none", "length": "short", "closing": "none"})
    agent = GroupAgent(good, {"s-0"})
    asyncio.run(env.episode(agent, "s", random.Random(0)))
    samples = []
    for i, (session, group, _, _) in enumerate(agent.calls):
        sid = f"{session}/{i}"
        samples.append(Sample(sample_id=sid, group_id=group or sid, tokens=[1, 2, 3], prompt_len=2, loss_mask=[1],
                              rollout_logprobs=[-1.0], versions=[0], reward=1.0 if session == "s-0" else -1.0))
    plan, _ = plan_batch(samples, AlgoConfig(), 0, {"": 0.5})  # the task's running mean reward so far: 0.5
    by_group: dict[str, list[float]] = {}
    for s in samples:
        by_group.setdefault(s.group_id, []).append(plan.rl_advantage[s.sample_id])
    assert sorted(len(v) for k, v in by_group.items() if k in ("s-q0", "s-q1")) == [4, 4]
    for question in ("s-q0", "s-q1"):  # one good answer of four: it leads, the three others share the rest
        values = by_group[question]
        # four advantages in float64 centred on their mean: a mean and a sum of four, each rounding at their magnitude
        assert_close(sum(values), 0.0, torch.float64, 2 * 4, max(map(abs, values)), "group sum")
        assert values[0] > 0 and len(set(values[1:])) == 1
    retries = [plan.rl_advantage[s.sample_id] for s in samples if s.group_id == s.sample_id]
    assert retries == [-1.5] * 6  # the three bad sessions' retries: reward -1 against the EMA baseline 0.5


def test_a_closed_opd_gate_trains_as_if_w_opd_were_zero(tiny_model, megatron_tp1):
    from clawr1.trainer.model import build_policy
    from clawr1.trainer.step import OpdSignalWindow, train_step

    policy = build_policy(tiny_model)
    samples = synthetic_samples(10, seed=7)
    disagreeing = OpdSignalWindow(64)
    disagreeing.pairs.extend([(-5.0, 1.0)] * 20 + [(5.0, -1.0)] * 20)  # the teacher prefers what the judge scores down
    runs = {}
    for name, algo, window in (("gated", AlgoConfig(w_opd=1.0, opd_gate="signal"), disagreeing),
                               ("no opd", AlgoConfig(w_opd=0.0), None), ("opd", AlgoConfig(w_opd=1.0), None)):
        opt = RecordingOptimizer(policy.model)
        stats = train_step(policy, opt, samples, algo, 100_000, opd_signal=window)
        runs[name] = (stats, opt.grads)
    gated, no_opd, opd = runs["gated"], runs["no opd"], runs["opd"]
    assert gated[0]["opd_gate"] == 0.0 and gated[0]["opd_signal_auc"] < 0.1
    assert max((gated[1][k] - no_opd[1][k]).abs().max().item() for k in no_opd[1]) == 0.0
    assert max((opd[1][k] - no_opd[1][k]).abs().max().item() for k in no_opd[1]) > 1e-4  # OPD does move it


def _scaled_gaps(samples, factor: float):
    """Copies whose teacher gap against the rollout log-probs is `factor` times larger."""
    out = []
    for s in samples:
        c = copy.copy(s)
        if s.teacher_logprobs is not None:
            c.teacher_logprobs = [r + factor * (t - r) for t, r in zip(s.teacher_logprobs, s.rollout_logprobs)]
        out.append(c)
    return out


def test_balance_std_divides_each_signal_by_its_spread_over_the_batch():
    from clawr1.trainer.step import plan_batch

    samples = synthetic_samples(12, seed=3, topk=0)
    plain, _ = plan_batch(samples, AlgoConfig(), 0, {})
    assert (plain.rl_scale, plain.opd_scale) == (1.0, 1.0)
    balanced, _ = plan_batch(samples, AlgoConfig(balance="std"), 0, {})
    tripled, _ = plan_batch(_scaled_gaps(samples, 3.0), AlgoConfig(balance="std"), 0, {})
    assert balanced.opd_scale != 1.0 and balanced.rl_scale != 1.0
    # each fp32 gap rounds its two log-probs (magnitude m): a spread s = 1/scale moves by 2 eps m, its scale by
    # 2 eps m scale^2; tripled counts once (2), balanced / 3 nine times over a third (2 x 3)
    m = max(abs(v) for s in _scaled_gaps(samples, 3.0) for v in s.rollout_logprobs + (s.teacher_logprobs or []))
    assert_close(tripled.opd_scale, balanced.opd_scale / 3, torch.float32, 2 + 2 * 3, m * tripled.opd_scale ** 2)
    assert tripled.rl_scale == balanced.rl_scale


def test_with_balance_std_the_update_does_not_depend_on_the_size_of_the_teachers_gaps(tiny_model, megatron_tp1):
    """The rollout log-probs are the policy's own, so the loss's gap (against the policy) is the planned one."""
    from clawr1.trainer.model import build_policy, pack, packed_logprobs
    from clawr1.trainer.step import train_step

    policy = build_policy(tiny_model)
    samples = synthetic_samples(8, seed=4, topk=0)
    for s in samples:
        s.rollout_logprobs = packed_logprobs(policy, pack([s.tokens], [s.prompt_len])).tolist()
    grads = {}
    for balance in ("none", "std"):
        for factor in (1.0, 3.0):
            opt = RecordingOptimizer(policy.model)
            train_step(policy, opt, _scaled_gaps(samples, factor), AlgoConfig(balance=balance), 100_000)
            grads[balance, factor] = opt.grads

    def max_diff(a, b):
        return max((a[k] - b[k]).abs().max().item() for k in a)

    # the same sums in the same order, with per-token weights (gap x scale) that differ by their rounding
    assert_all_close(grads["std", 3.0], grads["std", 1.0], torch.float32, grad_depth(tiny_model), what="grads")
    assert max_diff(grads["none", 1.0], grads["none", 3.0]) > 1e-3  # without balancing, bigger gaps push harder


def _hand_batch():
    """Four turns as the OpenClaw-RL recipe's judge sends them (a 0-scored turn without a hint never arrives):
    +1 with no hint, -1 with a hint, 0 with a hint, and a hint without a score; groups of one."""
    from clawr1.protocol import Sample

    def sample(i, reward, teacher, unhinted=None):
        n = 2
        return Sample(sample_id=f"s{i}", group_id=f"s{i}", task_id="t", tokens=[1, 2, 3, 4][: 2 + n], prompt_len=2,
                      loss_mask=[1] * n, rollout_logprobs=[-1.0, -2.0], versions=[0] * n, reward=reward,
                      teacher_logprobs=teacher, teacher_unhinted_logprobs=unhinted)

    return [sample(0, 1.0, None), sample(1, -1.0, [-0.5, -3.0], [-1.5, -2.0]), sample(2, 0.0, [-2.0, -1.0], [-2.0, -1.0]),
            sample(3, None, [-0.25, -2.5], [-0.75, -2.0])]


def test_the_openclaw_recipes_advantages_equal_a_hand_computation():
    """recipes/combined/cpu_openclaw.yaml: A = r + (teacher - student) per token, the raw reward (no baseline),
    the raw gap (no centring, no clip), weights 1 and 1."""
    from clawr1.config import load_config
    from clawr1.trainer.step import plan_batch, token_advantages

    algo = load_config("recipes/combined/cpu_openclaw.yaml").algo
    samples = _hand_batch()
    plan, _ = plan_batch(samples, algo, 0, {"t": 0.5})  # a running mean the recipe must not subtract
    student = torch.tensor([-1.0, -2.0, -1.0, -2.0, -1.0, -2.0, -1.0, -2.0])  # the policy before the step
    index, mask = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3]), torch.ones(8)
    a_rl, a_opd, combined = token_advantages(samples, plan, algo, student, index, mask)
    #            +1, no hint | -1 + (-0.5+1, -3+2) | 0 + (-2+1, -1+2) | no score: (-0.25+1, -2.5+2)
    assert combined.tolist() == [1.0, 1.0, -0.5, -2.0, -1.0, 1.0, 0.75, -0.5]
    assert a_rl.tolist() == [1.0, 1.0, -1.0, -1.0, 0.0, 0.0, 0.0, 0.0]


def test_with_the_teacher_baseline_opd_is_the_teachers_change_under_the_hint():
    from clawr1.config import AlgoConfig
    from clawr1.trainer.step import has_opd_signal, plan_batch, token_advantages

    algo = AlgoConfig(baseline="none", opd_baseline="teacher")
    samples = _hand_batch()
    plan, _ = plan_batch(samples, algo, 0, {})
    student = torch.tensor([-9.0] * 8)  # far from every teacher: it must not matter
    _, a_opd, _ = token_advantages(samples, plan, algo, student, torch.tensor([0, 0, 1, 1, 2, 2, 3, 3]), torch.ones(8))
    assert a_opd.tolist() == [0.0, 0.0, 1.0, -1.0, 0.0, 0.0, 0.5, -0.5]  # sample 2's hint changed nothing
    samples[1].teacher_unhinted_logprobs = None  # e.g. from a judge that did not score it: no OPD signal, not the student
    assert not has_opd_signal(samples[1], "teacher") and has_opd_signal(samples[1], "student")
    _, a_opd, _ = token_advantages(samples, plan, algo, student, torch.tensor([0, 0, 1, 1, 2, 2, 3, 3]), torch.ones(8))
    assert a_opd.tolist()[2:4] == [0.0, 0.0]
