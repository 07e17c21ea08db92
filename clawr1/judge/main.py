"""`clawr1 judge`: TurnRecords in, Samples out.

Each main turn with a next state gets a verdict (score and/or hint). A hint
earns teacher log-probs on the exact sampled response. A turn with neither
signal is counted and dropped. Samples go to the pool and are retried until the
pool acknowledges them as durable. At most `judge.concurrency` turns are judged
at once; the rest wait in the socket's bounded queue, and the backlog is
reported.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import time
from collections import Counter
from typing import Optional

from clawr1 import bus, protocol
from clawr1.config import Config
from clawr1.chat import ChatRenderer
from clawr1.judge.directives import DirectiveMap
from clawr1.judge.env import EnvJudge
from clawr1.judge.llm import LlmJudge
from clawr1.judge.noise import HintNoise, noisy_score
from clawr1.judge.rules import RulePatterns, Verdict, judge_rules
from clawr1.engine_api.client import EngineClient
from clawr1.judge.teacher import Teacher, TeacherScores
from clawr1.protocol import Ack, JudgeHello, Sample, TurnAck, TurnRecord, turn_key

log = logging.getLogger("clawr1.judge")


def make_sample(record: TurnRecord, verdict: Verdict, scores: Optional[TeacherScores],
                unhinted: Optional[list[float]] = None) -> Sample:
    """One Sample carrying every signal the turn earned: its reward, and the teacher's scores if it had a hint
    (with `unhinted`, the same teacher's scores without the hint)."""
    n = len(record.response_ids)
    sid = turn_key(record)
    teacher = scores.generation if scores else None
    return Sample(
        sample_id=sid, group_id=record.group_id or sid, task_id=record.task_id,
        tokens=record.prompt_ids + record.response_ids, prompt_len=len(record.prompt_ids), loss_mask=[1] * n,
        rollout_logprobs=record.rollout_logprobs, versions=record.versions, temperature=record.temperature,
        reward=verdict.score, teacher_logprobs=teacher.prompt_logprobs if teacher else None,
        teacher_temperature=scores.temperature if scores else record.temperature, teacher_unhinted_logprobs=unhinted,
        teacher_topk_ids=teacher.prompt_top_ids if teacher and teacher.prompt_top_ids else None,
        teacher_topk_logprobs=teacher.prompt_top_logprobs if teacher and teacher.prompt_top_ids else None,
        teacher_version=teacher.weight_version if teacher else None, hint=verdict.hint, votes=verdict.votes,
        session_id=record.session_id, turn_index=record.turn_index, created_at=time.time(), ingested=record.ingested,
        adapter=record.adapter, adapter_slot=record.adapter_slot,
    )


class Judge:
    """Verdicts from the configured backend, teacher scores for hints, Samples to the pool."""

    def __init__(self, cfg: Config, tokenizer):
        self.cfg = cfg
        self.patterns = RulePatterns.compile(cfg.judge.correction_patterns, cfg.judge.directive_patterns)
        backend = cfg.judge.backend
        self.llm = LlmJudge(cfg.judge, cfg.prm_url) if backend == "llm" else None
        self.env = EnvJudge(cfg.judge, cfg.prm_url) if backend == "env" else None
        self.renderer = ChatRenderer(tokenizer, cfg.model.chat_template_kwargs)
        self.directives = DirectiveMap(cfg.judge.directives)
        self.teacher: Optional[Teacher] = None
        self.unhinted = cfg.algo.opd_baseline == "teacher"  # also score each hinted response without the hint
        if cfg.judge.teacher != "none":
            if cfg.judge.teacher in ("frozen", "lagged") and not (cfg.judge.teacher_url or cfg.judge.teacher_port):
                raise ValueError(f"judge.teacher={cfg.judge.teacher} needs judge.teacher_url (an engine serving the "
                                 "teacher's weights) or `clawr1 run` to start one")
            self.teacher = Teacher(EngineClient(cfg.teacher_engine_url), self.renderer,
                                   unhinted_cache_size=4096 if cfg.judge.teacher == "frozen" else 0)
        self.pool = bus.AsyncRpcClient(cfg.pool_samples_addr, timeout_s=30.0)
        self.counts: Counter = Counter()
        self.noise_rng = random.Random(f"judge-noise-{cfg.run.seed}")
        contradict = self.directives.contradict if cfg.judge.hint_noise_kind == "contradict" else None
        self.hint_noise = HintNoise(cfg.judge.hint_noise, cfg.judge.hint_drop, random.Random(f"judge-hints-{cfg.run.seed}"),
                                    contradict=contradict)
        self.latency_sum = 0.0
        self.latency_n = 0
        self.waits: list[float] = []  # queueing delay (gateway queue + socket) of records since the last report
        self.version = 0
        self.inflight = 0

    async def verdicts(self, record: TurnRecord) -> list[tuple[TurnRecord, Verdict]]:
        if not record.main:
            return [(record, Verdict(None))]
        if self.env is not None:
            return await self.env.verdicts(record)
        if self.llm is not None:
            return [(record, await self.llm.verdict(record, with_hints=self.teacher is not None))]
        directive_hint = self.directives.hint if self.cfg.judge.rules_hint == "directive" else None
        return [(record, judge_rules(record, self.patterns, self.cfg.judge.max_hint_chars, directive_hint))]

    async def handle(self, record: TurnRecord) -> list[tuple[str, str]]:
        """Judge one record; (key, reason) of every turn now done with: "sample" once its Sample is durable in
        the pool, else why it was dropped. A turn the env judge holds for its outcome is not done yet."""
        t0 = time.monotonic()
        done = [(turn_key(ready), await self._emit(ready, verdict)) for ready, verdict in await self.verdicts(record)]
        if self.env is not None and self.env.evicted:
            done += [(turn_key(r), "held_overflow") for r in self.env.evicted]
            self.env.evicted = []
        self.latency_sum += time.monotonic() - t0
        self.latency_n += 1
        return done

    async def _emit(self, record: TurnRecord, verdict: Verdict) -> str:
        teacher = None
        j = self.cfg.judge
        # a negative verdict that says nothing about what to do instead (a vague complaint, a re-ask, a wording the
        # judge could not read a wish from): counted, never guessed
        self.counts["negative_without_hint"] += bool(verdict.score is not None and verdict.score < 0 and not verdict.hint)
        self.counts["corrections_unmapped"] += verdict.reason == "correction, unmapped"
        if j.score_noise or j.score_abstain:
            reported = noisy_score(verdict.score, j.score_noise, j.score_abstain, self.noise_rng)
            if reported != verdict.score:
                self.counts["scores_abstained" if reported == 0.0 else "scores_flipped"] += 1
            verdict = dataclasses.replace(verdict, score=reported)
        if verdict.hint and (j.hint_noise or j.hint_drop):
            hint, what = self.hint_noise.apply(verdict.hint)
            self.counts[f"hints_{what}"] += 1
            verdict = dataclasses.replace(verdict, hint=hint)
        unhinted = None
        if verdict.hint and self.teacher is not None and record.response_ids:
            teacher = await self.teacher.score(record.prompt_ids, record.response_ids, verdict.hint,
                                               self.cfg.judge.teacher_topk, record.temperature)
            self.version = max(self.version, teacher.generation.weight_version)
            if self.unhinted:
                unhinted = await self.teacher.score_unhinted(record.prompt_ids, record.response_ids,
                                                             teacher.temperature)
        self.counts["judged"] += 1
        self.counts[f"score_{'none' if verdict.score is None else int(verdict.score)}"] += 1
        if verdict.score is None and teacher is None:
            self.counts["dropped_no_signal"] += 1
            return "no_signal"
        if j.drop_zero and verdict.score == 0 and teacher is None:  # OpenClaw-RL trains no 0-scored turn
            self.counts["dropped_zero_score"] += 1
            return "zero_score"
        self.counts["with_hint"] += teacher is not None
        return "sample" if await self.send(make_sample(record, verdict, teacher, unhinted)) else "refused"

    async def send(self, sample: Sample) -> bool:
        """Deliver to the pool; return once it is durable there (True) or refused for good (False); retries are
        idempotent."""
        delay = 0.2
        until_acked = bus.Retry(note=f"sending {sample.sample_id} again")
        while True:
            for attempt in until_acked.attempts():
                with attempt:
                    ack = await self.pool.call(sample)
            if not isinstance(ack, Ack):
                raise TypeError(f"the pool answered a Sample with {type(ack).__name__}")
            if ack.ok:
                self.counts["samples_sent"] += 1
                return True
            if not ack.retry:
                self.counts["samples_refused"] += 1
                log.error("pool refused sample %s: %s", sample.sample_id, ack.error)
                return False
            self.counts["pool_full_retries"] += 1
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)

    def received(self, record: TurnRecord) -> None:
        self.counts["received"] += 1
        self.counts["received_ingested"] += record.ingested
        self.inflight += 1
        if record.sent_at:
            self.waits.append(max(0.0, time.time() - record.sent_at))

    def report(self) -> dict:
        """Counters since the start; queue_wait_* over the records received since the previous report."""
        waits, self.waits = self.waits, []
        out = {
            **dict(self.counts), "inflight": self.inflight,
            "backlog": self.inflight,  # taken off the socket, not yet finished (failed ones included)
            "queue_wait_s_mean": sum(waits) / len(waits) if waits else 0.0,
            "queue_wait_s_max": max(waits, default=0.0),
            "hint_rate": self.counts["with_hint"] / max(self.counts["judged"], 1),
            "mean_latency_s": self.latency_sum / max(self.latency_n, 1),
        }
        if self.teacher is not None and self.unhinted:
            out["unhinted_cache_hits"] = self.teacher.unhinted_cache_hits
        prm = self.llm or (self.env.prm if self.env is not None else None)  # the env judge's PRM reports too
        if prm is not None:
            out.update(prm.report())
        if self.env is not None:
            out["held_sessions"] = len(self.env.held)
            out["dropped_held_turns"] = self.env.dropped_held
        return out

    async def close(self) -> None:
        for part in (self.llm, self.env):
            if part is not None:
                await part.close()
        if self.teacher is not None:
            await self.teacher.engine.close()


