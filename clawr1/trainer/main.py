"""`clawr1 train`: the trainer loop, top to bottom.

    build the Megatron policy from the HF weights (or resume from the newest checkpoint)
    repeat until run.max_steps (0: until stopped, as live runs do):
        rank 0 asks the pool for the batch after the last one trained; every rank gets it
        (no batch yet: wait, polling less often the longer nothing comes)
        one optimizer step (each data-parallel rank on its share)
        publish the new weights to the engines (weight version = steps taken)
        every trainer.checkpoint_every steps: checkpoint, then commit the batches to the pool
    on the last step or on SIGTERM: checkpoint what is not yet checkpointed

A batch is committed only once a checkpoint holds its effect, so after a crash
the trainer resumes from its checkpoint and the pool serves the uncommitted
batches again, identically: no acknowledged sample is lost or trained twice.
"""
from __future__ import annotations

import logging
import time
from typing import Optional

import torch
import torch.distributed as dist

from clawr1 import bus
from clawr1.config import Config
from clawr1.cpu_dtype import cpu_dtype
from clawr1.protocol import Batch
from clawr1.runtime import mark_ready, setup_logging, stop_event
from clawr1.model_path import resolve_model_path
from clawr1.tracking import MetricsWriter
from clawr1.triton_kernels import require_triton
from clawr1.trainer import checkpoint
from clawr1.trainer.megatron_setup import ParallelInfo, init_parallel, shutdown_parallel
from clawr1.trainer.model import Policy, build_policy
from clawr1.trainer.lora import LoraAdapters, LoraShape, peft_config
from clawr1.trainer.optim import MegatronDistributedAdam, SlotAdamW, TorchAdamW, wrap_ddp
from clawr1.trainer.pool_client import commit_batch, progress_line, wait_for_batch
from clawr1.trainer.publish import WeightPublisher, gather_adapters, gather_hf_state
from clawr1.trainer.step import OpdSignalWindow, train_step

log = logging.getLogger("clawr1.trainer")


def broadcast(obj, par: ParallelInfo):
    """Rank 0's object on every rank."""
    if par.world_size == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def use_transformer_engine(setting: str) -> bool:
    if setting == "off" or not torch.cuda.is_available():
        if setting == "on":
            raise RuntimeError("trainer.transformer_engine=on needs CUDA")
        return False
    try:
        import transformer_engine  # noqa: F401
    except ImportError:
        if setting == "on":
            raise RuntimeError("trainer.transformer_engine=on but transformer_engine is not installed") from None
        return False
    return True


def fused_kernels(names: list[str]) -> tuple[str, ...]:
    """trainer.fused_kernels, checked where the kernels will run: triton importable, and on a CPU its interpreter."""
    if not names:
        return ()
    require_triton(f"trainer.fused_kernels={names}", not torch.cuda.is_available(), "leave trainer.fused_kernels empty")
    return tuple(dict.fromkeys(names))


def build(cfg: Config, par: ParallelInfo, model_path) -> tuple[Policy, object]:
    t = cfg.trainer
    cuda = torch.cuda.is_available()
    dtype = torch.bfloat16 if t.precision == "bf16" else torch.float32
    if dtype == torch.bfloat16 and not cuda:
        dtype = cpu_base_dtype(cfg)
    policy = build_policy(model_path, par.tp, par.tp_rank, dtype=dtype, use_te=use_transformer_engine(t.transformer_engine),
                          fused=fused_kernels(t.fused_kernels))
    policy.share_prefixes = t.share_prefixes
    if cfg.lora.enabled:
        return policy, add_lora(policy, cfg, par)
    if cuda:
        policy.model.cuda()
        ddp = wrap_ddp(policy.model)
        return policy, MegatronDistributedAdam(ddp, t, cfg.run.max_steps, bf16=dtype == torch.bfloat16)
    return policy, TorchAdamW(policy.model.parameters(), t, cfg.run.max_steps, par.tp, par.dp)


def cpu_base_dtype(cfg: Config) -> torch.dtype:
    """trainer.precision=bf16 on CPU: the frozen base's dtype under fp32 adapters (fp32 where the CPU lacks bf16)."""
    if not cfg.lora.enabled:
        raise ValueError("trainer.precision=bf16 on CPU trains LoRA adapters over a frozen bf16 base: set "
                         "lora.enabled=true, or precision=fp32 (full-weight bf16 training needs CUDA's optimizer)")
    dtype, why = cpu_dtype(torch.bfloat16, cfg.run.cpu_bf16)
    if why:
        log.warning("trainer: %s", why)
    return dtype


