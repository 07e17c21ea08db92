"""One trainer step on a batch of Samples.

    plan the batch (every rank the same): drop stale samples, scalar-reward advantages (GRPO / EMA baseline)
    for each PPO epoch, for each minibatch:
        for each micro-batch of this data-parallel rank's share: pack, forward, per-token loss, backward
        one optimizer step
    per-token loss = PPO clipped surrogate of A = w_rl*A_rl + w_opd*(teacher - old), times a TIS weight,
                     + kl_coef * KL(policy || reference) - entropy_coef * entropy + w_topk * top-k reverse KL

With LoRA adapters in several slots (lora.per_user) every sample goes through its own slot's adapter, GRPO
groups and loss means are taken within a slot, and only the slots with data in a minibatch are stepped:
each user's update is the one their samples alone would give.
"""
from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import Tensor

from clawr1.algo.advantages import (balance_scales, combined_token_advantages, ema_advantages, grpo_advantages,
                                    opd_gate, rl_token_advantages, shaped_opd_advantages, signal_auc)
from clawr1.algo.losses import (aggregation_weights, kl_estimate, ppo_clipped_token_loss, topk_reverse_kl,
                                truncated_importance_weights)
from clawr1.config import AlgoConfig
from clawr1.protocol import Sample
from clawr1.trainer.model import Packed, Policy, logprobs_and_entropy, pack, packed_logprobs_entropy, response_hidden
from clawr1.trainer.optim import SlotAdamW
from clawr1.trainer.parallel import all_reduce_max, all_reduce_sum, dp_shard
from clawr1.trainer.prefix_tree import shared_order


def micro_batches(samples: list[Sample], max_tokens: int, share_prefixes: bool = False) -> list[list[Sample]]:
    """Consecutive samples packed up to `max_tokens` each (a longer sample gets a micro-batch of its own).

    With `share_prefixes` (trainer.share_prefixes) the samples are first put in an order that keeps shared
    prefixes together, and a micro-batch's tokens are those of its prefix tree: a sample adds only the tokens it
    does not share with the one before it."""
    order, costs = list(range(len(samples))), [len(s.tokens) for s in samples]
    if share_prefixes:
        order, costs = shared_order([s.tokens for s in samples], [s.adapter_slot for s in samples])
    out: list[list[Sample]] = []
    current, size = [], 0
    for i, cost in zip(order, costs):
        if current and size + cost > max_tokens:
            out.append(current)
            current, size = [], len(samples[i].tokens)  # a new micro-batch shares nothing with the last one
        else:
            size += cost
        current.append(samples[i])
    if current:
        out.append(current)
    return out


# ---------------------------------------------------------------- batch-level planning
@dataclass
class BatchPlan:
    samples: list[Sample]
    rl_advantage: dict[str, float]  # sample id -> scalar-reward advantage (absent: no reward)
    dropped_stale: int
    staleness: Counter
    dropped_no_slot: int = 0  # samples naming an adapter slot this trainer does not have
    opd_weight: float = 1.0  # algo.opd_gate: 0 while the teacher's signal disagrees with the scores
    rl_scale: float = 1.0  # algo.balance=std: 1 / the spread of each signal over the batch
    opd_scale: float = 1.0


class OpdSignalWindow:
    """The last `size` scored samples with a teacher: (summed teacher - rollout log-prob gap, score), for
    algo.opd_gate=signal. Every rank sees the whole batch, so every rank holds the same window."""

    def __init__(self, size: int, opd_baseline: str = "student"):
        self.pairs: deque[tuple[float, float]] = deque(maxlen=size)
        self.opd_baseline = opd_baseline

    def add(self, samples: list[Sample]) -> None:
        scored = [s for s in samples if has_opd_signal(s, self.opd_baseline) and s.reward]
        if not scored:
            return
        # the raw gap, neither centred (each sample's sum would be 0) nor clipped
        gap, index, _ = _opd_against_rollout(scored, center=False, clip=0.0, opd_baseline=self.opd_baseline,
                                             dtype=torch.float64)
        sums = torch.zeros(len(scored), dtype=torch.float64).index_add_(0, index, gap)
        self.pairs.extend(zip(sums.tolist(), (s.reward for s in scored)))

    def gate(self) -> float:
        return opd_gate([g for g, _ in self.pairs], [r for _, r in self.pairs])

    def auc(self) -> Optional[float]:
        return signal_auc([g for g, _ in self.pairs], [r for _, r in self.pairs])[0]


