"""`clawr1 rollout`: drive an environment's episodes through the gateway, many at once.

The environment class comes from an import path (`rollout.env`), slime-style,
implements `clawr1.environment.Environment`, and talks to the policy only through
the gateway with the official `openai` client, exactly like any external agent.
Held-out evaluation runs as side turns (never trained on) every
`rollout.eval_every` weight versions, and once more at the final version (a resumed
run starts at its newest published version, evaluated unless it already was, the
final one too: a run stopped during its final evaluation gets it on `--resume`);
then the loop reports done and idles until stopped. Each evaluation record names the
environment's headline metric (`eval_metric`), so the progress line and
`clawr1 report` need not know the environment.
"""
from __future__ import annotations

import asyncio
import logging
import random
import signal
import time
from collections import defaultdict
from typing import Any

import httpx
import openai

from clawr1 import bus, protocol
from clawr1.config import Config
from clawr1.engine_api.versions import published_version
from clawr1.chat_client import GatewayChat
from clawr1.environment import check_environment, close_environment
from clawr1.protocol import WeightsPublished
from clawr1.runtime import load_object, mark_ready, ready_file, resolve_api_key, setup_logging
from clawr1.tracking import MetricsWriter, read_metrics

log = logging.getLogger("clawr1.rollout")


def load_env(import_path: str, args: dict[str, Any], seed: int) -> Any:
    env = load_object(import_path, "rollout.env")(args, seed=seed)
    check_environment(env, import_path)
    return env


def gateway_chat(cfg: Config) -> GatewayChat:
    """The environment's view of the policy: chat through the run's gateway with the rollout's sampling."""
    r = cfg.rollout
    return GatewayChat(cfg.gateway_url, resolve_api_key(cfg.gateway), cfg.gateway.model_name, r.max_tokens,
                       r.temperature, r.top_p, r.request_timeout_s)


class Rollout:
    def __init__(self, cfg: Config, env: Any, chat: GatewayChat, metrics: MetricsWriter):
        self.cfg, self.env, self.chat, self.metrics = cfg, env, chat, metrics
        self.version = published_version(cfg.run_dir, cfg.lora.serves_adapters)  # a resumed run's; else 0
        self.episodes = 0
        self.window: dict[str, list[float]] = defaultdict(list)
        self.workers_may_run = asyncio.Event()
        self.workers_may_run.set()
        self.finished = asyncio.Event()
        self.pool_backlog = 0
        self.backlog_ok = asyncio.Event()
        self.backlog_ok.set()

    async def worker(self, index: int) -> None:
        rng = random.Random(f"{self.cfg.run.seed}-worker-{index}")
        k = 0
        while not self.finished.is_set():
            await self.workers_may_run.wait()
            await self.backlog_ok.wait()
            session = f"w{index}-e{k}-{rng.getrandbits(32):08x}"
            k += 1
            try:
                result = await self.env.episode(self.chat, session, rng)
            except (openai.APIError, httpx.HTTPError) as e:
                log.warning("episode %s failed: %s", session, e)
                self.window["episode_errors"].append(1.0)
                await asyncio.sleep(1.0)
                continue
            self.episodes += 1
            for key, value in result.items():
                self.window[key].append(float(value))

    async def evaluate(self, version: int) -> None:
        self.workers_may_run.clear()  # a quiet engine makes the evaluation fast and its version clean
        try:
            t0 = time.monotonic()
            result = await self.env.evaluate(self.chat, self.cfg.rollout.eval_size, f"eval-v{version}")
            missing = [m for m in self.env.eval_metrics if m not in result]
            if missing:
                raise ValueError(f"{self.cfg.rollout.env}.evaluate did not report {', '.join(missing)}")
            result.update(eval_version=version, eval_s=time.monotonic() - t0, eval_metric=self.env.eval_metrics[0])
            self.metrics.log(result, step=version)
            log.info("evaluation at version %d: %s", version,
                     {k: round(v, 3) for k, v in result.items() if isinstance(v, (int, float))})
        finally:
            self.workers_may_run.set()

    def report(self) -> None:
        data = {f"{k}_mean": sum(v) / len(v) for k, v in self.window.items() if v}
        data.update(episodes=self.episodes, version=self.version, pool_backlog=self.pool_backlog)
        data.update(self.env.report())  # the environment's own counters
        self.metrics.log(data, step=self.version)
        self.window.clear()

    async def watch_pool(self, limit: int) -> None:
        """Pause new episodes while the pool's backlog is at or above `limit` samples."""
        pool = bus.AsyncRpcClient(self.cfg.pool_batches_addr, timeout_s=10.0)
        try:
            unanswered = bus.Retry(tries=1, note="not throttling", then_raise=False)
            while True:
                backlog = 0  # no answer: no throttling
                for attempt in unanswered.attempts():
                    with attempt:
                        backlog = (await pool.call(protocol.StatsRequest())).pending
                self.pool_backlog = backlog
                (self.backlog_ok.set if self.pool_backlog < limit else self.backlog_ok.clear)()
                await asyncio.sleep(0.25)
        finally:
            pool.close()

    async def follow_versions(self, on_version) -> None:
        sub = bus.sub_socket(self.cfg.publish_addr, asyncio=True)
        try:
            while True:
                msg = protocol.decode(await sub.recv_multipart())
                if isinstance(msg, WeightsPublished) and msg.version > self.version:
                    self.version = msg.version
                    await on_version(msg.version)
        finally:
            sub.close(0)


