"""`clawr1 train` with trainer.backend=tinker: each step through Tinker's API, no GPU on this machine.

    connect to Tinker (tinker.base_url; the key from the variable tinker.api_key_env, never logged or written)
    a LoRA training client of tinker.base_model, rank tinker.lora_rank (or, to resume, the newest save_state)
    save sampler weights; the engines (serve.backend=tinker) switch to them as version = steps taken
    repeat until run.max_steps (0: until stopped):
        the next batch from the pool, planned as the Megatron trainer plans it (clawr1/trainer/tinker_client_plan.py)
        forward_backward(datums, tinker.loss_fn) -> optim_step(AdamParams) -> save_weights_for_sampler
        the engines switch to the new sampler; WeightsPublished tells every loop
        every trainer.checkpoint_every steps: save_state, its path kept in RUN_DIR/checkpoints/tinker.json, then
        the batches are committed to the pool (a crash resumes from that state and is served them again)
"""
from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any, Optional

import orjson

from clawr1 import bus
from clawr1.config import Config
from clawr1.model_path import resolve_model_path, tinker_base_model
from clawr1.protocol import Batch
from clawr1.runtime import mark_ready, write_atomically
from clawr1.tracking import MetricsWriter
from clawr1.trainer.optim import lr_factor
from clawr1.trainer.pool_client import commit_batch, progress_line, wait_for_batch
from clawr1.trainer.publish import WeightPublisher
from clawr1.trainer.step import plan_batch
from clawr1.trainer.tinker_client_plan import PlannedDatum, planned_datums, ppo_loss_config

log = logging.getLogger("clawr1.trainer")


class TinkerSetupError(RuntimeError):
    """Tinker cannot be used as configured (no SDK, no key): the message says what to set."""


def service_client(cfg: Config) -> Any:
    """Tinker's ServiceClient for tinker.base_url with the key from tinker.api_key_env."""
    try:
        import tinker
    except ImportError:
        raise TinkerSetupError("trainer.backend=tinker needs the Tinker SDK: pip install 'clawr1[tinker]' "
                               "(tinker==0.38.0)") from None
    key = os.environ.get(cfg.tinker.api_key_env)
    if not key:
        raise TinkerSetupError(f"trainer.backend=tinker: set the environment variable {cfg.tinker.api_key_env} "
                               "(tinker.api_key_env) to your Tinker API key")
    return tinker.ServiceClient(base_url=cfg.tinker.base_url or None, api_key=key)


def sdk_datum(d: PlannedDatum) -> Any:
    from tinker import types

    return types.Datum(model_input=types.ModelInput.from_ints(d.model_input),
                       loss_fn_inputs={"target_tokens": d.target_tokens, "logprobs": d.logprobs,
                                       "advantages": d.advantages})


class CheckpointLog:
    """RUN_DIR/checkpoints/tinker.json: the save_state paths, newest last, each with the trainer's counters."""

    def __init__(self, root: Path, keep: int):
        self.path, self.keep = root / "tinker.json", keep

    def entries(self) -> list[dict]:
        try:
            return orjson.loads(self.path.read_bytes())["checkpoints"]
        except FileNotFoundError:
            return []

    def latest(self) -> Optional[dict]:
        entries = self.entries()
        return entries[-1] if entries else None

    def add(self, entry: dict) -> None:
        kept = (self.entries() + [entry])[-self.keep:]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(self.path, orjson.dumps({"checkpoints": kept}, option=orjson.OPT_INDENT_2).decode())