def baseline_key(s: Sample) -> str:
    """The EMA baseline a sample's reward is compared with: its task's, per adapter slot."""
    return s.task_id if s.adapter_slot == 0 else f"{s.task_id}@slot{s.adapter_slot}"


def rl_sample_advantages(samples: list[Sample], algo: AlgoConfig,
                         baselines: dict[str, float]) -> tuple[dict[str, float], dict[str, float]]:
    """Scalar-reward advantage of each rewarded sample, and the updated EMA baselines."""
    if not samples:
        return {}, baselines
    rewards = torch.tensor([s.reward if s.reward is not None else 0.0 for s in samples], dtype=torch.float64)
    has = torch.tensor([s.reward is not None for s in samples])
    if algo.baseline == "none":
        adv = torch.where(has, rewards, torch.zeros_like(rewards))
    else:  # group
        key = [(s.adapter_slot, s.group_id) for s in samples]  # a group never spans two users' adapters
        groups = {g: i for i, g in enumerate(dict.fromkeys(key))}
        index = torch.tensor([groups[k] for k in key])
        adv = grpo_advantages(rewards, has, index, algo.normalize_std)
        sizes = Counter(k for k, s in zip(key, samples) if s.reward is not None)
        single = torch.tensor([sizes[k] == 1 for k in key]) & has
        if algo.singleton_baseline == "ema" and bool(single.any()):
            ema, baselines = ema_advantages(rewards, single, [baseline_key(s) for s in samples], baselines,
                                            algo.ema_decay)
            adv = torch.where(single, ema, adv)
        elif algo.singleton_baseline == "none":
            adv = torch.where(single, rewards, adv)
    return {s.sample_id: float(a) for s, a, h in zip(samples, adv, has) if h}, baselines


def plan_batch(samples: list[Sample], algo: AlgoConfig, trainer_version: int, baselines: dict[str, float],
               slots: int = 1) -> tuple[BatchPlan, dict[str, float]]:
    """Drop stale samples and samples of slots past `slots`; the scalar-reward advantages of the rest."""
    staleness = Counter(trainer_version - min(s.versions) for s in samples)
    bound = algo.step_max_staleness
    fresh = [s for s in samples if bound < 0 or s.ingested or trainer_version - min(s.versions) <= bound]
    kept = [s for s in fresh if s.adapter_slot < slots]
    advantages, baselines = rl_sample_advantages(kept, algo, baselines)
    plan = BatchPlan(kept, advantages, len(samples) - len(fresh), staleness, len(fresh) - len(kept))
    if algo.balance == "std":
        plan.rl_scale, plan.opd_scale = balance_scales(*batch_signals(kept, advantages, algo))
    return plan, baselines


def batch_signals(samples: list[Sample], rl_advantage: dict[str, float], algo: AlgoConfig) -> tuple[Tensor, Tensor]:
    """The batch's RL advantage of every rewarded response token, and OPD's advantage of every teacher-scored
    one, shaped as the loss shapes it (centring, clipping) but against the rollout log-probs: the trained
    policy's own are known only inside each micro-batch."""
    rl = [rl_advantage[s.sample_id] for s in samples if s.sample_id in rl_advantage for m in s.loss_mask if m]
    taught = [s for s in samples if has_opd_signal(s, algo.opd_baseline)]
    if not taught:
        return torch.tensor(rl, dtype=torch.float64), torch.zeros(0, dtype=torch.float64)
    gap, _, trained = _opd_against_rollout(taught, algo.opd_center == "sample", algo.opd_clip, algo.opd_baseline)
    return torch.tensor(rl, dtype=torch.float64), gap[trained]


