"""LoRA on the Megatron policy: a zero B is the base, merging is exact, TP and DP take the same step, the PEFT
export gives the trainer's logits, and several users' adapters train in one step as each would alone."""
from __future__ import annotations

import copy
import json

import msgspec
import pytest
import torch

from clawr1.config import AlgoConfig, TrainerConfig
from clawr1.protocol import Sample
from clawr1.trainer.lora import TARGETS, LoraAdapters, LoraShape, merge_into
from clawr1.trainer.model import build_policy, full_logits, load_megatron_state, megatron_state, pack
from clawr1.trainer.optim import SlotAdamW
from clawr1.trainer.step import train_step
from tests.trainer.lora_worker import set_random_b
from tests.numerics import assert_all_close, assert_close, forward_depth, grad_depth
from tests.trainer.test_parallel import assert_same_weights, run_ranks, synthetic_samples

ROWS = [[1, 5, 7, 9, 11, 3, 4, 8], [2, 8, 6, 5, 4, 3, 2, 1, 9, 12]]


def attach(policy, slots: int = 1, seed: int = 0, random_b: bool = True) -> LoraAdapters:
    policy.model.requires_grad_(False)
    policy.lora = LoraAdapters(policy.model, policy.arch, LoraShape(4, 8.0, TARGETS, slots), 1, 0, seed=seed)
    if random_b:
        set_random_b(policy.lora, seed=seed + 100, tp=1, tp_rank=0)
    return policy.lora


def logits(policy, slots=None) -> torch.Tensor:
    with torch.no_grad():
        return full_logits(policy, pack(ROWS, [1, 1], slots))


def test_a_zero_b_is_the_base_and_an_unrouted_sample_sees_the_base(tiny_model, megatron_tp1):
    policy = build_policy(tiny_model)
    base = logits(policy)
    adapters = attach(policy, slots=2, random_b=False)
    assert all(float(b.abs().max()) == 0.0 for b in adapters.b.values())
    assert all(float(a.abs().max()) > 0.0 for a in adapters.a.values())
    for slots in (None, [0, 1], [1, -1]):
        assert torch.equal(logits(policy, slots), base)
    set_random_b(adapters, seed=5, tp=1, tp_rank=0)
    n = len(ROWS[0])
    routed = logits(policy, [1, -1])
    assert (routed[:n] - base[:n]).abs().max() > 1e-2  # slot 1 changes its sample
    assert torch.equal(routed[n:], base[n:])  # the sample routed to -1 is the base, bit for bit
    assert not torch.allclose(logits(policy, [0, 0]), logits(policy, [1, 1]))  # slots are distinct adapters


def test_a_reset_slot_is_a_fresh_adapter_and_the_other_slot_keeps_its_own(tiny_model, megatron_tp1):
    policy = build_policy(tiny_model)
    adapters = attach(policy, slots=2, random_b=False)
    fresh = {k: v.clone() for k, v in adapters.state_dict().items()}
    set_random_b(adapters, seed=7, tp=1, tp_rank=0)
    with torch.no_grad():
        for p in adapters.slot_parameters(1):
            p.add_(0.5)  # slot 1 trained: A and B moved
    trained_slot_0 = {k: v.clone() for k, v in adapters.state_dict().items() if k.endswith("_0")}
    adapters.reset_slot(1)
    state = adapters.state_dict()
    assert all(torch.equal(state[k], fresh[k]) for k in fresh if k.endswith("_1"))
    assert all(torch.equal(state[k], v) for k, v in trained_slot_0.items())

    adapters.reset_slot(1, seed=11)  # a Tinker client's own seed: another A, the same for the same seed
    seeded = {k: v.clone() for k, v in adapters.state_dict().items() if k.endswith("_1")}
    assert all(not torch.equal(seeded[k], fresh[k]) for k in seeded if k.startswith("a."))  # every A redrawn
    adapters.reset_slot(1, seed=11)
    assert all(torch.equal(adapters.state_dict()[k], v) for k, v in seeded.items())