def add_lora(policy: Policy, cfg: Config, par: ParallelInfo) -> SlotAdamW:
    """Freeze the base, attach the adapters, and give each slot its own AdamW over its adapters only.

    The adapters are small, so their optimizer is the plain one on GPU too (megatron's distributed optimizer
    shards state that is not worth sharding here, and its buffers would cover the frozen base)."""
    lc = cfg.lora
    policy.model.requires_grad_(False)
    shape = LoraShape(rank=lc.rank, alpha=lc.alpha, targets=tuple(lc.targets), slots=lc.slots)
    policy.lora = LoraAdapters(policy.model, policy.arch, shape, par.tp, par.tp_rank, seed=lc.init_seed)
    if torch.cuda.is_available():
        policy.model.cuda()
        policy.lora.cuda()
    return SlotAdamW([policy.lora.slot_parameters(k) for k in range(lc.slots)], cfg.trainer, cfg.run.max_steps,
                     par.tp, par.dp)


class Trainer:
    def __init__(self, cfg: Config, par: ParallelInfo):
        self.cfg, self.par = cfg, par
        self.lead = par.rank == 0
        self.model_path = resolve_model_path(cfg.model)
        self.policy, self.optimizer = build(cfg, par, self.model_path)
        self.pool = bus.RpcClient(cfg.pool_batches_addr, timeout_s=60.0) if self.lead else None
        self.publisher = WeightPublisher(cfg, self.model_path) if self.lead else None
        self.metrics = MetricsWriter(cfg.run_dir, "trainer") if self.lead else None
        self.ckpt_root = cfg.run_dir / "checkpoints"
        self.step = self.last_batch_id = 0
        self.checkpointed_step = 0  # the newest step a checkpoint holds
        self.baselines: dict[str, float] = {}  # per-task EMA reward baselines (algo.singleton_baseline=ema)
        # algo.opd_gate=signal: recent samples' teacher gaps and scores (not checkpointed: refilled after a resume)
        gate = cfg.algo.opd_gate == "signal"
        self.opd_signal = OpdSignalWindow(cfg.algo.opd_gate_window, cfg.algo.opd_baseline) if gate else None
        self.ref_policy = None
        if cfg.algo.kl_coef:  # the frozen initial policy, for the KL regularizer
            self.ref_policy = build_policy(self.model_path, par.tp, par.tp_rank, dtype=self.policy.model.config.params_dtype,
                                           use_te=use_transformer_engine(cfg.trainer.transformer_engine),
                                           fused=fused_kernels(cfg.trainer.fused_kernels))
            self.ref_policy.model.requires_grad_(False)
            if torch.cuda.is_available():
                self.ref_policy.model.cuda()

    def resume(self) -> None:
        path = broadcast(checkpoint.latest(self.ckpt_root) if self.lead else None, self.par)
        if path is None:
            log.info("no checkpoint to resume from in %s: starting fresh", self.ckpt_root)
            self.publish()  # engines that outlived the crash get the initial weights back, as version 0
            return
        meta = checkpoint.load(path, self.trainable, self.optimizer, self.par.tp, self.par.dp, self.lora_layout)
        self.step, self.last_batch_id, self.baselines = meta.step, meta.last_batch_id, dict(meta.baselines)
        self.checkpointed_step = self.step
        log.info("resumed from %s: step %d, batch %d", path, self.step, self.last_batch_id)
        if self.lead and self.last_batch_id:
            commit_batch(self.pool, self.last_batch_id)  # the crash may have come before it
        # The engines may hold weights of steps after the checkpoint, which are lost: they get the
        # checkpoint's weights back under the checkpoint's version, so versions keep counting steps.
        self.publish()

    @property
    def trainable(self) -> torch.nn.Module:
        """What the trainer changes, so what a checkpoint holds: the adapters with LoRA (the base is frozen)."""
        return self.policy.lora if self.policy.lora is not None else self.policy.model

    @property
    def lora_layout(self) -> dict:
        return self.cfg.lora.model_dump(include={"rank", "alpha", "targets", "slots"}) if self.cfg.lora.enabled else {}

    @property
    def version(self) -> int:
        """The weight version of the current weights: the number of steps they have taken."""
        return self.step

    def publish(self) -> int:
        """Hand the new weights to the engines; returns the bytes handed over (0 on other ranks)."""
        lc = self.cfg.lora
        if lc.serves_adapters:
            adapters = gather_adapters(self.policy)
            if self.lead:
                config = peft_config(self.policy.lora.shape, str(self.model_path))
                self.publisher.publish_adapters(adapters, config, version=self.version, step=self.step)
                return sum(t.nbytes for slot in adapters.values() for t in slot.values())
            return 0
        hf_state = gather_hf_state(self.policy)
        if self.lead:
            self.publisher.publish(hf_state, version=self.version, step=self.step)
            return sum(t.nbytes for t in hf_state.values())
        return 0

    def checkpoint_and_commit(self, force: bool = False) -> None:
        every = self.cfg.trainer.checkpoint_every
        if every and (force or self.step % every == 0):
            meta = checkpoint.CheckpointMeta(step=self.step, version=self.version, last_batch_id=self.last_batch_id,
                                             base_model=str(self.model_path), tp=self.par.tp, dp=self.par.dp,
                                             family=self.policy.arch.family, baselines=dict(self.baselines),
                                             lora=self.lora_layout)
            checkpoint.save(self.ckpt_root, meta, self.trainable, self.optimizer, self.cfg.trainer.keep_checkpoints)
            self.checkpointed_step = self.step
        if self.lead and (not every or force or self.step % every == 0):
            commit_batch(self.pool, self.last_batch_id)

    def next_batch(self, stop) -> Optional[Batch]:
        batch = None
        if self.lead:
            live = self.cfg.run.mode == "live"  # no traffic is normal for a live run: wait as long as it takes
            batch = wait_for_batch(self.pool, self.version, self.last_batch_id, self.cfg.pool.batch_size,
                                   None if live else self.cfg.trainer.batch_wait_timeout_s, stop)
        return broadcast(batch, self.par)

    def train_one(self, batch: Batch) -> dict:
        t = self.cfg.trainer
        t0 = time.monotonic()
        stats = train_step(self.policy, self.optimizer, batch.samples, self.cfg.algo, t.max_tokens_per_microbatch,
                           t.logprob_chunk_tokens, self.par.dp_rank, self.par.dp, trainer_version=self.version,
                           baselines=self.baselines, ref_policy=self.ref_policy, opd_signal=self.opd_signal)
        train_s = time.monotonic() - t0
        trained_at = self.version
        self.step += 1
        self.last_batch_id = batch.batch_id
        t1 = time.monotonic()
        published_bytes = self.publish()
        publish_s = time.monotonic() - t1
        self.checkpoint_and_commit()
        stale = [trained_at - min(s.versions) for s in batch.samples]
        stats.update(
            tokens_per_s=stats["tokens"] / train_s, train_s=train_s, step_s=time.monotonic() - t0,
            publish_s=publish_s, published_bytes=published_bytes,
            staleness_mean=sum(stale) / len(stale), staleness_max=max(stale),
            max_token_version=max(max(s.versions) for s in batch.samples), trained_at_version=trained_at,
            dropped_stale=batch.dropped_stale, pool_pending=batch.pending, batch_id=batch.batch_id, version=self.version,
        )
        return stats

    def run(self, stop) -> int:
        max_steps = self.cfg.run.max_steps
        while not max_steps or self.step < max_steps:
            batch = self.next_batch(stop)
            if batch is None:
                log.info("stop requested before step %d", self.step + 1)
                break
            stats = self.train_one(batch)
            if self.lead:
                self.metrics.log(stats, step=self.step)
                log.info(progress_line(self.step, max_steps, self.version, stats))
        if self.cfg.trainer.checkpoint_every and self.step > self.checkpointed_step:
            self.checkpoint_and_commit(force=True)  # the final state, or the state at a stop, is always resumable
            log.info("checkpointed step %d", self.step)
        if self.lead and not stop.is_set():
            versions = self.publisher.engine_versions()
            self.metrics.log({"final_engine_versions": versions, "final_version": self.version}, step=self.step)
            log.info("done: %d steps, engine weight versions %s", self.step, versions)
        return 0

    def close(self) -> None:
        for closable in (self.pool, self.publisher, self.metrics):
            if closable is not None:
                closable.close()


def main(cfg: Config) -> int:
    setup_logging("trainer")
    stop = stop_event()
    if cfg.trainer.backend == "tinker":  # every step through Tinker's API: no model, no torch.distributed here
        from clawr1.trainer.tinker_client_trainer import main as train_through_tinker

        return train_through_tinker(cfg, stop)
    torch.set_num_threads(cfg.trainer.num_threads)
    par = init_parallel(cfg.trainer.tensor_parallel, seed=cfg.run.seed)
    if par.dp != cfg.trainer.data_parallel:
        raise ValueError(f"{par.world_size} processes with tensor_parallel={par.tp} give data_parallel={par.dp}, "
                         f"but the config says trainer.data_parallel={cfg.trainer.data_parallel}")
    trainer = Trainer(cfg, par)
    try:
        if cfg.trainer.resume:
            trainer.resume()
        if par.rank == 0:
            mark_ready(cfg, "trainer")
        log.info("trainer ready: %s, tp=%d dp=%d, step %d of %d", trainer.policy.arch.family, par.tp, par.dp,
                 trainer.step, cfg.run.max_steps)
        return trainer.run(stop)
    finally:
        trainer.close()
        shutdown_parallel()