def has_opd_signal(s: Sample, opd_baseline: str) -> bool:
    """Whether OPD scores the sample: a teacher, and with opd_baseline=teacher also its unhinted scores."""
    return s.teacher_logprobs is not None and (opd_baseline == "student" or s.teacher_unhinted_logprobs is not None)


def _opd_against_rollout(taught: list[Sample], center: bool, clip: float, opd_baseline: str = "student",
                        dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor, Tensor]:
    """OPD's shaped advantage of every response token of `taught` (samples with OPD's signal) against the rollout
    log-probs (opd_baseline=teacher: the unhinted teacher's), each token's sample index, and whether the loss
    trains the token."""
    index = torch.tensor([i for i, s in enumerate(taught) for _ in range(s.response_len)], dtype=torch.long)
    trained = flat_field(taught, "loss_mask").bool()
    against = "teacher_unhinted_logprobs" if opd_baseline == "teacher" else "rollout_logprobs"
    teacher, baseline = (flat_field(taught, field, dtype=dtype) for field in ("teacher_logprobs", against))
    gap = shaped_opd_advantages(teacher, baseline, torch.ones_like(trained), trained, index, center, clip)
    return gap, index, trained


# ---------------------------------------------------------------- one micro-batch
def flat_field(samples: list[Sample], field: str, fill: float = 0.0, dtype: torch.dtype = torch.float32) -> Tensor:
    """One per-token field of every sample, end to end (`fill` for each token of a sample that lacks it)."""
    values: list[float] = []
    for s in samples:
        v = getattr(s, field)
        values += v if v is not None else [fill] * s.response_len
    return torch.tensor(values, dtype=dtype)


def _per_token(samples: list[Sample], field: str) -> Tensor:
    """A per-sample number repeated for each of the sample's response tokens."""
    return torch.tensor([float(getattr(s, field)) for s in samples for _ in range(s.response_len)])


def _teacher_temperature_differs(samples: list[Sample]) -> bool:
    """Whether some teacher scored at another temperature than its sample was drawn at (e.g. SGLang: raw logits)."""
    return any(s.teacher_logprobs is not None and s.teacher_temperature != s.temperature for s in samples)


def _topk_inputs(samples: list[Sample]) -> Optional[tuple[Tensor, Tensor, Tensor]]:
    """(ids [R, k], teacher log-probs [R, k], has-top-k [R]) or None when no sample has a top-k teacher."""
    k = max((len(s.teacher_topk_ids[0]) for s in samples if s.teacher_topk_ids), default=0)
    if k == 0:
        return None
    ids, lps, has = [], [], []
    for s in samples:
        ok = bool(s.teacher_topk_ids) and len(s.teacher_topk_ids[0]) == k
        for t, tok in enumerate(s.tokens[s.prompt_len:]):
            ids.append(s.teacher_topk_ids[t] if ok else [tok] * k)
            lps.append(s.teacher_topk_logprobs[t] if ok else [0.0] * k)
            has.append(ok)
    return torch.tensor(ids), torch.tensor(lps, dtype=torch.float32), torch.tensor(has)


# Every rank reports every one of these, in this order, so data-parallel ranks reduce lists that line up
# (a rank without top-k data, or without any sample, reports zeros).
SUM_KEYS = ("pg_loss", "tokens", "entropy_sum", "clip_low", "clip_high", "dual_clip", "approx_kl_old_sum",
            "logprob_abs_diff_sum", "kl_rollout_sum", "tis_sum", "tis_clipped", "kl_ref_sum", "topk_kl_sum",
            "topk_tokens", "adv_rl_sum", "adv_rl_sq", "adv_rl_tokens", "adv_opd_sum", "adv_opd_sq", "adv_opd_tokens")
MAX_KEYS = ("tis_max",)


class Sums(dict):
    """The step's metric sums: a fixed set of keys, all starting at 0."""

    def __init__(self) -> None:
        super().__init__({k: 0.0 for k in SUM_KEYS + MAX_KEYS})

    def add(self, key: str, value) -> None:
        if key not in SUM_KEYS:
            raise KeyError(f"{key} is not a step metric (add it to SUM_KEYS)")
        self[key] += float(value)

    def max(self, key: str, value) -> None:
        self[key] = max(self[key], float(value))