def test_merged_and_unmerged_logits_agree(tiny_model, megatron_tp1):
    """In float64, so the gap is rounding only: merged (W + BA)x and unmerged Wx + B(Ax) are the same sums in
    another order, at float64's eps (in float32 the rounding would hide a small error in the merge)."""
    policy = build_policy(tiny_model, dtype=torch.float64)
    adapters = attach(policy, slots=2)
    for slot in (0, 1):
        unmerged = logits(policy, [slot, slot])
        assert (unmerged - logits(policy, [-1, -1])).abs().max() > 1e-2
        state = megatron_state(policy.model)
        adapters.remove()
        load_megatron_state(policy.model, merge_into(state, adapters, slot))
        merged = full_logits(policy, pack(ROWS, [1, 1]))
        assert_close(merged, unmerged, torch.float64, forward_depth(tiny_model), what="merged logits")
        load_megatron_state(policy.model, state)
        adapters = attach(policy, slots=2)


@pytest.fixture(scope="module")
def two_user_samples(tmp_path_factory):
    samples = synthetic_samples(8, seed=21, topk=0)
    for i, s in enumerate(samples):
        s.adapter_slot = i % 2
    path = tmp_path_factory.mktemp("lora") / "samples.bin"
    path.write_bytes(msgspec.msgpack.encode(samples))
    return path


@pytest.fixture(scope="module")
def single_rank(tiny_model, two_user_samples, tmp_path_factory):
    return run_ranks_lora(tiny_model, two_user_samples, tmp_path_factory.mktemp("lora1") / "tp1.pt", world=1, tp=1)


def run_ranks_lora(model, samples, out, world: int, tp: int, **options) -> dict:
    return run_ranks(model, samples, out, world, tp, worker="tests.trainer.lora_worker", **options)


# TP=2 and DP=2 promise one process's step as the same sums in another order (tests/trainer/test_parallel.py's
# error model): the logits are a forward pass, the gradients a forward and a backward one
def assert_same_lora_logits(a: dict, b: dict, model) -> None:
    assert_close(b["logits"], a["logits"], torch.float32, forward_depth(model), what="logits")


def assert_same_lora_step(a: dict, b: dict, model) -> None:
    assert_same_lora_logits(a, b, model)
    depth = grad_depth(model)
    # the loss averages per-token terms (ratio x advantage, entropy) of order 1: their scale, not the mean's
    assert_close(b["loss"], a["loss"], torch.float32, forward_depth(model) + 2, max(1.0, abs(a["loss"])), "loss")
    for slot in (0, 1):
        norm = f"grad_norm_slot{slot}"
        assert_close(b["stats"][norm], a["stats"][norm], torch.float32, depth + 1, what=norm)  # relative: a norm
        assert a["stats"][norm] > 1e-3  # clipping (at 1e-3) was active in each slot
        assert_all_close(b["grads"][slot], a["grads"][slot], torch.float32, depth, what=f"slot {slot} grads")
        assert_same_weights(a["weights"][slot], b["weights"][slot], a["grads"][slot], depth, slope=1e-3 / 1e-6,
                            what=f"slot {slot} weights")  # lr / adam_eps of the worker


def test_tensor_parallel_2_equals_one_process(tiny_model, two_user_samples, single_rank, tmp_path):
    tp2 = run_ranks_lora(tiny_model, two_user_samples, tmp_path / "tp2.pt", world=2, tp=2)
    assert_same_lora_step(single_rank, tp2, tiny_model)


def test_the_tp_comparison_fails_on_an_off_by_one_in_the_split_of_b(tiny_model, two_user_samples, single_rank,
                                                                       tmp_path):
    """The bound above is strict enough to catch a real defect: the worker (a copy of the split, not the real
    code) plants an off-by-one in one layer's TP split of B, each rank's rows starting one row late."""
    planted = run_ranks_lora(tiny_model, two_user_samples, tmp_path / "planted.pt", world=2, tp=2,
                             plant="b_split_off_by_one")
    with pytest.raises(AssertionError, match="logits"):
        assert_same_lora_logits(single_rank, planted, tiny_model)
    with pytest.raises(AssertionError):
        assert_same_lora_step(single_rank, planted, tiny_model)


def test_data_parallel_2_equals_one_process(tiny_model, two_user_samples, single_rank, tmp_path):
    dp2 = run_ranks_lora(tiny_model, two_user_samples, tmp_path / "dp2.pt", world=2, tp=1)
    # before the step, a DP rank runs the whole model on the same rows as one process: bit for bit; the step then
    # adds the ranks' gradients in another order
    assert torch.equal(dp2["logits"], single_rank["logits"])
    assert_same_lora_step(single_rank, dp2, tiny_model)


