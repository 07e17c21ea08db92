"""Optimizer and learning-rate schedule.

CPU: torch AdamW with our own data-parallel gradient all-reduce and a
tensor-parallel-aware global grad-norm clip (megatron-core's optimizers
hard-code CUDA). CUDA: megatron-core's distributed optimizer (bf16 params with
fp32 main weights, sharded optimizer state, grad clipping) over megatron's DDP.
"""
from __future__ import annotations

import contextlib
import math
from typing import Callable, Iterable, Iterator, Optional

import torch

from clawr1.config import TrainerConfig
from clawr1.trainer.parallel import all_reduce_grads, clip_grad_norm


def lr_factor(cfg: TrainerConfig, total_steps: int) -> Callable[[int], float]:
    """Multiplier of the base lr after `step` optimizer steps."""

    def factor(step: int) -> float:
        if cfg.warmup_steps and step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        if cfg.lr_schedule == "constant":
            return 1.0
        span = max(total_steps - cfg.warmup_steps, 1)
        progress = min(max(step - cfg.warmup_steps, 0) / span, 1.0)
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


def _param_groups(params: list[torch.nn.Parameter], weight_decay: float) -> list[dict]:
    decay, no_decay = [], []
    for p in params:
        (decay if p.dim() >= 2 else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


class TorchAdamW:
    """AdamW + schedule + DP all-reduce + TP-aware clipping, for CPU (and plain CUDA) training."""

    def __init__(self, params: Iterable[torch.nn.Parameter], cfg: TrainerConfig, total_steps: int, tp: int, dp: int):
        self.params = [p for p in params if p.requires_grad]
        self.tp, self.dp, self.clip = tp, dp, cfg.grad_clip
        self.optimizer = torch.optim.AdamW(_param_groups(self.params, cfg.weight_decay), lr=cfg.lr,
                                           betas=tuple(cfg.adam_betas), eps=cfg.adam_eps)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_factor(cfg, total_steps))

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def step(self) -> dict[str, float]:
        all_reduce_grads(self.params, self.dp)
        norm = clip_grad_norm(self.params, self.clip, self.tp)
        lr = self.scheduler.get_last_lr()[0]
        self.optimizer.step()
        self.scheduler.step()
        return {"grad_norm": norm, "lr": lr}

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])


class SlotAdamW:
    """One TorchAdamW per LoRA slot, each with its own moments, schedule and grad-norm clip.

    A step moves only the slots it names (those with data in the minibatch): an idle user's adapter,
    Adam moments and lr schedule stay exactly as they were, and one user's gradient never scales another's.
    """

    def __init__(self, slot_params: list[list[torch.nn.Parameter]], cfg: TrainerConfig, total_steps: int, tp: int,
                 dp: int):
        self.slots = [TorchAdamW(params, cfg, total_steps, tp, dp) for params in slot_params]

    def zero_grad(self) -> None:
        for opt in self.slots:
            opt.zero_grad()

    def step(self, slots: Optional[Iterable[int]] = None) -> dict[str, float]:
        chosen = range(len(self.slots)) if slots is None else sorted(set(slots))
        stats = {k: self.slots[k].step() for k in chosen}
        out = {"grad_norm": math.sqrt(sum(s["grad_norm"] ** 2 for s in stats.values())),
               "lr": max((s["lr"] for s in stats.values()), default=0.0), "slots_stepped": len(stats)}
        out.update({f"grad_norm_slot{k}": s["grad_norm"] for k, s in stats.items()})
        return out

    def state_dict(self) -> dict:
        return {"slots": [opt.state_dict() for opt in self.slots]}

    def load_state_dict(self, state: dict) -> None:
        if len(state["slots"]) != len(self.slots):
            raise ValueError(f"the checkpoint holds {len(state['slots'])} LoRA slots, this run has {len(self.slots)} "
                             f"(lora.slots)")
        for opt, s in zip(self.slots, state["slots"]):
            opt.load_state_dict(s)