@dataclass
class OldLogprobs:
    """The policy before the step, per sample: log-probs at the sample's temperature, and at its teacher's."""

    at_sample: dict[str, Tensor]
    at_teacher: dict[str, Tensor]


def _at_teacher_temperature(policy: Policy, samples: list[Sample], packed, hidden: Tensor, at_sample: Tensor,
                            chunk_tokens: int) -> Tensor:
    """The OPD baseline: the student's log p at the temperature its teacher was scored at (detached)."""
    if not _teacher_temperature_differs(samples):
        return at_sample.detach()
    with torch.no_grad():
        return logprobs_and_entropy(policy, hidden.detach(), packed.targets, _per_token(samples, "teacher_temperature"),
                                    chunk_tokens)[0]


def _student_logprobs(policy: Policy, samples: list[Sample], packed, chunk_tokens: int,
                      topk_ids: Optional[Tensor]) -> tuple[Tensor, Tensor, Optional[Tensor], Tensor]:
    """log p (with grad), entropy and top-k log p at each sample's temperature, and the OPD baseline."""
    hidden = response_hidden(policy, packed)
    logp, entropy, topk = logprobs_and_entropy(policy, hidden, packed.targets, _per_token(samples, "temperature"),
                                               chunk_tokens, topk_ids)
    return logp, entropy, topk, _at_teacher_temperature(policy, samples, packed, hidden, logp, chunk_tokens)


def pack_samples(policy: Policy, samples: list[Sample]) -> Packed:
    """The samples in one packed row (a prefix tree with trainer.share_prefixes); with LoRA, each sample's tokens
    routed to its adapter slot."""
    slots = [s.adapter_slot for s in samples] if policy.lora is not None else None
    return pack([s.tokens for s in samples], [s.prompt_len for s in samples], slots, policy.share_prefixes)


@dataclass
class Totals:
    """Response tokens and samples of a minibatch over all ranks, per adapter slot: the loss means' denominators."""

    tokens: dict[int, int]
    samples: dict[int, int]

    @classmethod
    def of(cls, samples: list[Sample]) -> "Totals":
        tokens, count = Counter(), Counter()
        for s in samples:
            tokens[s.adapter_slot] += sum(s.loss_mask)
            count[s.adapter_slot] += 1
        return cls(dict(tokens), dict(count))

    def per_token(self, samples: list[Sample], sample_index: Tensor) -> tuple[Tensor, Tensor]:
        """The token and sample totals of each response token's slot (`sample_index`: each token's sample)."""
        dev = sample_index.device
        tokens = torch.tensor([float(self.tokens[s.adapter_slot]) for s in samples], device=dev)
        count = torch.tensor([float(self.samples[s.adapter_slot]) for s in samples], device=dev)
        return tokens[sample_index], count[sample_index]