def test_the_peft_export_loaded_by_peft_gives_the_trainers_logits(tiny_model, megatron_tp1, tmp_path):
    """Through a real checkpoint and `clawr1 export`: one PEFT adapter per slot, under HF module names."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from clawr1.trainer import checkpoint
    from clawr1.trainer.export import export_checkpoint

    policy = build_policy(tiny_model)
    adapters = attach(policy, slots=2, seed=7)
    layout = {"rank": 4, "alpha": 8.0, "targets": list(TARGETS), "slots": 2}
    meta = checkpoint.CheckpointMeta(step=1, version=1, last_batch_id=1, base_model=str(tiny_model), tp=1, dp=1,
                                     family=policy.arch.family, lora=layout)
    opt = SlotAdamW([adapters.slot_parameters(k) for k in range(2)], TrainerConfig(), 10, 1, 1)
    ckpt = checkpoint.save(tmp_path / "ckpt", meta, adapters, opt)
    out = export_checkpoint(ckpt, tmp_path / "export")
    config = json.loads((out / "slot1" / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["peft_type"]) == (4, 8.0, "LORA")
    assert set(config["target_modules"]) == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    ids = torch.tensor([ROWS[0]])
    for slot in (0, 1):
        hf = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
        peft_model = PeftModel.from_pretrained(hf, str(out / f"slot{slot}")).eval()
        with torch.no_grad():
            theirs = peft_model(input_ids=ids).logits[0]
        ours = logits(policy, [slot, slot])[: len(ROWS[0])]
        # PEFT on transformers and LoRA on megatron: the same layers, the same sums in another order
        assert_close(ours, theirs, torch.float32, forward_depth(tiny_model), what="PEFT logits")
        assert (theirs - logits(policy, [-1, -1])[: len(ROWS[0])]).abs().max() > 1e-2  # the adapter was applied


class GradRecorder:
    """Keeps each adapter parameter's gradient instead of stepping."""

    def __init__(self, adapters: LoraAdapters):
        self.adapters, self.grads = adapters, None

    def zero_grad(self):
        self.adapters.zero_grad(set_to_none=True)

    def step(self):
        self.grads = {n: (p.grad.clone() if p.grad is not None else torch.zeros_like(p))
                      for n, p in self.adapters.named_parameters()}
        return {"grad_norm": 0.0, "lr": 0.0}


def user_samples() -> tuple[list[Sample], list[Sample]]:
    """User A (slot 0): two samples of group g0; user B (slot 1): one sample that also says group g0."""
    pool = synthetic_samples(6, seed=33, topk=0)
    a1, a2, b = pool[0], pool[1], pool[2]
    for s, slot, reward in ((a1, 0, 1.0), (a2, 0, -1.0), (b, 1, 1.0)):
        s.adapter_slot, s.group_id, s.reward = slot, "g0", reward
    return [a1, a2], [b]


def test_a_mixed_batch_gives_each_user_the_gradient_of_their_own_batch(tiny_model, megatron_tp1):
    policy = build_policy(tiny_model)
    adapters = attach(policy, slots=2, seed=9)
    user_a, user_b = user_samples()
    algo = AlgoConfig(w_rl=1.0, w_opd=0.5)

    def grads(samples):
        recorder = GradRecorder(adapters)
        train_step(policy, recorder, copy.deepcopy(samples), algo, max_tokens_per_microbatch=100_000)
        return recorder.grads

    mixed = grads([user_a[0], user_b[0], user_a[1]])
    alone_a, alone_b = grads(user_a), grads(user_b)
    # each user's gradient from a mixed pack against their own pack: the same sums in another order
    for suffix, alone in (("_0", alone_a), ("_1", alone_b)):
        names = [n for n in mixed if n.endswith(suffix)]
        assert_all_close({n: mixed[n] for n in names}, {n: alone[n] for n in names}, torch.float32,
                         grad_depth(tiny_model), what=f"slot{suffix} grads")
    assert max(float(g.abs().max()) for n, g in alone_a.items() if n.endswith("_1")) == 0.0  # B's slot untouched by A
    assert max(float(g.abs().max()) for n, g in alone_b.items() if n.endswith("_1")) > 0.0
    # B's lone sample is a group of one (GRPO advantage 0 from the group): its gradient comes from the OPD signal
    # and the EMA baseline; had B's "g0" been grouped with A's, B's advantage would differ and so would the gradient


def adam_state(opt: SlotAdamW, slot: int) -> list[torch.Tensor]:
    inner = opt.slots[slot].optimizer
    return [t.clone() for st in inner.state.values() for t in st.values()]