class TinkerTrainer:
    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.timeout_s = cfg.tinker.request_timeout_s
        self.service = service_client(cfg)
        self.base_model = tinker_base_model(cfg.tinker, resolve_model_path(cfg.model, weights=False))
        self.pool = bus.RpcClient(cfg.pool_batches_addr, timeout_s=60.0)
        self.publisher = WeightPublisher(cfg, Path())  # no base weights here: the sink hands over Tinker paths
        self.metrics = MetricsWriter(cfg.run_dir, "trainer")
        self.checkpoints = CheckpointLog(cfg.run_dir / "checkpoints", cfg.trainer.keep_checkpoints)
        self.lr_factor = lr_factor(cfg.trainer, cfg.run.max_steps)
        self.step = self.last_batch_id = self.checkpointed_step = 0
        self.baselines: dict[str, float] = {}
        self.client: Any = None
        # Tinker names are per run and may not repeat: a resumed trainer saves step N's weights again
        self.tag = time.strftime("%Y%m%d-%H%M%S")

    # -- the training client and its weights
    def start(self) -> None:
        """A fresh LoRA client, or the newest checkpoint's (with trainer.resume); then the engines get its weights."""
        latest = self.checkpoints.latest() if self.cfg.trainer.resume else None
        if latest is None:
            self.client = self.service.create_lora_training_client(
                base_model=self.base_model, rank=self.cfg.tinker.lora_rank, seed=self.cfg.run.seed).result(self.timeout_s)
            log.info("Tinker LoRA training client: %s, rank %d", self.base_model, self.cfg.tinker.lora_rank)
        else:
            self.client = self.service.create_training_client_from_state_with_optimizer(
                latest["state"]).result(self.timeout_s)
            self.step = self.checkpointed_step = latest["step"]
            self.last_batch_id, self.baselines = latest["last_batch_id"], dict(latest["baselines"])
            log.info("resumed from %s: step %d, batch %d", latest["state"], self.step, self.last_batch_id)
            if self.last_batch_id:
                commit_batch(self.pool, self.last_batch_id)  # the crash may have come before it
        self.publish()

    def publish(self) -> str:
        """New sampler weights under the current version; every engine switches to them."""
        path = self.client.save_weights_for_sampler(f"v{self.step:06d}-{self.tag}").result(self.timeout_s).path
        self.publisher.publish_sampler(path, version=self.step, step=self.step)
        log.info("sampler weights v%d: %s", self.step, path)
        return path

    def checkpoint_and_commit(self, force: bool = False) -> None:
        every = self.cfg.trainer.checkpoint_every
        due = force or (every and self.step % every == 0)
        if every and due:
            state = self.client.save_state(f"step{self.step:06d}-{self.tag}").result(self.timeout_s).path
            self.checkpoints.add({"step": self.step, "version": self.step, "last_batch_id": self.last_batch_id,
                                  "state": state, "base_model": self.base_model, "baselines": dict(self.baselines)})
            self.checkpointed_step = self.step
        if not every or due:
            commit_batch(self.pool, self.last_batch_id)

    # -- one step
    def train_one(self, batch: Batch) -> dict:
        from tinker import types

        t0 = time.monotonic()
        algo, trained_at = self.cfg.algo, self.step
        plan, self.baselines = plan_batch(batch.samples, algo, trained_at, self.baselines)
        datums, adv = planned_datums(plan, algo)
        t = self.cfg.trainer
        adam = types.AdamParams(learning_rate=t.lr * self.lr_factor(self.step), beta1=t.adam_betas[0],
                                beta2=t.adam_betas[1], eps=t.adam_eps, weight_decay=t.weight_decay,
                                grad_clip_norm=t.grad_clip)
        out = optim = None
        if datums:  # else every sample was stale: the step counts, the weights stay
            loss_fn = self.cfg.tinker.loss_fn
            out = self.client.forward_backward([sdk_datum(d) for d in datums], loss_fn,
                                               ppo_loss_config(loss_fn, algo) or None).result(self.timeout_s)
            optim = self.client.optim_step(adam).result(self.timeout_s)
        train_s = time.monotonic() - t0
        self.step += 1
        self.last_batch_id = batch.batch_id
        t1 = time.monotonic()
        self.publish()
        publish_s = time.monotonic() - t1
        self.checkpoint_and_commit()
        stats = step_stats(plan, batch, datums, adv, out, optim, trained_at)
        stats.update(tokens_per_s=stats["tokens"] / max(train_s, 1e-9), train_s=train_s, publish_s=publish_s,
                     step_s=time.monotonic() - t0, lr=adam.learning_rate, version=self.step)
        return stats

    def run(self, stop) -> int:
        max_steps = self.cfg.run.max_steps
        live = self.cfg.run.mode == "live"
        while not max_steps or self.step < max_steps:
            batch = wait_for_batch(self.pool, self.step, self.last_batch_id, self.cfg.pool.batch_size,
                                   None if live else self.cfg.trainer.batch_wait_timeout_s, stop)
            if batch is None:
                log.info("stop requested before step %d", self.step + 1)
                break
            stats = self.train_one(batch)
            self.metrics.log(stats, step=self.step)
            log.info(progress_line(self.step, max_steps, self.step, stats))
        if self.cfg.trainer.checkpoint_every and self.step > self.checkpointed_step:
            self.checkpoint_and_commit(force=True)
            log.info("checkpointed step %d", self.step)
        if not stop.is_set():
            versions = self.publisher.engine_versions()
            self.metrics.log({"final_engine_versions": versions, "final_version": self.step}, step=self.step)
            log.info("done: %d steps, engine weight versions %s", self.step, versions)
        return 0

    def close(self, status: str = "success") -> None:
        """`status`: how the Tinker session ends (success, interrupted, errored); tinker-serve then frees its slot."""
        for closable in (self.pool, self.publisher, self.metrics):
            closable.close()
        try:
            self.service.close(status).result(self.timeout_s)
        except Exception as e:  # the run is over either way; the service ends an idle session itself
            log.warning("the Tinker session did not end cleanly: %s", e)


