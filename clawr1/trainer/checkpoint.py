"""Trainer checkpoints: written to a temporary directory, renamed into place when complete.

    RUN_DIR/checkpoints/step000012/
        meta.json         step, weight version, last trained batch id, model and parallel layout
        rank000.pt ...    per rank: its model shard (with LoRA: its adapters only), optimizer state, RNG states

Only whole checkpoints carry a `stepNNNNNN` name, so `latest` never returns a
half-written one, whatever moment the process died at.
"""
from __future__ import annotations

import json
import random
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

import torch
import torch.distributed as dist


@dataclass
class CheckpointMeta:
    step: int
    version: int
    last_batch_id: int
    base_model: str
    tp: int
    dp: int
    family: str
    baselines: dict = field(default_factory=dict)  # per-task EMA reward baselines
    lora: dict = field(default_factory=dict)  # LoRA's rank, alpha, targets and slots; empty: full weights


def _rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    try:
        from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

        state["megatron"] = get_cuda_rng_tracker().get_states()
    except Exception:  # the tracker only exists after init_parallel
        pass
    return state


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
    if "megatron" in state:
        from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

        get_cuda_rng_tracker().set_states(state["megatron"])


def parameter_state_file(ckpt: Path, model_parallel_rank: int) -> Path:
    """The distributed optimizer's state of one model-parallel shard (written by its data-parallel rank 0).

    Every tensor-parallel rank holds a different shard, so each writes its own file, as Megatron-LM's
    mp_rank_XX directories do; one shared name would let the ranks overwrite each other."""
    return ckpt / f"optimizer_parameter_state_mp{model_parallel_rank:03d}.pt"


def _model_parallel_rank() -> int:
    from megatron.core import parallel_state

    return parallel_state.get_tensor_model_parallel_rank()


def step_dir(root: Path, step: int) -> Path:
    return root / f"step{step:06d}"


def save(root: Path, meta: CheckpointMeta, model: torch.nn.Module, optimizer, keep: int = 2) -> Path:
    """Collective: every rank writes its shard; rank 0 publishes the directory once all are written."""
    rank = dist.get_rank()
    final = step_dir(root, meta.step)
    tmp = final.with_name(final.name + ".tmp")
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "rng": _rng_state()},
               tmp / f"rank{rank:03d}.pt")
    if hasattr(optimizer, "save_parameter_state"):  # megatron's distributed optimizer (CUDA): one file per TP shard
        optimizer.save_parameter_state(str(parameter_state_file(tmp, _model_parallel_rank())))
    dist.barrier()
    if rank == 0:
        (tmp / "meta.json").write_text(json.dumps(asdict(meta), indent=1))
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        for old in sorted(root.glob("step[0-9]*"))[:-keep]:
            if old.is_dir() and not old.name.endswith(".tmp"):
                shutil.rmtree(old, ignore_errors=True)
    dist.barrier()
    return final


def latest(root: Path) -> Optional[Path]:
    done = [d for d in sorted(root.glob("step[0-9]*")) if d.is_dir() and (d / "meta.json").exists()
            and not d.name.endswith(".tmp")]
    return done[-1] if done else None


def read_meta(path: Path) -> CheckpointMeta:
    return CheckpointMeta(**json.loads((path / "meta.json").read_text()))


def load(path: Path, model: torch.nn.Module, optimizer, tp: int, dp: int, lora: Optional[dict] = None) -> CheckpointMeta:
    meta = read_meta(path)
    if (meta.tp, meta.dp) != (tp, dp):
        raise ValueError(f"checkpoint {path} was written with tp={meta.tp} dp={meta.dp}; this run has tp={tp} dp={dp}. "
                         f"Export it (clawr1 export) and start from the HF weights instead.")
    if meta.lora != (lora or {}):
        raise ValueError(f"checkpoint {path} holds {'LoRA ' + str(meta.lora) if meta.lora else 'full weights'}; this run "
                         f"trains {'LoRA ' + str(lora) if lora else 'full weights'} (the lora section must match)")
    state = torch.load(path / f"rank{dist.get_rank():03d}.pt", weights_only=False)
    model.load_state_dict(state["model"])
    if optimizer is not None:
        optimizer.load_state_dict(state["optimizer"])
        if hasattr(optimizer, "load_parameter_state"):
            optimizer.load_parameter_state(str(parameter_state_file(path, _model_parallel_rank())))
    _set_rng_state(state["rng"])
    return meta
