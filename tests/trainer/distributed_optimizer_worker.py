"""megatron-core's distributed optimizer on CPU, for the resume test: `python -m tests.trainer.distributed_optimizer_worker`.

Without TransformerEngine (as here) megatron runs torch's AdamW behind its DistributedOptimizer.
Trains an uninterrupted run and a run that checkpoints after `split` steps and resumes in a fresh
model and optimizer (clawr1.trainer.checkpoint, as the trainer does), and writes both loss sequences.

Megatron's optimizer code names CUDA outright (tensors made on device="cuda", `.cuda()`, a check
that parameters are `torch.cuda.*Tensor`); `CudaOnCpu` maps those onto the CPU and changes nothing else.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode

from clawr1.config import AlgoConfig, TrainerConfig

from clawr1.ports import free_port
from clawr1.trainer import checkpoint
from clawr1.trainer.megatron_setup import _cpu_shims
from clawr1.trainer.model import build_policy
from clawr1.trainer.optim import MegatronDistributedAdam, wrap_ddp
from clawr1.trainer.step import train_step
from tests.trainer.test_parallel import synthetic_samples


def _on_cpu(device):
    if isinstance(device, int) or (isinstance(device, str) and device.startswith("cuda")):
        return "cpu"
    if isinstance(device, torch.device) and device.type == "cuda":
        return torch.device("cpu")
    return device


class CudaOnCpu(TorchFunctionMode):
    """CUDA placements become CPU ones; a CPU tensor's type() reads as its CUDA name."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if "device" in kwargs:
            kwargs["device"] = _on_cpu(kwargs["device"])
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            return func(*args).replace("torch.", "torch.cuda.", 1)
        if func is torch.Tensor.to:
            args = tuple(_on_cpu(a) if isinstance(a, (str, torch.device)) else a for a in args)
        return func(*args, **kwargs)


def init_megatron() -> None:
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    _cpu_shims()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    # with its gloo groups, which the distributed optimizer's checkpointing uses
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=1)
    model_parallel_cuda_manual_seed(0, inference_rng_tracker=True)


def fresh(model: str, steps: int):
    policy = build_policy(model)
    cfg = TrainerConfig(lr=1e-2, warmup_steps=0, lr_schedule="constant")
    return policy, MegatronDistributedAdam(wrap_ddp(policy.model), cfg, steps, bf16=False)


def losses(policy, optimizer, batches: list) -> list[float]:
    return [train_step(policy, optimizer, b, AlgoConfig(), max_tokens_per_microbatch=4096)["pg_loss"] for b in batches]


def main(model: str, out: str, steps: int, split: int) -> None:
    torch.set_num_threads(1)
    init_megatron()
    batches = [synthetic_samples(4, vocab=250, seed=s) for s in range(steps)]
    with CudaOnCpu():
        policy, optimizer = fresh(model, steps)
        straight = losses(policy, optimizer, batches)
        policy, optimizer = fresh(model, steps)
        resumed = losses(policy, optimizer, batches[:split])
        meta = checkpoint.CheckpointMeta(step=split, version=split, last_batch_id=split, base_model=model, tp=1, dp=1,
                                         family=policy.arch.family)
        path = checkpoint.save(Path(out).parent / "checkpoints", meta, policy.model, optimizer)
        policy, optimizer = fresh(model, steps)
        checkpoint.load(path, policy.model, optimizer, tp=1, dp=1)
        inner = type(optimizer.optimizer.chained_optimizers[0].optimizer).__module__
        resumed += losses(policy, optimizer, batches[split:])
    Path(out).write_text(json.dumps({"straight": straight, "resumed": resumed, "inner_optimizer": inner}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