class MegatronDistributedAdam:
    """megatron-core's distributed optimizer (CUDA only). The model must be wrapped by `wrap_ddp`."""

    def __init__(self, ddp_model, cfg: TrainerConfig, total_steps: int, bf16: bool):
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        self.model = ddp_model
        config = OptimizerConfig(
            optimizer="adam", lr=cfg.lr, min_lr=cfg.lr * cfg.min_lr_ratio, weight_decay=cfg.weight_decay,
            adam_beta1=cfg.adam_betas[0], adam_beta2=cfg.adam_betas[1], adam_eps=cfg.adam_eps, bf16=bf16,
            params_dtype=torch.bfloat16 if bf16 else torch.float32, use_distributed_optimizer=True,
            clip_grad=cfg.grad_clip,
        )
        self.optimizer = get_megatron_optimizer(config, [ddp_model])
        self.factor = lr_factor(cfg, total_steps)
        self.base_lr, self.steps = cfg.lr, 0

    def zero_grad(self) -> None:
        self.model.zero_grad_buffer()
        self.optimizer.zero_grad()

    def step(self) -> dict[str, float]:
        lr = self.base_lr * self.factor(self.steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.model.finish_grad_sync()
        ok, grad_norm, _ = self.optimizer.step()
        if not ok:
            raise FloatingPointError("the distributed optimizer skipped a step (inf/nan gradients)")
        self.steps += 1
        return {"grad_norm": float(grad_norm or 0.0), "lr": lr}

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "steps": self.steps}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        untie_adam_steps(self.optimizer)
        self.steps = state["steps"]

    # The sharded Adam moments live outside state_dict(); megatron gathers them to one file (collective).
    def save_parameter_state(self, path: str) -> None:
        self.optimizer.save_parameter_state(path)

    def load_parameter_state(self, path: str) -> None:
        # no_grad: with fp32 params megatron's main params are views of the model's, which autograd forbids
        # copying into. The steps are set aside: megatron copies every key of a parameter's state from the
        # file, whose dp_zero layout holds no "step" (KeyError with torch's AdamW).
        with torch.no_grad(), _adam_steps_set_aside(self.optimizer):
            self.optimizer.load_parameter_state(path)


def _torch_optimizers(optimizer) -> list[torch.optim.Optimizer]:
    """The torch optimizers inside megatron's (a ChainedOptimizer holds one DistributedOptimizer per group)."""
    return [getattr(o, "optimizer", o) for o in getattr(optimizer, "chained_optimizers", [optimizer])]


def untie_adam_steps(optimizer) -> None:
    """Give each parameter's Adam state its own `step` tensor.

    Without TransformerEngine megatron's distributed optimizer runs torch's AdamW, and its
    load_state_dict hands every parameter one shared `step` tensor; AdamW increments a parameter's
    step in place, so the shared one would advance once per parameter at every step and the
    bias correction of the first step after a resume would be wrong. TE's FusedAdam keeps its step
    in the param groups: nothing to untie there.
    """
    for opt in _torch_optimizers(optimizer):
        for state in opt.state.values():
            if isinstance(state.get("step"), torch.Tensor):
                state["step"] = state["step"].detach().clone()


@contextlib.contextmanager
def _adam_steps_set_aside(optimizer) -> Iterator[None]:
    """Take each parameter's `step` out of its Adam state for the body, and put it back after."""
    held = [(state, state.pop("step")) for opt in _torch_optimizers(optimizer)
            for state in opt.state.values() if "step" in state]
    try:
        yield
    finally:
        for state, step in held:
            state["step"] = step


def wrap_ddp(model: torch.nn.Module):
    """megatron-core DDP with contiguous fp32 grad buffers, as the distributed optimizer needs (CUDA)."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    cfg = DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=False,
                                        use_distributed_optimizer=True)
    return DistributedDataParallel(config=model.config, ddp_config=cfg, module=model)
