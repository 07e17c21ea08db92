"""One rank of TP/DP training steps, for the parallelism tests: `python -m tests.trainer.parallel_worker JOBS TP`.

JOBS is a JSON file of jobs, each {"model", "samples", "out", "algo"}. For each, the rank builds a fresh policy,
reads the samples, takes one optimizer step and (on rank 0) saves the loss, the global grad norm, and the full
gradients and weights in HF naming. One process group takes every job: the tests share its start (torch and
megatron's imports, the rendezvous).
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
from clawr1.trainer.convert import megatron_to_hf
from clawr1.trainer.megatron_setup import init_parallel
from clawr1.trainer.model import build_policy
from clawr1.trainer.optim import TorchAdamW
from clawr1.trainer.step import train_step


def gather_hf(policy, tensors: dict) -> dict | None:
    from megatron.core import parallel_state as ps

    if policy.tp == 1:
        return megatron_to_hf([tensors], policy.arch) if dist.get_rank() == 0 else None
    shards = [None] * policy.tp
    dist.all_gather_object(shards, tensors, group=ps.get_tensor_model_parallel_group())
    return megatron_to_hf(shards, policy.arch) if dist.get_rank() == 0 else None


def main(jobs_path: str, tp: int) -> None:
    torch.set_num_threads(1)
    par = init_parallel(tp=tp, seed=0)
    for job in json.loads(Path(jobs_path).read_text()):
        torch.manual_seed(0)
        step(par, job["model"], job["samples"], job["out"], tp, job["algo"])
    dist.destroy_process_group()


def step(par, model: str, samples_path: str, out: str, tp: int, algo_overrides: dict) -> None:
    policy = build_policy(model, tp, par.tp_rank)
    samples = msgspec.msgpack.decode(Path(samples_path).read_bytes(), type=list[Sample])
    # a large eps keeps the first Adam update a smooth function of the gradient (not ~sign(g)), so
    # weights after the step can be compared as tightly as the gradients
    cfg = TrainerConfig(lr=1e-3, grad_clip=0.05, adam_eps=1e-3)
    opt = TorchAdamW(policy.model.parameters(), cfg, total_steps=10, tp=tp, dp=par.dp)
    # every objective at once: GRPO + EMA baselines, OPD, top-k KL, reference KL, entropy bonus, dual clip, TIS
    algo = AlgoConfig(**{"w_rl": 1.0, "w_opd": 0.5, "w_topk": 0.3, "kl_coef": 0.1, "entropy_coef": 0.01, "dual_clip": 3.0,
                         **algo_overrides})
    ref = build_policy(model, tp, par.tp_rank)
    with torch.no_grad():  # a reference that differs from the policy, so the KL term has a gradient
        for p in ref.model.parameters():
            p.mul_(0.98)
    stats = train_step(policy, opt, samples, algo, max_tokens_per_microbatch=200, chunk_tokens=64,
                       dp_rank=par.dp_rank, dp=par.dp, ref_policy=ref)
    named = dict(policy.model.named_parameters())
    grads = gather_hf(policy, {k: p.grad.detach().clone() for k, p in named.items()})
    weights = gather_hf(policy, {k: p.detach().clone() for k, p in named.items()})
    if dist.get_rank() == 0:
        torch.save({"loss": stats["pg_loss"], "grad_norm": stats["grad_norm"], "grads": grads, "weights": weights,
                    "stats": stats}, out)
    dist.barrier()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
