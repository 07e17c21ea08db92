"""One step of each objective moves log-probs the right way.

On a small model whose weights the test sets itself (a seeded random init, not the built tiny model), so the
check does not depend on how large one sample's change happens to be on one build: the step's first-order
effect on the response's log-prob, -lr * <grad of the loss, grad of the log-prob>, must have the objective's
sign, and so must the change one SGD step actually makes.
"""
from __future__ import annotations

import copy

import msgspec
import pytest
import torch

from clawr1.config import AlgoConfig
from clawr1.protocol import Sample
from clawr1.trainer.model import pack, packed_logprobs
from clawr1.trainer.step import train_step
from tests.trainer.families import COMMON, save_random_model


LR = 0.01
VOCAB = COMMON["vocab_size"]  # the random models of tests/trainer/families.py


class RecordingSGD:
    """Plain SGD that keeps the gradient it stepped with."""

    def __init__(self, model, lr):
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.opt = torch.optim.SGD(self.params, lr=lr)
        self.grads: list[torch.Tensor] = []

    def zero_grad(self):
        self.opt.zero_grad(set_to_none=True)

    def step(self):
        self.grads = [torch.zeros_like(p) if p.grad is None else p.grad.detach().clone() for p in self.params]
        self.opt.step()
        return {"grad_norm": 0.0, "lr": 0.0}


def logprob_sum(policy, s: Sample) -> torch.Tensor:
    return packed_logprobs(policy, pack([s.tokens], [s.prompt_len])).sum()


def response_logprob(policy, s: Sample) -> float:
    with torch.no_grad():
        return float(logprob_sum(policy, s))


def first_order_change(policy, s: Sample, opt: RecordingSGD) -> float:
    """-lr * <loss gradient, gradient of the response's log-prob>: what the step does to it to first order."""
    grads = torch.autograd.grad(logprob_sum(policy, s), opt.params, allow_unused=True)
    return -LR * sum(float((g * h).sum()) for g, h in zip(opt.grads, grads) if h is not None)


def make(policy, sid: str, tokens: list[int], prompt_len: int, **kw) -> Sample:
    s = Sample(sample_id=sid, group_id=sid, tokens=tokens, prompt_len=prompt_len, loss_mask=[1] * (len(tokens) - prompt_len),
               rollout_logprobs=[0.0] * (len(tokens) - prompt_len), versions=[0] * (len(tokens) - prompt_len))
    lp = packed_logprobs(policy, pack([tokens], [prompt_len])).detach().tolist()
    return msgspec.structs.replace(s, rollout_logprobs=lp, **kw)


def topk_teacher(policy, s: Sample, favour: bool) -> dict:
    """A teacher equal to the student on its top-2 ids except for the sampled token.

    Favoured: the sampled token gets probability 0.5 (the other id at most 0.25); disfavoured: 20 times less
    than the student gives it.
    """
    from clawr1.trainer.model import packed_logprobs_entropy

    resp = s.tokens[s.prompt_len:]
    ids = torch.tensor([[tok, (tok + 1) % VOCAB] for tok in resp])
    with torch.no_grad():
        _, _, student = packed_logprobs_entropy(policy, pack([s.tokens], [s.prompt_len]), extra_ids=ids)
    mine = torch.full_like(student[:, 0], float(torch.tensor(0.5).log())) if favour else student[:, 0] - 3.0
    # a distribution: where the student gives the other id more than 0.25, the favoured teacher gives it 0.25
    other = student[:, 1].clamp(max=float(torch.tensor(0.25).log())) if favour else student[:, 1]
    teacher = torch.stack([mine, other], dim=1)
    return {"teacher_topk_ids": ids.tolist(), "teacher_topk_logprobs": teacher.tolist()}


@pytest.fixture(scope="module")
def random_model(tmp_path_factory):
    return save_random_model("qwen2-tied", tmp_path_factory.mktemp("random-qwen2"), seed=0)


@pytest.mark.parametrize("objective", ["binary_rl", "opd", "combined", "topk"])
def test_one_step_moves_positive_up_and_negative_down(random_model, megatron_tp1, objective):
    from clawr1.trainer.model import build_policy

    policy = build_policy(random_model)
    g = torch.Generator().manual_seed(0)
    good = make(policy, "good", torch.randint(0, VOCAB, (30,), generator=g).tolist(), 20)
    bad = make(policy, "bad", torch.randint(0, VOCAB, (30,), generator=g).tolist(), 20)
    algo = AlgoConfig(w_rl=0.0, w_opd=0.0, baseline="none", tis_cap=0.0)
    if objective in ("binary_rl", "combined"):
        algo.w_rl = 1.0
        good, bad = msgspec.structs.replace(good, reward=1.0), msgspec.structs.replace(bad, reward=-1.0)
    if objective in ("opd", "combined"):
        algo.w_opd = 1.0
        good = msgspec.structs.replace(good, teacher_logprobs=[x + 1.0 for x in good.rollout_logprobs])
        bad = msgspec.structs.replace(bad, teacher_logprobs=[x - 1.0 for x in bad.rollout_logprobs])
    if objective == "topk":
        algo.w_topk = 1.0
        good = msgspec.structs.replace(good, **topk_teacher(policy, good, favour=True))
        bad = msgspec.structs.replace(bad, **topk_teacher(policy, bad, favour=False))
    start = copy.deepcopy(policy.model.state_dict())
    for sample, direction in ((good, +1), (bad, -1)):  # each from the same weights, one SGD step
        policy.model.load_state_dict(start)
        before = response_logprob(policy, sample)
        opt = RecordingSGD(policy.model, lr=LR)
        stats = train_step(policy, opt, [sample], algo, max_tokens_per_microbatch=4096)
        after = response_logprob(policy, sample)
        policy.model.load_state_dict(start)
        predicted = first_order_change(policy, sample, opt)
        assert direction * predicted > 0 and direction * (after - before) > 0, \
            (objective, sample.sample_id, predicted, before, after)
        if objective == "topk":
            assert stats["topk_kl"] > 0 and stats["frac_topk"] == 1.0