def token_advantages(samples: list[Sample], plan: BatchPlan, algo: AlgoConfig, student: Tensor, sample_index: Tensor,
                     loss_mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(RL's, OPD's and the combined advantage) of every response token of `samples`, laid end to end;
    `student`: the policy's log-prob of each token before the step, at its teacher's temperature (OPD's
    baseline with algo.opd_baseline=student; with teacher, the teacher's own unhinted log-probs replace it)."""
    dev = student.device
    has_reward = torch.tensor([s.sample_id in plan.rl_advantage for s in samples], device=dev)
    sample_adv = torch.tensor([plan.rl_advantage.get(s.sample_id, 0.0) for s in samples], device=dev)
    has_teacher = torch.tensor([has_opd_signal(s, algo.opd_baseline) for s in samples], device=dev)[sample_index]
    baseline = flat_field(samples, "teacher_unhinted_logprobs").to(dev) if algo.opd_baseline == "teacher" else student
    a_rl = rl_token_advantages(sample_adv, has_reward, sample_index)
    a_opd = shaped_opd_advantages(flat_field(samples, "teacher_logprobs").to(dev), baseline, has_teacher, loss_mask,
                                  sample_index, algo.opd_center == "sample", algo.opd_clip)
    weights = (algo.w_rl * plan.rl_scale, algo.w_opd * plan.opd_weight * plan.opd_scale)
    return a_rl, a_opd, combined_token_advantages(a_rl, a_opd, *weights)


def micro_batch_loss(policy: Policy, samples: list[Sample], plan: BatchPlan, algo: AlgoConfig, totals: Totals,
                     chunk_tokens: int, old: Optional[OldLogprobs], ref_policy: Optional[Policy], sums: Sums) -> Tensor:
    packed = pack_samples(policy, samples)
    topk = _topk_inputs(samples) if algo.w_topk else None
    logp, entropy, student_topk, opd_base = _student_logprobs(policy, samples, packed, chunk_tokens,
                                                              None if topk is None else topk[0])
    dev = logp.device
    idx = packed.sample_index.to(dev)
    old_lp = logp.detach()
    if old is not None:
        old_lp = torch.cat([old.at_sample[s.sample_id] for s in samples]).to(dev)
        opd_base = torch.cat([old.at_teacher[s.sample_id] for s in samples]).to(dev)
    mask = flat_field(samples, "loss_mask").to(dev)
    rollout = flat_field(samples, "rollout_logprobs").to(dev)
    has_reward = torch.tensor([s.sample_id in plan.rl_advantage for s in samples], device=dev)
    has_teacher = torch.tensor([has_opd_signal(s, algo.opd_baseline) for s in samples], device=dev)[idx]
    a_rl, a_opd, adv = token_advantages(samples, plan, algo, opd_base, idx, mask)
    pg, low, high, dual = ppo_clipped_token_loss(logp, old_lp, adv, algo.eps_clip_low, algo.eps_clip_high, algo.dual_clip)
    tis = truncated_importance_weights(old_lp, rollout, algo.tis_cap) if algo.tis_cap else torch.ones_like(pg)
    tokens_per_sample = torch.tensor([float(sum(s.loss_mask)) for s in samples], device=dev)
    total_tokens, total_samples = totals.per_token(samples, idx)
    weights = aggregation_weights(idx, mask, algo.loss_aggregation, total_tokens, total_samples, tokens_per_sample)
    loss = (pg * tis * weights).sum()
    sums.add("pg_loss", loss.detach())
    if ref_policy is not None and algo.kl_coef:
        with torch.no_grad():
            ref_lp = packed_logprobs_entropy(ref_policy, packed, _per_token(samples, "temperature"), chunk_tokens)[0]
        kl = kl_estimate(logp, ref_lp, algo.kl_estimator)
        loss = loss + algo.kl_coef * (kl * weights).sum()
        sums.add("kl_ref_sum", (kl.detach() * mask).sum())
    if algo.entropy_coef:
        loss = loss - algo.entropy_coef * (entropy * weights).sum()
    if topk is not None:
        has_topk = topk[2].to(dev).float() * mask
        kl_topk = topk_reverse_kl(student_topk, topk[1].to(dev))
        loss = loss + algo.w_topk * (kl_topk * weights * topk[2].to(dev)).sum()
        sums.add("topk_kl_sum", (kl_topk.detach() * has_topk).sum())
        sums.add("topk_tokens", has_topk.sum())
    # metrics (sums over tokens, divided once the batch is done)
    m = mask
    sums.add("tokens", m.sum())
    sums.add("entropy_sum", (entropy.detach() * m).sum())
    sums.add("clip_low", (low.float() * m).sum())
    sums.add("clip_high", (high.float() * m).sum())
    sums.add("dual_clip", (dual.float() * m).sum())
    sums.add("approx_kl_old_sum", (kl_estimate(logp.detach(), old_lp, "k3") * m).sum())
    sums.add("logprob_abs_diff_sum", ((rollout - old_lp).abs() * m).sum())
    sums.add("kl_rollout_sum", (kl_estimate(rollout, old_lp, "k3") * m).sum())  # KL(behaviour || trained policy)
    sums.add("tis_sum", (tis * m).sum())
    if algo.tis_cap:
        sums.add("tis_clipped", ((torch.exp(old_lp - rollout) > algo.tis_cap).float() * m).sum())
    sums.max("tis_max", tis.max() if tis.numel() else 0.0)
    rl_tok, opd_tok = has_reward[idx].float() * m, has_teacher.float() * m
    for name, a, w in (("rl", a_rl, rl_tok), ("opd", a_opd, opd_tok)):
        sums.add(f"adv_{name}_sum", (a.detach() * w).sum())
        sums.add(f"adv_{name}_sq", (a.detach() ** 2 * w).sum())
        sums.add(f"adv_{name}_tokens", w.sum())
    return loss


# ---------------------------------------------------------------- the step
def _old_logprobs(policy: Policy, samples: list[Sample], max_tokens: int, chunk_tokens: int) -> OldLogprobs:
    old = OldLogprobs({}, {})
    with torch.no_grad():
        for mb in micro_batches(samples, max_tokens, policy.share_prefixes):
            packed = pack_samples(policy, mb)
            at_sample, _, _, at_teacher = _student_logprobs(policy, mb, packed, chunk_tokens, None)
            lengths = [s.response_len for s in mb]
            for s, a, b in zip(mb, at_sample.cpu().split(lengths), at_teacher.cpu().split(lengths)):
                old.at_sample[s.sample_id], old.at_teacher[s.sample_id] = a, b
    return old


def minibatch_shards(samples: list[Sample], minibatches: int, dp_rank: int,
                     dp: int) -> list[tuple[Totals, list[Sample]]]:
    """Each non-empty minibatch as (its totals over all ranks, this rank's share of it)."""
    out = []
    for part in range(minibatches):
        minibatch = samples[part::minibatches]
        if minibatch:
            out.append((Totals.of(minibatch), dp_shard(minibatch, dp_rank, dp)))
    return out


def train_step(policy: Policy, optimizer, samples: list[Sample], algo: AlgoConfig, max_tokens_per_microbatch: int,
               chunk_tokens: int = 1024, dp_rank: int = 0, dp: int = 1, trainer_version: int = 0,
               baselines: Optional[dict[str, float]] = None, ref_policy: Optional[Policy] = None,
               opd_signal: Optional[OpdSignalWindow] = None) -> dict[str, Any]:
    """One trainer step on the whole batch; with dp > 1, this rank works on its share. Updates `baselines` (and
    `opd_signal`, the window algo.opd_gate reads)."""
    baselines = {} if baselines is None else baselines
    slots = policy.lora.shape.slots if policy.lora is not None else 1
    plan, new_baselines = plan_batch(samples, algo, trainer_version, baselines, slots)
    baselines.clear()
    baselines.update(new_baselines)
    if opd_signal is not None:
        opd_signal.add(plan.samples)
        plan.opd_weight = opd_signal.gate()
    shards = minibatch_shards(plan.samples, algo.minibatches, dp_rank, dp)
    passes = algo.ppo_epochs * algo.minibatches
    # with several optimizer steps per batch, the ratio is against the policy from before the first one;
    # this rank computes it for exactly the samples it will train on
    mine = [s for _, shard in shards for s in shard]
    old = _old_logprobs(policy, mine, max_tokens_per_microbatch, chunk_tokens) if passes > 1 else None
    sums, opt = Sums(), {"grad_norm": 0.0, "lr": 0.0}
    for _ in range(algo.ppo_epochs):
        for totals, shard in shards:
            optimizer.zero_grad()
            for mb in micro_batches(shard, max_tokens_per_microbatch, policy.share_prefixes):
                loss = micro_batch_loss(policy, mb, plan, algo, totals, chunk_tokens, old, ref_policy, sums)
                loss.backward()
            # every rank steps, with or without samples (it joins the all-reduces); LoRA: the slots with data
            opt = optimizer.step(slots=totals.tokens) if isinstance(optimizer, SlotAdamW) else optimizer.step()
    stats = _report(plan, samples, sums, opt, passes, dp)
    if opd_signal is not None:
        stats.update(opd_gate=plan.opd_weight, opd_signal_auc=opd_signal.auc())
    if algo.balance != "none":
        stats.update(balance_rl_scale=plan.rl_scale, balance_opd_scale=plan.opd_scale)
    return stats


def _report(plan: BatchPlan, samples: list[Sample], sums: Sums, opt: dict, passes: int, dp: int) -> dict[str, Any]:
    s = dict(zip(SUM_KEYS, all_reduce_sum([sums[k] for k in SUM_KEYS], dp)))
    s["tis_max"] = all_reduce_max(sums["tis_max"], dp)
    tok = max(s.get("tokens", 0.0), 1.0)

    def mean_std(name: str) -> tuple[float, float]:
        n = max(s.get(f"adv_{name}_tokens", 0.0), 1.0)
        mean = s.get(f"adv_{name}_sum", 0.0) / n
        return mean, max(s.get(f"adv_{name}_sq", 0.0) / n - mean**2, 0.0) ** 0.5

    rl_mean, rl_std = mean_std("rl")
    opd_mean, opd_std = mean_std("opd")
    kept = plan.samples
    n = max(len(kept), 1)
    rewards = [x.reward for x in kept if x.reward is not None]
    stats = {
        "pg_loss": s.get("pg_loss", 0.0) / passes, **opt,
        "entropy": s.get("entropy_sum", 0.0) / tok,
        "clip_frac_low": s.get("clip_low", 0.0) / tok, "clip_frac_high": s.get("clip_high", 0.0) / tok,
        "dual_clip_frac": s.get("dual_clip", 0.0) / tok,
        "approx_kl_old": s.get("approx_kl_old_sum", 0.0) / tok,
        "kl_ref": s.get("kl_ref_sum", 0.0) / tok,
        "topk_kl": s.get("topk_kl_sum", 0.0) / max(s.get("topk_tokens", 0.0), 1.0),
        "logprob_abs_diff": s.get("logprob_abs_diff_sum", 0.0) / tok,
        "kl_rollout": s.get("kl_rollout_sum", 0.0) / tok,
        "tis_mean": s.get("tis_sum", 0.0) / tok, "tis_max": s["tis_max"], "tis_clip_frac": s.get("tis_clipped", 0.0) / tok,
        "adv_rl_mean": rl_mean, "adv_rl_std": rl_std, "adv_opd_mean": opd_mean, "adv_opd_std": opd_std,
        "frac_reward": sum(x.reward is not None for x in kept) / n,
        "frac_teacher": sum(x.teacher_logprobs is not None for x in kept) / n,
        "frac_topk": sum(x.teacher_topk_ids is not None for x in kept) / n,
        "frac_both": sum(x.reward is not None and x.teacher_logprobs is not None for x in kept) / n,
        "samples": len(samples), "samples_trained": len(kept), "dropped_stale_trainer": plan.dropped_stale,
        "dropped_no_slot": plan.dropped_no_slot,
        "response_tokens": int(sum(sum(x.loss_mask) for x in kept)), "tokens": sum(len(x.tokens) for x in kept),
        "reward_mean": sum(rewards) / len(rewards) if rewards else 0.0,
        "hint_rate": sum(x.teacher_logprobs is not None for x in samples) / max(len(samples), 1),
    }
    stats.update({f"staleness_hist_{k}": v for k, v in sorted(plan.staleness.items())})
    stats.update(per_slot_stats(kept))
    return stats


def per_slot_stats(samples: list[Sample]) -> dict[str, float]:
    """Each adapter slot's sample count and mean reward, when the batch is not all slot 0 (lora.per_user)."""
    slots = sorted({s.adapter_slot for s in samples})
    if slots in ([], [0]):
        return {}
    out: dict[str, float] = {}
    for k in slots:
        mine = [s for s in samples if s.adapter_slot == k]
        rewards = [s.reward for s in mine if s.reward is not None]
        out[f"samples_slot{k}"] = len(mine)
        out[f"reward_mean_slot{k}"] = sum(rewards) / len(rewards) if rewards else 0.0
    return out