class Acknowledger:
    """Tells the gateway's outbox which turns are done with (and, once at start, that this judge holds nothing)."""

    def __init__(self, cfg: Config):
        self.sock = bus.push_socket(cfg.gateway_acks_addr, asyncio=True) if cfg.gateway.outbox and cfg.gateway.acks_port \
            else None

    async def hello(self) -> None:
        if self.sock is not None:
            await self.sock.send_multipart(protocol.encode(JudgeHello(started_at=time.time())))

    async def ack(self, done: list[tuple[str, str]]) -> None:
        if self.sock is None:
            return
        by_reason: dict[str, list[str]] = {}
        for key, reason in done:
            by_reason.setdefault(reason, []).append(key)
        for reason, keys in by_reason.items():
            await self.sock.send_multipart(protocol.encode(TurnAck(keys=keys, reason=reason)))

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close(linger=2000)


async def serve(cfg: Config, judge: Judge, stop: asyncio.Event, on_ready=None) -> None:
    from clawr1.tracking import MetricsWriter

    pull = bus.pull_socket(cfg.judge_turns_addr, asyncio=True)
    acks = Acknowledger(cfg)
    slots = asyncio.Semaphore(cfg.judge.concurrency)
    metrics = MetricsWriter(cfg.run_dir, "judge")
    tasks: set[asyncio.Task] = set()
    active: set[str] = set()  # keys being judged: a resent copy that arrives meanwhile is ignored
    last_report = time.monotonic()
    await acks.hello()
    if on_ready:
        on_ready()

    async def run_one(record: TurnRecord) -> None:
        key = turn_key(record)
        try:
            done = await judge.handle(record)
        except Exception:
            judge.counts["errors"] += 1
            log.exception("judging %s/%d failed", record.session_id, record.turn_index)
            done = [(key, "error")]
        finally:
            active.discard(key)
            judge.inflight -= 1
            slots.release()
        await acks.ack(done)

    while not stop.is_set():
        if time.monotonic() - last_report > 5:
            metrics.log(judge.report(), step=judge.version)
            last_report = time.monotonic()
        if not await pull.poll(200):
            continue
        await slots.acquire()  # beyond `concurrency`, records wait in the socket's bounded queue
        try:
            record = protocol.decode(await pull.recv_multipart())
        except protocol.SchemaMismatch as e:
            slots.release()
            judge.counts["bad_records"] += 1
            log.error("dropped a message that is not a TurnRecord: %s", e)
            continue
        if turn_key(record) in active:
            slots.release()
            judge.counts["resends_ignored"] += 1
            continue
        active.add(turn_key(record))
        judge.received(record)
        task = asyncio.create_task(run_one(record))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.wait(tasks, timeout=30)
    metrics.log(judge.report(), step=judge.version)
    acks.close()
    pull.close(0)


def main(cfg: Config) -> int:
    from clawr1.runtime import mark_ready, setup_logging
    from clawr1.model_path import load_chat_tokenizer, resolve_model_path

    setup_logging("judge")
    tokenizer = load_chat_tokenizer(cfg.model, resolve_model_path(cfg.model, weights=cfg.serve.backend != "tinker"))
    judge = Judge(cfg, tokenizer)

    async def run() -> None:
        import signal

        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        try:
            await serve(cfg, judge, stop, on_ready=lambda: mark_ready(cfg, "judge"))
        finally:
            await judge.close()

    asyncio.run(run())
    log.info("judge stopped: %s", dict(judge.counts))
    return 0
