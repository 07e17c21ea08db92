"""Data-parallel and tensor-parallel bookkeeping for one training step (gloo or nccl)."""
from __future__ import annotations

import torch
import torch.distributed as dist

from clawr1.protocol import Sample


def _groups():
    from megatron.core import parallel_state as ps

    return ps.get_data_parallel_group(), ps.get_tensor_model_parallel_group()


def dp_shard(samples: list[Sample], dp_rank: int, dp: int) -> list[Sample]:
    """This DP rank's share: samples dealt longest-first to the rank with the fewest tokens so far.

    Deterministic, so every rank computes the same split without talking.
    """
    if dp == 1:
        return list(samples)
    loads = [0] * dp
    owner = {}
    for i in sorted(range(len(samples)), key=lambda i: (-len(samples[i].tokens), i)):
        r = min(range(dp), key=lambda r: (loads[r], r))
        owner[i] = r
        loads[r] += len(samples[i].tokens)
    return [s for i, s in enumerate(samples) if owner[i] == dp_rank]


def all_reduce_grads(params: list[torch.nn.Parameter], dp: int) -> None:
    """Sum gradients over data-parallel ranks (each rank's loss is already divided by the global token count)."""
    if dp == 1:
        return
    dp_group, _ = _groups()
    for p in params:
        if p.grad is None:  # a rank with no samples still joins every all-reduce
            p.grad = torch.zeros_like(p)
        dist.all_reduce(p.grad, group=dp_group)


def clip_grad_norm(params: list[torch.nn.Parameter], max_norm: float, tp: int) -> float:
    """Global gradient norm over the whole model (TP shards counted once each, replicas once), then clip.

    Every rank gets the same norm, so every rank scales its shard by the same factor:
    the update equals the single-process one.
    """
    sharded = torch.zeros((), dtype=torch.float64)
    replicated = torch.zeros((), dtype=torch.float64)
    for p in params:
        if p.grad is None:
            continue
        sq = p.grad.detach().double().pow(2).sum().cpu()
        if getattr(p, "tensor_model_parallel", False):
            sharded += sq
        else:
            replicated += sq
    if tp > 1:
        _, tp_group = _groups()
        sharded = _all_reduced(sharded, tp_group)
    norm = float((sharded + replicated).sqrt())
    if max_norm > 0 and norm > max_norm:
        scale = max_norm / (norm + 1e-6)
        for p in params:
            if p.grad is not None:
                p.grad.mul_(scale)
    return norm


def _all_reduced(value: torch.Tensor, group, op=dist.ReduceOp.SUM) -> torch.Tensor:
    """All-reduce a CPU tensor on the group's own device (NCCL reduces CUDA tensors only), back on the CPU."""
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl" else torch.device("cpu")
    t = value.to(device)
    dist.all_reduce(t, op=op, group=group)
    return t.cpu()


def all_reduce_sum(values: list[float], dp: int) -> list[float]:
    """Sum plain numbers (metrics) over data-parallel ranks."""
    if dp == 1:
        return values
    dp_group, _ = _groups()
    return _all_reduced(torch.tensor(values, dtype=torch.float64), dp_group).tolist()


def all_reduce_max(value: float, dp: int) -> float:
    if dp == 1:
        return value
    dp_group, _ = _groups()
    return float(_all_reduced(torch.tensor([value], dtype=torch.float64), dp_group, dist.ReduceOp.MAX)[0])
