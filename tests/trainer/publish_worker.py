"""One trainer rank gathering the HF state to publish, for tests/trainer/test_publish.py:
`python -m tests.trainer.publish_worker MODEL TP OUT_DIR` (RANK, WORLD_SIZE, MASTER_* from the environment).

Writes OUT_DIR/rankN.json: how many of its weights this rank copied to the host (Tensor.cpu calls on
them) while gathering, how many its own shard holds, and on rank 0 whether the gathered state is the
HF model's.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode

from clawr1.trainer.hf_io import load_hf_state
from clawr1.trainer.megatron_setup import init_parallel, shutdown_parallel
from clawr1.trainer.model import build_policy, megatron_state
from clawr1.trainer.publish import gather_hf_state


class HostCopies(TorchFunctionMode):
    """Counts the Tensor.cpu calls on this rank's weights made while it is active (on a CPU run such a call
    returns the tensor itself; on a GPU it is a copy of that weight)."""

    def __init__(self, weights: list[torch.Tensor]):
        super().__init__()
        self.weights = {t.data_ptr() for t in weights}
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.count += func is torch.Tensor.cpu and args[0].data_ptr() in self.weights
        return func(*args, **(kwargs or {}))


def main(model: str, tp: int, out: Path) -> None:
    torch.set_num_threads(1)
    par = init_parallel(tp=tp, seed=0)
    policy = build_policy(model, tp, par.tp_rank)
    own = list(megatron_state(policy.model).values())
    copies = HostCopies(own)
    with copies:
        state = gather_hf_state(policy)
    report = {"rank": par.rank, "tp_rank": par.tp_rank, "dp_rank": par.dp_rank, "host_copies": copies.count,
              "own_tensors": len(own), "gathered": state is not None}
    if state is not None:
        hf = load_hf_state(model)
        report["same_as_hf"] = sorted(state) == sorted(hf) and all(torch.equal(state[k], hf[k]) for k in hf)
    (out / f"rank{par.rank}.json").write_text(json.dumps(report))
    dist.barrier()
    shutdown_parallel()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]))
