"""Process-group set-up for megatron-core, on CPU (gloo) or CUDA (nccl).

On CPU megatron-core 0.16 needs two shims: `torch.cuda.current_device` must
name the CPU, and the RNG tracker must come from
`model_parallel_cuda_manual_seed(seed, inference_rng_tracker=True)`.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class ParallelInfo:
    rank: int
    world_size: int
    tp: int
    dp: int
    tp_rank: int
    dp_rank: int
    device: torch.device


def _cpu_shims() -> None:
    torch.cuda.current_device = lambda: torch.device("cpu")  # type: ignore[assignment]


@contextlib.contextmanager
def _whole_world_groups_are_the_world():
    """While megatron makes its groups on CPU, one that holds every rank is the world group itself.

    Megatron makes about twenty groups, most of them of every rank when few processes run (all of
    them for one process), and every gloo group keeps a polling thread: twenty of them cost an idle
    live trainer ~2.5% of a core. The world group has the same members and serves the same collectives.
    """
    from megatron.core import parallel_state

    create = parallel_state.create_group

    def create_or_reuse(ranks=None, *args, backend=None, **kwargs):
        if ranks is not None and sorted(ranks) == list(range(dist.get_world_size())) and backend in (None, "gloo"):
            return dist.group.WORLD
        return create(ranks, *args, backend=backend, **kwargs)

    parallel_state.create_group = create_or_reuse
    try:
        yield
    finally:
        parallel_state.create_group = create


def init_parallel(tp: int = 1, seed: int = 0, master_port: int = 0) -> ParallelInfo:
    """Join (or create) the process group and megatron's model-parallel groups.

    Rank and world size come from the launcher's standard variables (RANK,
    WORLD_SIZE, MASTER_ADDR, MASTER_PORT); a lone process needs none of them.
    """
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    cuda = torch.cuda.is_available()
    if not cuda:
        _cpu_shims()
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    if world % tp:
        raise ValueError(f"world size {world} is not a multiple of tensor_parallel={tp}")
    if not dist.is_initialized():
        if cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count())
        backend = "nccl" if cuda else "gloo"
        if "MASTER_PORT" in os.environ:
            dist.init_process_group(backend, rank=rank, world_size=world)
        else:  # a lone process: its own rendezvous, without touching the environment its children inherit
            from clawr1.ports import free_port

            url = f"tcp://{os.environ.get('MASTER_ADDR', '127.0.0.1')}:{master_port or free_port()}"
            dist.init_process_group(backend, init_method=url, rank=rank, world_size=world)
    if not parallel_state.model_parallel_is_initialized():
        if cuda:
            parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
        else:  # every group is gloo already: no extra gloo copies (those are for NCCL runs), no duplicate world groups
            with _whole_world_groups_are_the_world():
                parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, create_gloo_process_groups=False)
    if cuda:
        model_parallel_cuda_manual_seed(seed)
    else:
        model_parallel_cuda_manual_seed(seed, inference_rng_tracker=True)
    torch.manual_seed(seed)
    return ParallelInfo(
        rank=rank, world_size=world, tp=tp, dp=world // tp,
        tp_rank=parallel_state.get_tensor_model_parallel_rank(), dp_rank=parallel_state.get_data_parallel_rank(),
        device=torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu"),
    )


def shutdown_parallel() -> None:
    from megatron.core import parallel_state

    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()
