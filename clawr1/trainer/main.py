"""`clawr1 train`: the trainer loop, top to bottom.

    build the Megatron policy from the HF weights
    repeat run.max_steps times:
        ask the pool for the next batch (wait while it has too few samples)
        one optimizer step on it
        publish the new weights to the engines (version = step)
        commit the batch to the pool
"""
from __future__ import annotations

import logging
import time

import torch

from clawr1 import bus
from clawr1.config import Config
from clawr1.protocol import Batch, BatchRequest, Commit, NoBatch
from clawr1.runtime import mark_ready, setup_logging, stop_event
from clawr1.tinymodel.build import resolve_model_path
from clawr1.tracking import MetricsWriter
from clawr1.trainer.megatron_setup import init_parallel, shutdown_parallel
from clawr1.trainer.model import build_policy
from clawr1.trainer.publish import WeightPublisher, gather_hf_state
from clawr1.trainer.step import train_step

log = logging.getLogger("clawr1.trainer")


class NoDataError(RuntimeError):
    """The pool produced no batch for longer than trainer.batch_wait_timeout_s."""


def wait_for_batch(pool: bus.RpcClient, version: int, last_batch_id: int, batch_size: int, timeout_s: float,
                   stop) -> Batch | None:
    deadline = time.monotonic() + timeout_s
    reported = 0.0
    while not stop.is_set():
        reply = pool.call(BatchRequest(trainer_version=version, last_batch_id=last_batch_id, batch_size=batch_size))
        if isinstance(reply, Batch):
            return reply
        assert isinstance(reply, NoBatch)
        if time.monotonic() > deadline:
            raise NoDataError(f"no batch from the pool in {timeout_s:.0f}s ({reply.reason}); is rollout producing samples?")
        if time.monotonic() - reported > 30:
            log.info("waiting for samples: %s", reply.reason)
            reported = time.monotonic()
        stop.wait(0.25)
    return None


def progress_line(step: int, max_steps: int, version: int, stats: dict) -> str:
    return (f"step {step}/{max_steps} | version {version} | samples {stats['samples']} | "
            f"reward {stats['reward_mean']:+.3f} | hint rate {stats['hint_rate']:.2f} | "
            f"loss {stats['pg_loss']:+.4f} | {stats['tokens_per_s']:.0f} tok/s")


def main(cfg: Config) -> int:
    setup_logging("trainer")
    stop = stop_event()
    torch.set_num_threads(cfg.trainer.num_threads)
    par = init_parallel(cfg.trainer.tensor_parallel, seed=cfg.run.seed)
    model_path = resolve_model_path(cfg.model)
    policy = build_policy(model_path, par.tp, par.tp_rank)
    t = cfg.trainer
    optimizer = torch.optim.AdamW(policy.model.parameters(), lr=t.lr, betas=tuple(t.adam_betas), weight_decay=t.weight_decay)
    pool = bus.RpcClient(cfg.pool_batches_addr, timeout_s=60.0)
    lead = par.rank == 0
    publisher = WeightPublisher(cfg, model_path) if lead else None
    metrics = MetricsWriter(cfg.run_dir, "trainer")
    mark_ready(cfg, "trainer")
    log.info("trainer ready: %s, tp=%d dp=%d, %d steps", policy.arch.family, par.tp, par.dp, cfg.run.max_steps)
    step, last_batch_id = 0, 0
    try:
        while step < cfg.run.max_steps:
            batch = wait_for_batch(pool, step, last_batch_id, cfg.pool.batch_size, t.batch_wait_timeout_s, stop)
            if batch is None:
                log.info("stopped before step %d", step + 1)
                return 0
            t0 = time.monotonic()
            stats = train_step(policy, optimizer, batch.samples, cfg.algo, t.max_tokens_per_microbatch, t.grad_clip)
            train_s = time.monotonic() - t0
            step += 1
            hf_state = gather_hf_state(policy)
            if publisher is not None:
                publisher.publish(hf_state, version=step, step=step)
            pool.call(Commit(batch_id=batch.batch_id))
            last_batch_id = batch.batch_id
            stats.update(
                tokens_per_s=stats["tokens"] / train_s, step_s=time.monotonic() - t0, train_s=train_s,
                staleness_mean=sum(step - 1 - min(s.versions) for s in batch.samples) / len(batch.samples),
                staleness_max=max(step - 1 - min(s.versions) for s in batch.samples),
                max_token_version=max(max(s.versions) for s in batch.samples), trained_at_version=step - 1,
                dropped_stale=batch.dropped_stale, pool_pending=batch.pending, batch_id=batch.batch_id, version=step,
            )
            metrics.log(stats, step=step)
            log.info(progress_line(step, cfg.run.max_steps, step, stats))
        if publisher is not None:
            versions = publisher.engine_versions()
            metrics.log({"final_engine_versions": versions, "final_version": step}, step=step)
            log.info("done: %d steps, engine weight versions %s", step, versions)
        return 0
    finally:
        pool.close()
        if publisher is not None:
            publisher.close()
        metrics.close()
        shutdown_parallel()
