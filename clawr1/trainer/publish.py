"""Publishing weights: HF safetensors on disk, each engine told to load them (one at a time), a PUB note."""
from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path

import torch.distributed as dist

from clawr1 import bus, protocol
from clawr1.config import Config
from clawr1.protocol import WeightsPublished
from clawr1.serving.client import SyncEngineClient
from clawr1.trainer.convert import megatron_to_hf
from clawr1.trainer.hf_io import write_weights_dir
from clawr1.trainer.model import Policy, megatron_state

log = logging.getLogger("clawr1.trainer")


def gather_hf_state(policy: Policy) -> dict | None:
    """The full HF state dict on global rank 0 (TP shards gathered); None elsewhere."""
    own = {k: v.cpu() for k, v in megatron_state(policy.model).items()}
    if policy.tp == 1:
        return megatron_to_hf([own], policy.arch) if dist.get_rank() == 0 else None
    from megatron.core import parallel_state

    group = parallel_state.get_tensor_model_parallel_group()
    shards = [None] * policy.tp if dist.get_rank() == 0 else None
    if parallel_state.get_data_parallel_rank() == 0:
        dist.gather_object(own, shards, dst=dist.get_global_rank(group, 0), group=group)
    return megatron_to_hf(shards, policy.arch) if dist.get_rank() == 0 else None


class WeightPublisher:
    """Gets new weights into every engine, one engine at a time so the others keep serving.

    weight_sync=disk: safetensors in RUN_DIR/weights/vNNNNNN, then /update_weights_from_disk.
    weight_sync=nccl: NCCL broadcast from trainer rank 0 into SGLang engines, in buckets
    (clawr1/serving/weight_sync.py; GPU clusters only).
    """

    def __init__(self, cfg: Config, base_model_path: Path):
        self.base = Path(base_model_path)
        self.dir = cfg.run_dir / "weights"
        self.keep = cfg.trainer.keep_weight_versions
        self.engines = [SyncEngineClient(u) for u in cfg.engine_urls]
        self.pub = bus.pub_socket(cfg.publish_addr)
        self.nccl = None
        if cfg.trainer.weight_sync == "nccl":
            from clawr1.serving.weight_sync import DistributedWeightSync

            self.nccl = DistributedWeightSync(cfg.engine_urls, bucket_bytes=cfg.trainer.weight_sync_bucket_mb << 20)
            self.nccl.connect(cfg.trainer.host, 0, [cfg.serve.sglang.tp_size] * len(cfg.engine_urls))
        elif cfg.trainer.weight_sync != "disk":
            raise ValueError(f"trainer.weight_sync must be disk or nccl, got {cfg.trainer.weight_sync!r}")

    def publish(self, hf_state: dict, version: int, step: int) -> str:
        t0 = time.monotonic()
        if self.nccl is not None:
            import torch

            self.nccl.push([(k, v.to("cuda", non_blocking=True)) for k, v in hf_state.items()], version)
            where = "nccl"
            torch.cuda.synchronize()
        else:
            path = write_weights_dir(hf_state, self.dir / f"v{version:06d}", copy_from=self.base)
            for engine in self.engines:  # one engine at a time: the others keep serving
                engine.update_weights_from_disk(str(path.resolve()), version)
            where = str(path)
            self._prune(version)
        self.pub.send_multipart(protocol.encode(WeightsPublished(version=version, step=step, path=where,
                                                                 timestamp=time.time())))
        log.debug("published v%d in %.2fs", version, time.monotonic() - t0)
        return where

    def engine_versions(self) -> list[int]:
        return [int(e.model_info()["weight_version"]) for e in self.engines]

    def _prune(self, newest: int) -> None:
        for d in sorted(self.dir.glob("v[0-9]*")):
            if d.is_dir() and int(d.name[1:]) <= newest - self.keep:
                shutil.rmtree(d, ignore_errors=True)

    def close(self) -> None:
        for e in self.engines:
            e.close()
        if self.nccl is not None:
            self.nccl.close()
        self.pub.close(0)