def raise_worker_failure(workers: list[asyncio.Task]) -> None:
    """An episode that raised something other than a network error is a bug in the environment: stop the loop
    with it (so `clawr1 run` stops and names the loop) instead of running on with one worker fewer."""
    for worker in workers:
        if worker.done() and not worker.cancelled() and worker.exception() is not None:
            error = worker.exception()
            log.error("an episode raised %s: %s; stopping", type(error).__name__, error)
            raise error


def evaluated(cfg: Config, version: int) -> bool:
    """Whether this run's metrics already hold a held-out evaluation of `version` (a resumed run's last one)."""
    return any(r.get("eval_version") == version for r in read_metrics(cfg.run_dir, "rollout"))


def done_file(cfg: Config):
    """Written once the final version is evaluated: `clawr1 run` waits for it before stopping the loops."""
    return ready_file(cfg, "rollout").with_suffix(".done")


async def run(cfg: Config, stop: asyncio.Event) -> None:
    env = load_env(cfg.rollout.env, cfg.rollout.env_args, cfg.run.seed)
    metrics = MetricsWriter(cfg.run_dir, "rollout")
    chat = gateway_chat(cfg)
    ro = Rollout(cfg, env, chat, metrics)
    log.info("environment %s: %s", cfg.rollout.env, env.describe())
    every = cfg.rollout.eval_every

    async def on_version(version: int, starting: bool = False) -> None:
        final = version >= cfg.run.max_steps
        if final:
            ro.finished.set()  # no more episodes: nothing would train on them
        if every and (final or version % every == 0) and not (starting and evaluated(cfg, version)):
            await ro.evaluate(version)
        if final:
            done_file(cfg).write_text(str(version))

    tasks = [asyncio.create_task(ro.follow_versions(on_version))]
    if cfg.rollout.max_pool_backlog:
        tasks.append(asyncio.create_task(ro.watch_pool(cfg.rollout.max_pool_backlog)))
    mark_ready(cfg, "rollout")
    await on_version(ro.version, starting=True)  # a resumed run's newest version: evaluated unless it was
    workers = [asyncio.create_task(ro.worker(i)) for i in range(cfg.rollout.concurrency)]
    tasks += workers
    try:
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), timeout=10)
            except asyncio.TimeoutError:
                ro.report()
            raise_worker_failure(workers)
        log.info("stopping: %d episodes done", ro.episodes)
    finally:
        ro.report()
        for t in tasks:
            t.cancel()
        await asyncio.wait(tasks, timeout=5)
        await asyncio.wait_for(chat.close(), timeout=5)
        close_environment(env)



def main(cfg: Config) -> int:
    setup_logging("rollout")

    async def go() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await run(cfg, stop)

    asyncio.run(go())
    return 0