def step_stats(plan, batch: Batch, datums: list[PlannedDatum], adv, out: Any, optim: Any, trained_at: int) -> dict:
    """The step's metrics, named as the Megatron trainer names them where they mean the same."""
    samples, kept = batch.samples, plan.samples
    rewards = [s.reward for s in kept if s.reward is not None]
    # the learner's log-probs of the trained tokens against the sampler's: the engine-vs-trainer gap
    diffs, kls = [], []
    for d, o in zip(datums, out.loss_fn_outputs if out else []):
        learner = o["logprobs"].tolist()
        for lp, sampled, a in zip(learner, d.logprobs, d.advantages):
            if sampled != 0.0 or a != 0.0:
                diffs.append(abs(lp - sampled))
                kls.append(sampled - lp)
    trained = adv.trained
    metrics = {k.replace(":", "_"): float(v) for k, v in ((out.metrics or {}) if out else {}).items()}
    optim_metrics = {f"optim_{k.replace(':', '_')}": float(v) for k, v in ((optim.metrics or {}) if optim else {}).items()}
    stale = [trained_at - min(s.versions) for s in samples]
    return {
        "pg_loss": metrics.get("loss_sum", 0.0), **metrics, **optim_metrics,
        "samples": len(samples), "samples_trained": len(kept), "dropped_stale_trainer": plan.dropped_stale,
        "tokens": sum(len(s.tokens) for s in kept), "response_tokens": int(sum(sum(s.loss_mask) for s in kept)),
        "reward_mean": sum(rewards) / len(rewards) if rewards else 0.0,
        "hint_rate": sum(s.teacher_logprobs is not None for s in samples) / max(len(samples), 1),
        "adv_rl_mean": float(adv.rl.mean()) if adv.rl.numel() else 0.0,
        "adv_opd_mean": float(adv.opd.mean()) if adv.opd.numel() else 0.0,
        "adv_trained_abs_sum": float(trained.abs().sum()),
        "logprob_abs_diff": sum(diffs) / max(len(diffs), 1), "kl_rollout": sum(kls) / max(len(kls), 1),
        "staleness_mean": sum(stale) / max(len(stale), 1), "staleness_max": max(stale, default=0),
        "trained_at_version": trained_at, "dropped_stale": batch.dropped_stale, "pool_pending": batch.pending,
        "batch_id": batch.batch_id,
    }


def main(cfg: Config, stop) -> int:
    trainer = TinkerTrainer(cfg)
    status = "errored"
    try:
        trainer.start()
        mark_ready(cfg, "trainer")
        log.info("trainer ready: Tinker at %s, %s LoRA rank %d, loss %s, step %d of %d",
                 cfg.tinker.base_url or "Tinker's service", trainer.base_model, cfg.tinker.lora_rank,
                 cfg.tinker.loss_fn, trainer.step, cfg.run.max_steps)
        code = trainer.run(stop)
        status = "interrupted" if stop.is_set() else "success"
        return code
    finally:
        trainer.close(status)
