"""One rank of a LoRA training step, for the TP/DP tests: `python -m tests.trainer.lora_worker MODEL SAMPLES OUT TP
[OPTIONS_JSON]` (options: {"plant": "b_split_off_by_one"} plants a defect, for the test that shows it is caught).

Attaches two adapter slots whose B is set from seeded HF-shaped matrices (so every TP layout holds the same
adapter), then saves on rank 0: the logits of a packed row through slot 1, and after one step, the loss,
the per-slot grad norms, and each slot's gradients and adapters in PEFT naming.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import msgspec
import torch
import torch.distributed as dist

from clawr1.config import AlgoConfig, TrainerConfig
from clawr1.protocol import Sample
from clawr1.trainer.convert import fuse_qkv
from clawr1.engine_api.lora import HF_MODULES_OF_TARGET
from clawr1.trainer.lora import LoraAdapters, LoraShape, full_shape, peft_tensors
from clawr1.trainer.megatron_setup import init_parallel
from clawr1.trainer.model import build_policy, full_logits, pack
from clawr1.trainer.optim import SlotAdamW
from clawr1.trainer.step import train_step


def hf_b(arch, target: str, rank: int, gen: torch.Generator) -> list[torch.Tensor]:
    """Random B of each HF module a target stands for (q, k, v / gate, up / one), full size."""
    out_f, _ = full_shape(arch, target)
    if target == "linear_qkv":
        rows = [arch.heads * arch.head_dim, arch.kv_heads * arch.head_dim, arch.kv_heads * arch.head_dim]
    elif target == "linear_fc1":
        rows = [arch.ffn, arch.ffn]
    else:
        rows = [out_f]
    assert len(rows) == len(HF_MODULES_OF_TARGET[target])
    return [torch.randn(n, rank, generator=gen) * 0.02 for n in rows]


def local_b(arch, target: str, parts: list[torch.Tensor], tp: int, tp_rank: int) -> torch.Tensor:
    """This rank's B, laid out as the full-weight conversion lays out the weight it adapts."""
    if target == "linear_qkv":
        return fuse_qkv(*parts, arch).chunk(tp, dim=0)[tp_rank]
    if target == "linear_fc1":
        return torch.cat([p.chunk(tp, dim=0)[tp_rank] for p in parts], dim=0)
    return parts[0]


def off_by_one_b(arch, target: str, parts: list[torch.Tensor], tp: int, tp_rank: int) -> torch.Tensor:
    """A planted defect, for the test that shows the TP comparison catches one: `local_b` with each rank's rows
    starting one row late (wrapping around), as an off-by-one in the split's offset would."""
    assert target == "linear_qkv"
    full = fuse_qkv(*parts, arch)
    rows = full.shape[0] // tp
    return full.roll(-1, dims=0)[tp_rank * rows:(tp_rank + 1) * rows]


def set_random_b(adapters: LoraAdapters, seed: int, tp: int, tp_rank: int, plant: str = "") -> None:
    """Seeded B in every slot; with plant="b_split_off_by_one", layer 0's QKV B is split off by one row."""
    with torch.no_grad():
        for slot in range(adapters.shape.slots):
            gen = torch.Generator().manual_seed(seed + slot)
            for layer in range(adapters.arch.num_layers):
                for target in adapters.shape.targets:
                    parts = hf_b(adapters.arch, target, adapters.shape.rank, gen)
                    planted = plant == "b_split_off_by_one" and layer == 0 and target == "linear_qkv"
                    split = off_by_one_b if planted else local_b
                    adapters.b[adapters.key(layer, target, slot)].copy_(split(adapters.arch, target, parts, tp, tp_rank))


def gather_peft(adapters: LoraAdapters, tensors_of_slot) -> dict | None:
    from megatron.core import parallel_state as ps

    mine = tensors_of_slot()
    shards = [mine] if adapters.tp == 1 else [None] * adapters.tp
    if adapters.tp > 1:
        dist.all_gather_object(shards, mine, group=ps.get_tensor_model_parallel_group())
    return peft_tensors(shards, adapters.arch, adapters.shape.targets) if dist.get_rank() == 0 else None


def main(model: str, samples_path: str, out: str, tp: int, options: dict) -> None:
    torch.set_num_threads(1)
    par = init_parallel(tp=tp, seed=0)
    policy = build_policy(model, tp, par.tp_rank)
    policy.model.requires_grad_(False)
    shape = LoraShape(rank=4, alpha=8.0, targets=("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"), slots=2)
    policy.lora = LoraAdapters(policy.model, policy.arch, shape, tp, par.tp_rank, seed=3)
    set_random_b(policy.lora, seed=11, tp=tp, tp_rank=par.tp_rank, plant=options.get("plant", ""))
    samples = msgspec.msgpack.decode(Path(samples_path).read_bytes(), type=list[Sample])
    with torch.no_grad():
        logits = full_logits(policy, pack([samples[0].tokens, samples[1].tokens], [1, 1], slots=[1, 0]))
    # a clip far below any real gradient's norm, so the test sees the clip act in each slot
    cfg = TrainerConfig(lr=1e-3, grad_clip=1e-3, adam_eps=1e-6)
    opt = SlotAdamW([policy.lora.slot_parameters(k) for k in range(2)], cfg, total_steps=10, tp=tp, dp=par.dp)
    stats = train_step(policy, opt, samples, AlgoConfig(w_rl=1.0, w_opd=0.5, entropy_coef=0.01),
                       max_tokens_per_microbatch=200, chunk_tokens=64, dp_rank=par.dp_rank, dp=par.dp)
    grads, weights = {}, {}
    for slot in range(2):
        def slot_grads(slot=slot):
            return {k: (p_a.grad.clone(), p_b.grad.clone()) for k, (p_a, p_b) in _slot_params(policy.lora, slot).items()}
        grads[slot] = gather_peft(policy.lora, slot_grads)
        weights[slot] = gather_peft(policy.lora, lambda slot=slot: policy.lora.host_state(slot))
    if dist.get_rank() == 0:
        torch.save({"logits": logits, "loss": stats["pg_loss"], "stats": stats, "grads": grads, "weights": weights}, out)
    dist.barrier()
    dist.destroy_process_group()


def _slot_params(adapters: LoraAdapters, slot: int) -> dict:
    return {f"{layer}_{target}": (adapters.a[adapters.key(layer, target, slot)], adapters.b[adapters.key(layer, target, slot)])
            for layer in range(adapters.arch.num_layers) for target in adapters.shape.targets}


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), json.loads(sys.argv[5]) if len(sys.argv) > 5 else {})