def test_an_idle_slot_keeps_its_adapter_and_its_adam_state(tiny_model, megatron_tp1):
    policy = build_policy(tiny_model)
    adapters = attach(policy, slots=3, seed=13)
    opt = SlotAdamW([adapters.slot_parameters(k) for k in range(3)], TrainerConfig(lr=1e-3), 10, 1, 1)
    samples = synthetic_samples(6, seed=41, topk=0)
    for i, s in enumerate(samples):  # a GRPO pair per slot, one sample rewarded and one not
        s.adapter_slot, s.group_id, s.reward = i % 3, f"g{i % 3}", 1.0 if i < 3 else -1.0
    algo = AlgoConfig(w_rl=1.0, w_opd=0.5)
    assert not any(p.requires_grad for p in policy.model.parameters())  # the base is frozen
    held = {id(p) for slot in opt.slots for group in slot.optimizer.param_groups for p in group["params"]}
    assert held == {id(p) for p in adapters.parameters()}  # the optimizer holds the adapters only
    first = train_step(policy, opt, samples, algo, max_tokens_per_microbatch=100_000)
    assert first["slots_stepped"] == 3
    before = {k: [p.detach().clone() for p in adapters.slot_parameters(k)] for k in range(3)}
    state_before = adam_state(opt, 2)
    assert state_before  # slot 2 was stepped once: it has moments to keep
    second = train_step(policy, opt, [s for s in samples if s.adapter_slot != 2], algo, max_tokens_per_microbatch=100_000)
    assert second["slots_stepped"] == 2 and "grad_norm_slot2" not in second
    assert all(p.grad is None or float(p.grad.abs().max()) == 0.0 for p in adapters.slot_parameters(2))
    assert all(torch.equal(p, q) for p, q in zip(adapters.slot_parameters(2), before[2]))
    assert all(torch.equal(t, u) for t, u in zip(adam_state(opt, 2), state_before))
    assert opt.slots[2].scheduler.last_epoch == 1 and opt.slots[0].scheduler.last_epoch == 2
    assert any(not torch.equal(p, q) for p, q in zip(adapters.slot_parameters(0), before[0]))


def test_a_checkpoint_holds_the_adapters_and_their_optimizer_state(tiny_model, megatron_tp1, tmp_path):
    from clawr1.trainer import checkpoint

    policy = build_policy(tiny_model)
    adapters = attach(policy, slots=2, seed=17)
    opt = SlotAdamW([adapters.slot_parameters(k) for k in range(2)], TrainerConfig(lr=1e-3), 10, 1, 1)
    samples = synthetic_samples(4, seed=43, topk=0)
    for i, s in enumerate(samples):
        s.adapter_slot = i % 2
    train_step(policy, opt, samples, AlgoConfig(), max_tokens_per_microbatch=100_000)
    layout = {"rank": 4, "alpha": 8.0, "targets": list(TARGETS), "slots": 2}
    meta = checkpoint.CheckpointMeta(step=1, version=1, last_batch_id=1, base_model=str(tiny_model), tp=1, dp=1,
                                     family=policy.arch.family, lora=layout)
    ckpt = checkpoint.save(tmp_path, meta, adapters, opt)
    saved = torch.load(ckpt / "rank000.pt", weights_only=False)["model"]
    assert set(saved) == {f"{ab}.{k}" for ab in "ab" for k in adapters.a}  # the adapters only, not the frozen base

    fresh_policy = build_policy(tiny_model)
    fresh = attach(fresh_policy, slots=2, seed=99, random_b=False)
    fresh_opt = SlotAdamW([fresh.slot_parameters(k) for k in range(2)], TrainerConfig(lr=1e-3), 10, 1, 1)
    checkpoint.load(ckpt, fresh, fresh_opt, 1, 1, layout)
    assert all(torch.equal(p, q) for p, q in zip(fresh.parameters(), adapters.parameters()))
    for slot in (0, 1):
        assert all(torch.equal(t, u) for t, u in zip(adam_state(fresh_opt, slot), adam_state(opt, slot)))
    with pytest.raises(ValueError, match="lora section must match"):
        checkpoint.load(ckpt, fresh, fresh_opt, 1, 1, {**layout, "rank": 8})
    with pytest.raises(ValueError, match="full weights"):
        checkpoint.load(ckpt, fresh_policy.model, None, 1, 1, {})
