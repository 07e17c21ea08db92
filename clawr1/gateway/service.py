"""The gateway's turn logic, independent of HTTP.

For every request: render the prompt (extending the session's recorded ids),
generate on an engine (one request per choice), read reasoning and tool calls
out of the exact sampled ids, answer in OpenAI's shape, and leave each sampled
turn pending in its session until what follows it arrives. Then the turn's
`TurnRecord` goes to the judge (clawr1/gateway/judge_link.py). `score` and
`ingest` are handlers of their own (clawr1/gateway/score.py, clawr1/gateway/ingest.py).
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import AsyncIterator, Awaitable, Callable, Optional, Sequence

from clawr1 import bus, protocol
from clawr1.chat import ChatRenderer, ChatTemplateError
from clawr1.config import Config
from clawr1.engine_api.client import EngineError, Generation, joined
from clawr1.gateway.adapters import AdapterRouting
from clawr1.gateway.errors import GatewayError, PromptLimits, engine_errors
from clawr1.gateway.ingest import Ingester
from clawr1.gateway.judge_link import JudgeLink
from clawr1.gateway.logprobs import TokenText, openai_logprobs
from clawr1.gateway.metrics import Metrics
from clawr1.gateway.openai_types import (ChatCompletionRequest, IngestRequest, ScoreRequest, chat_completion, chunk,
                                         completion_id)
from clawr1.gateway.parsers import ParsedOutput, StreamSplitter, default_tool_call_format, parse_output
from clawr1.gateway.router import EngineRouter
from clawr1.gateway.score import Scorer
from clawr1.gateway.sessions import SEGMENTS_PER_START, Session, SessionStore, canonical, next_start
from clawr1.protocol import NextState, TurnRecord, WeightsPublished, turn_key
from clawr1.tracking import MetricsWriter, RunStatus

log = logging.getLogger("clawr1.gateway")


class SessionLocks:
    """One lock per session id, forgotten once no request holds or waits for it (so the table stays bounded)."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, list[int]]] = {}  # id -> (lock, [requests holding or waiting])

    def __len__(self) -> int:
        return len(self._locks)

    async def acquire(self, session_id: str) -> None:
        entry = self._locks.get(session_id)
        if entry is None:
            entry = self._locks[session_id] = (asyncio.Lock(), [0])
        entry[1][0] += 1
        try:
            await entry[0].acquire()
        except BaseException:
            self._leave(session_id)
            raise

    def release(self, session_id: str) -> None:
        self._locks[session_id][0].release()
        self._leave(session_id)

    def _leave(self, session_id: str) -> None:
        users = self._locks[session_id][1]
        users[0] -= 1
        if users[0] == 0:
            del self._locks[session_id]


@dataclass
class TurnContext:
    """Who a request belongs to, from its headers, path and body."""

    session_id: Optional[str]
    side: bool = False
    group_id: str = ""
    task_id: str = ""
    user: str = ""  # whose adapter serves the turn (lora.per_user): X-User-Id, the `user` field, or the session


@dataclass
class Choice:
    index: int
    gen: Generation
    text: str
    parsed: ParsedOutput

    def message(self) -> dict:
        msg: dict = {"role": "assistant", "content": self.parsed.content if (self.parsed.content or not self.parsed.tool_calls) else None}
        if self.parsed.tool_calls:
            msg["tool_calls"] = [c.openai() for c in self.parsed.tool_calls]
        if self.parsed.reasoning:
            msg["reasoning_content"] = self.parsed.reasoning
        return msg

    def finish_reason(self) -> str:
        if self.parsed.tool_calls:
            return "tool_calls"
        return "length" if self.gen.finish_reason == "length" else "stop"

    def history_message(self) -> dict:
        """The assistant message as the client will send it back (reasoning is not sent back)."""
        msg = self.message()
        msg.pop("reasoning_content", None)
        return msg


MAX_CONTINUATIONS = 3  # an aborted generation is continued at most this many times
ADAPTER_TRIES = 3  # an engine call whose adapter version was unloaded meanwhile goes out again at most this often
ADAPTER_WAIT_S = 1.0  # ... each time after waiting this long at most for the trainer's next version
REPORT_EVERY_S = 5.0  # the gateway's counters go to metrics.jsonl this often


class Gateway:
    def __init__(self, cfg: Config, tokenizer, judge_addr: Optional[str], model_type: str = "",
                 end_ids: Sequence[int] = ()):
        """`model_type` (config.json's) picks the default tool-call format; `end_ids`: the model's own
        eos_token_id list, beyond what the chat template and tokenizer say ends a reply."""
        self.cfg = cfg.gateway
        self.run_dir = cfg.run_dir
        self.renderer = ChatRenderer(tokenizer, cfg.model.chat_template_kwargs)
        fmt = cfg.model.tool_call_format
        self.tool_call_format = default_tool_call_format(model_type, tokenizer.chat_template) if fmt == "auto" else fmt
        think = cfg.model.reasoning_format
        self.parses_reasoning = "<think>" in tokenizer.get_vocab() if think == "auto" else think == "think"
        self.token_text = TokenText(tokenizer)
        self.tokenizer = tokenizer
        self.router = EngineRouter(cfg.engine_urls, engine_wait_s=self.cfg.engine_wait_s)
        self.adapters = AdapterRouting(cfg)
        self.publish_addr = cfg.publish_addr
        self.sessions = SessionStore(self.renderer, self.cfg.max_sessions, self.cfg.session_ttl_s,
                                     self.cfg.max_session_tokens, cfg.model.on_template_break)
        self.metrics = Metrics()
        self.judge = JudgeLink(self.cfg, self.run_dir, judge_addr, self.metrics)
        self.limits = PromptLimits(self.cfg.max_prompt_tokens)
        self.scorer = Scorer(self.renderer, self.router, self.limits)
        self.ingester = Ingester(self.run_dir, self.renderer, self.router, self.limits, self.judge, self.metrics)
        self.metrics.gauge("sessions_open", lambda: len(self.sessions.sessions), "sessions with state in memory")
        self.metrics.gauge("session_tokens", lambda: self.sessions.tokens, "token ids held by sessions")
        self.metrics.gauge("judge_queue_depth", lambda: self.judge_queue.qsize(), "TurnRecords waiting for the judge")
        self.metrics.counter_fn("prefix_breaks", lambda: self.sessions.prefix_breaks, "histories that stopped extending")
        self.metrics.counter_fn("template_breaks", lambda: self.sessions.template_breaks,
                                "turns whose history the chat template renders otherwise than it was sampled")
        self.metrics.gauge("engines_healthy", lambda: sum(self.router.healthy), "engines passing health checks")
        self.session_locks = SessionLocks()
        self._engine_wait = 0.0  # seconds spent awaiting engines (for the overhead metric)
        self._tasks: list[asyncio.Task] = []
        self.eos_ids = set(self.renderer.end_ids) | set(end_ids)
        self.weight_version = 0  # the newest version that produced a token served here
        self.run_status = RunStatus(self.run_dir)
        self.metrics_writer: Optional[MetricsWriter] = None  # from start(): the gateway's records in metrics.jsonl
        # a restarted gateway's new sessions must not reuse the ids (session/segment/turn) of the old one's turns
        self.sessions.segment_base = SEGMENTS_PER_START * next_start(self.run_dir / "gateway" / "starts")

    @property
    def sessions_file(self) -> Path:
        return self.run_dir / "gateway" / "sessions.bin"

    @property
    def judge_queue(self) -> "asyncio.Queue[TurnRecord]":
        return self.judge.queue

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        if self.sessions_file.exists():
            log.info("took back %d sessions a stopped gateway saved", self.sessions.load(self.sessions_file))
        self.metrics_writer = MetricsWriter(self.run_dir, "gateway")
        self._tasks += self.judge.start({turn_key(r) for s in self.sessions.sessions.values() for r in s.pending()})
        self._tasks.append(asyncio.create_task(self._expire_sessions()))
        self._tasks.append(asyncio.create_task(self.router.watch_health()))
        if self.adapters.enabled:
            self._tasks.append(asyncio.create_task(self._follow_adapters()))
        self._tasks.append(asyncio.create_task(self._report()))

    async def stop(self) -> None:
        """Hand the queued turns to the judge, and keep the sessions (with their pending turns) for a resumed run."""
        await self.judge.drain(5.0)
        saved = self.sessions.save(self.sessions_file)
        log.info("saved %d sessions to %s", saved, self.sessions_file)
        for t in self._tasks:
            t.cancel()
        self._write_report()
        self.ingester.close()
        self.judge.close()
        await self.router.close()

    async def _follow_adapters(self) -> None:
        """Route to each adapter version as soon as the trainer announces it (it is loaded in every engine by then)."""
        sub = bus.sub_socket(self.publish_addr, asyncio=True)
        try:
            while True:
                msg = protocol.decode(await sub.recv_multipart())
                if isinstance(msg, WeightsPublished):
                    self.adapters.published(msg.version)
        finally:
            sub.close(0)

    async def _report(self) -> None:
        while True:
            await asyncio.sleep(REPORT_EVERY_S)
            self._write_report()

    def _write_report(self) -> None:
        if self.metrics_writer is not None:
            self.metrics_writer.log(self.counts(), step=self.weight_version)

    def counts(self) -> dict[str, float]:
        """The gateway's own figures: turns served and recorded, feedback, ingested turns, sessions, queues."""
        c = self.metrics.counters
        return {
            "main_turns": c["main_turns"][()], "side_requests": c["requests"][(("kind", "side"),)],
            "feedback": c["feedback"][()], "ingested_turns": c["ingested_turns"][()],
            "turns_sent": c["turns_sent"][()], "turns_dropped": c["turns_dropped"][()],
            "prefix_breaks": self.sessions.prefix_breaks, "template_breaks": self.sessions.template_breaks,
            "malformed_tool_calls": c["malformed_tool_calls"][()], "sessions_open": len(self.sessions.sessions),
            "session_tokens": self.sessions.tokens, "weight_version": self.weight_version,
            "turns_resent": c["turns_resent"][()], **self.judge.counts(),
        }

    def status(self) -> dict:
        """The run's live figures for the playground: this gateway's, and the other loops' newest records."""
        run = self.run_status.refresh()
        return {
            "weight_version": max(self.weight_version, run.get("trainer", "version") or 0),
            "trainer_step": run.get("trainer", "step") or 0, "reward_mean": run.get("trainer", "reward_mean"),
            "judge_backlog": run.get("judge", "backlog"), "judged": run.get("judge", "judged"),
            "pool_pending": run.get("pool", "pending"), "samples": run.get("pool", "received"),
            "main_turns": int(self.metrics.counters["main_turns"][()]),
            "feedback": int(self.metrics.counters["feedback"][()]),
            "ingested_turns": int(self.metrics.counters["ingested_turns"][()]),
            "sessions_open": len(self.sessions.sessions), "engines_healthy": sum(self.router.healthy),
        }

    async def _expire_sessions(self) -> None:
        while True:
            await asyncio.sleep(min(5.0, self.cfg.session_ttl_s / 2))
            self._evict()

    def _evict(self) -> None:
        for s in self.sessions.expired():
            self._emit(s, [(r, NextState(kind="none")) for r in s.pending()])

    def _emit(self, session: Session, outcomes: list[tuple[TurnRecord, NextState]]) -> None:
        """Send pending turns, each with what followed it, to the judge; a turn is sent exactly once."""
        for record, next_state in outcomes:
            record.next_state = next_state
            record.sent_at = time.time()
            self.judge.send(record)
        self.sessions.release(session, [r for r, _ in outcomes])

    # ------------------------------------------------------------ generation
    def _sampling_params(self, req: ChatCompletionRequest, choice: int) -> dict:
        stop = [req.stop] if isinstance(req.stop, str) else (req.stop or [])
        max_new = req.max_completion_tokens or req.max_tokens or self.cfg.default_max_tokens
        if max_new > self.cfg.max_completion_tokens:
            raise GatewayError(400, f"max_tokens {max_new} exceeds this gateway's limit of {self.cfg.max_completion_tokens}",
                               code="max_tokens_too_large")
        return {
            "max_new_tokens": max_new,
            "temperature": 1.0 if req.temperature is None else req.temperature,
            "top_p": 1.0 if req.top_p is None else req.top_p,
            "stop": stop, "sampling_seed": None if req.seed is None else req.seed + choice,
        }

    def decode(self, gen: Generation) -> str:
        """The sampled text with special markers kept (tool-call tags), minus the stop token/string."""
        ids = gen.output_ids[:-1] if gen.output_ids and gen.output_ids[-1] in self.eos_ids else gen.output_ids
        text = self.renderer.decode(ids)
        if gen.matched_stop and gen.matched_stop in text:
            text = text[: text.index(gen.matched_stop)]
        return text

    async def _engine_generate(self, key: str, prompt: list[int], params: dict, top_k: int,
                               slot: Optional[int]) -> Generation:
        """One engine call, through the slot's newest adapter (see _adapter_gone)."""
        for attempt in range(ADAPTER_TRIES):
            name = self.adapters.name(slot)
            try:
                return await self.router.call(key, lambda e: e.generate(prompt, params, return_logprob=True,
                                                                       top_logprobs_num=top_k, lora_path=name))
            except EngineError as e:
                await self._adapter_gone(e, name, attempt)

    async def _adapter_gone(self, error: EngineError, name: Optional[str], attempt: int) -> None:
        """Re-raise `error` unless it says the adapter `name` left the engine before the request reached it (the
        trainer unloads the version before the previous one at each publish); then wait for the next version."""
        if name is None or error.status != 400 or "LoRA adapter" not in str(error) or attempt + 1 >= ADAPTER_TRIES:
            raise error
        self.metrics.inc("adapter_retries", help="engine calls sent again because their adapter version was unloaded")
        deadline = time.monotonic() + ADAPTER_WAIT_S
        while self.adapters.name_unchanged(name) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    async def _generate(self, key: str, prompt: list[int], params: dict, top_k: int = 0,
                        slot: Optional[int] = None) -> Generation:
        """One choice. A generation the engine aborted (SGLang <= 0.5.20 aborts running requests to update its
        weights) is continued from where it stopped, so the agent never sees a cut answer because of training."""
        t0 = time.perf_counter()
        try:
            with engine_errors():
                gen = await self._engine_generate(key, prompt, params, top_k, slot)
                for _ in range(MAX_CONTINUATIONS):
                    left = params["max_new_tokens"] - len(gen.output_ids)
                    if gen.finish_reason != "abort" or left <= 0:
                        break
                    self.metrics.inc("continued_after_abort", help="generations an engine aborted, continued")
                    more_params, so_far = {**params, "max_new_tokens": left}, prompt + gen.output_ids
                    gen = joined(gen, await self._engine_generate(key, so_far, more_params, top_k, slot))
                return gen
        finally:
            self._engine_wait += time.perf_counter() - t0

    async def _engine_stream(self, key: str, prompt: list[int], params: dict, top_k: int,
                             slot: Optional[int]) -> AsyncIterator[Generation]:
        """One streamed engine call, through the slot's newest adapter; sent again only before its first token."""
        for attempt in range(ADAPTER_TRIES):
            name = self.adapters.name(slot)
            started = False
            try:
                async for partial in self.router.stream(key, lambda e: e.generate_stream(
                        prompt, params, return_logprob=True, top_logprobs_num=top_k, lora_path=name)):
                    started = True
                    yield partial
                return
            except EngineError as e:
                if started:
                    raise
                await self._adapter_gone(e, name, attempt)

    async def _stream(self, key: str, prompt: list[int], params: dict, top_k: int = 0,
                      slot: Optional[int] = None) -> AsyncIterator[Generation]:
        """Partial results of one choice; an aborted generation is continued (as in _generate), seamlessly."""
        with engine_errors():
            done: Optional[Generation] = None
            for _ in range(MAX_CONTINUATIONS + 1):
                so_far = prompt + (done.output_ids if done else [])
                more_params = {**params, "max_new_tokens": params["max_new_tokens"] - len(so_far) + len(prompt)}
                last = None
                async for partial in self._engine_stream(key, so_far, more_params, top_k, slot):
                    last = partial
                    yield joined(done, partial) if done else partial
                done = joined(done, last) if done and last else (last or done)
                if done is None or done.finish_reason != "abort" or len(done.output_ids) >= params["max_new_tokens"]:
                    return
                self.metrics.inc("continued_after_abort", help="generations an engine aborted, continued")

    # ------------------------------------------------------------ turns
    async def chat(self, req: ChatCompletionRequest, ctx: TurnContext) -> tuple[dict, str]:
        """A non-streaming completion; returns (response body, session id)."""
        t0 = time.perf_counter()
        waited_before = self._engine_wait
        async with self._turn(req, ctx) as turn:
            calls = [self._generate(turn.key, turn.prompt, self._sampling_params(req, i), _top_k(req), turn.slot)
                     for i in range(req.n)]
            gens = [await calls[0]] if req.n == 1 else await asyncio.gather(*calls)
            choices = [self._choice(i, g, turn.parse_tools) for i, g in enumerate(gens)]
            turn.finish(choices)
        body = chat_completion(turn.cid, req.model or self.cfg.model_name,
                               [{"index": c.index, "message": c.message(), "logprobs": self._logprobs(req, c.gen),
                                 "finish_reason": c.finish_reason()} for c in choices],
                               len(turn.prompt), sum(len(c.gen.output_ids) for c in choices),
                               fingerprint(max(c.gen.weight_version for c in choices)))
        total = time.perf_counter() - t0
        self.metrics.observe(total, stream="false")
        if req.n == 1:  # the gateway's own work: the request's time minus the time spent waiting for the engine
            self.metrics.inc("overhead_seconds", max(0.0, total - (self._engine_wait - waited_before)),
                             help="non-streaming requests: time not spent waiting for an engine")
            self.metrics.inc("overhead_requests", help="requests counted in overhead_seconds")
        return body, turn.session_id

    def _logprobs(self, req: ChatCompletionRequest, gen: Generation, start: int = 0,
                  end: Optional[int] = None) -> Optional[dict]:
        """OpenAI's `logprobs` for output tokens start..end (the stop token is not content), if the request asked."""
        if not req.logprobs:
            return None
        return openai_logprobs(gen, start, end, self.token_text, req.top_logprobs or 0, self.eos_ids)

    def _choice(self, index: int, gen: Generation, parse_tools: bool) -> Choice:
        self.weight_version = max(self.weight_version, gen.weight_version)
        text = self.decode(gen)
        self.metrics.inc("completion_tokens", len(gen.output_ids), help="tokens generated")
        parsed = parse_output(text, parse_tools, self.tool_call_format, self.parses_reasoning)
        if parsed.malformed:
            self.metrics.inc("malformed_tool_calls", parsed.malformed,
                             help="tool calls that did not parse (returned as content)")
        return Choice(index, gen, text, parsed)

    async def chat_stream(self, req: ChatCompletionRequest,
                          ctx: TurnContext) -> tuple[AsyncIterator[bytes], str, Callable[[], Awaitable[None]]]:
        """A streaming completion: SSE chunks as tokens arrive. Validation errors are raised before streaming.

        Returns (events, session id, release): call `release` once the response is over; it frees the
        session also when the client left before the events were ever iterated."""
        t0 = time.perf_counter()
        turn_cm = self._turn(req, ctx)
        turn = await turn_cm.__aenter__()

        async def events() -> AsyncIterator[bytes]:
            model = req.model or self.cfg.model_name
            queue: asyncio.Queue = asyncio.Queue()
            finals: dict[int, Choice] = {}

            async def one(i: int) -> None:
                splitter = StreamSplitter(turn.parse_tools, self.tool_call_format, self.parses_reasoning)
                sent, last, reported = "", None, 0  # text sent, last partial result, tokens whose log-probs went out

                def delta(reasoning: str, content: str) -> tuple:
                    """The new text, and the tool calls completed since the last delta (each goes out once)."""
                    nonlocal calls_out
                    new_calls = list(enumerate(splitter.calls))[calls_out:]
                    calls_out = len(splitter.calls)
                    return reasoning, content, new_calls

                calls_out = 0
                try:
                    async for partial in self._stream(turn.key, turn.prompt, self._sampling_params(req, i), _top_k(req),
                                                      turn.slot):
                        last = partial
                        text = self.decode(partial)
                        if text.endswith("\ufffd"):  # half a UTF-8 character: wait for the rest
                            continue
                        reasoning, content = splitter.feed(text[len(sent):])
                        sent = text
                        logprobs = self._logprobs(req, partial, reported)
                        reported = len(partial.output_ids)
                        await queue.put(("delta", i, delta(reasoning, content), logprobs))
                    await queue.put(("delta", i, delta(*splitter.finish()), self._logprobs(req, last, reported)))
                    finals[i] = self._choice(i, last, turn.parse_tools)
                    await queue.put(("done", i, finals[i], splitter))
                except GatewayError as e:
                    await queue.put(("error", i, e, None))

            tasks = [asyncio.create_task(one(i)) for i in range(req.n)]
            try:
                yield _sse(chunk(turn.cid, model, [{"index": i, "delta": {"role": "assistant", "content": ""},
                                                    "finish_reason": None} for i in range(req.n)]))
                running = req.n
                while running:
                    kind, i, a, b = await queue.get()
                    if kind == "delta":
                        text = {k: v for k, v in (("reasoning_content", a[0]), ("content", a[1])) if v}
                        if text or (b and b["content"]):
                            yield _sse(chunk(turn.cid, model, [{"index": i, "delta": text, "logprobs": b,
                                                                "finish_reason": None}]))
                        for j, call in a[2]:  # each tool call goes out as soon as it is complete
                            yield _sse(chunk(turn.cid, model, [{"index": i, "delta": {"tool_calls": [
                                call.openai(index=j)]}, "finish_reason": None}]))
                    elif kind == "done":
                        running -= 1
                        yield _sse(chunk(turn.cid, model, [{"index": i, "delta": {}, "finish_reason": a.finish_reason()}],
                                         fingerprint=fingerprint(a.gen.weight_version)))
                    else:
                        running -= 1
                        yield _sse({"error": {"message": a.message, "type": a.type, "code": a.code}})
                if len(finals) == req.n:
                    turn.finish([finals[i] for i in range(req.n)])
                    if req.stream_options and req.stream_options.include_usage:
                        done = sum(len(c.gen.output_ids) for c in finals.values())
                        usage = {"prompt_tokens": len(turn.prompt), "completion_tokens": done,
                                 "total_tokens": len(turn.prompt) + done}
                        yield _sse(chunk(turn.cid, model, [], usage))
                yield b"data: [DONE]\n\n"
                self.metrics.observe(time.perf_counter() - t0, stream="true")
            finally:
                for t in tasks:
                    t.cancel()
                await turn_cm.__aexit__(None, None, None)

        return events(), turn.session_id, turn_cm.__aexit__

    def _turn(self, req: ChatCompletionRequest, ctx: TurnContext) -> "_Turn":
        return _Turn(self, req, ctx)

    # ------------------------------------------------------------ next states by endpoint
    def feedback(self, session_id: str, turn_index: Optional[int], score: Optional[float], text: str) -> int:
        """Explicit feedback on a pending turn: it goes to the judge now. Returns the turn index."""
        session = self.sessions.sessions.get(session_id)
        pending = session.pending() if session else []
        if not pending:
            raise GatewayError(404, f"session {session_id!r} has no turn waiting for feedback", code="turn_not_found")
        targets = pending if turn_index is None else [r for r in pending if r.turn_index == turn_index]
        if not targets:
            raise GatewayError(409, f"turn {turn_index} of session {session_id!r} is not waiting for feedback "
                                    f"(waiting: {[r.turn_index for r in pending]})", code="turn_not_pending")
        record = targets[-1] if turn_index is None else targets[0]
        self._emit(session, [(record, NextState(kind="feedback", text=text, score=score))])
        self.metrics.inc("feedback", help="explicit feedback received")
        return record.turn_index

    def complete(self, session_id: str, reward: Optional[float], text: str, done: bool = True) -> bool:
        session = self.sessions.close(session_id) if done else self.sessions.sessions.get(session_id)
        if session is None:
            return False
        self._emit(session, [(r, NextState(kind="outcome", text=text, reward=reward, done=done)) for r in session.pending()])
        return True

    async def score(self, req: ScoreRequest) -> dict:
        return await self.scorer.score(req)

    async def ingest(self, req: IngestRequest) -> dict:
        return await self.ingester.ingest(req)


class _Turn:
    """One request's hold on its session: lock, prompt, and recording the sampled choices."""

    def __init__(self, gw: Gateway, req: ChatCompletionRequest, ctx: TurnContext):
        self.gw, self.req, self.ctx = gw, req, ctx
        self.cid = completion_id()
        self.tools = req.tool_dicts()
        self.parse_tools = bool(self.tools)
        self.messages = [m.as_dict() for m in req.messages]
        self.template_kwargs = req.chat_template_kwargs
        self.session_id = "" if ctx.side else (ctx.session_id or f"anon-{uuid.uuid4().hex}")
        self.key = ctx.session_id or self.session_id or self.cid  # engine affinity, side turns included
        self.holds_lock = False
        # the user's LoRA adapter slot (None: the base); only a user's main turn may claim a new slot
        self.slot = gw.adapters.slot_of(ctx.user, claim=not ctx.side)

    async def __aenter__(self) -> "_Turn":
        gw = self.gw
        kind = "side" if self.ctx.side else "main"
        gw.metrics.inc("requests", help="chat completion requests", kind=kind)
        if self.ctx.side:
            try:
                self.prompt = gw.limits.check(gw.renderer.encode_messages(self.messages, tools=self.tools,
                                                                             template_kwargs=self.template_kwargs))
            except ChatTemplateError as e:
                raise GatewayError(400, str(e), code="chat_template_error") from None
        else:
            await gw.session_locks.acquire(self.session_id)
            self.holds_lock = True
            try:
                self.session = gw.sessions.get(self.session_id)
                self.session.busy += 1
                self.asked = [canonical(m) for m in self.messages]
                try:
                    self.rendered = gw.sessions.prompt_for(self.session, self.messages, self.tools, self.asked,
                                                           self.template_kwargs)
                except ChatTemplateError as e:
                    raise GatewayError(400, str(e), code="chat_template_error") from None
                self.prompt = gw.limits.check(self.rendered[0].ids)
                gw._emit(self.session, self.rendered[1])
            except BaseException:
                await self.__aexit__()
                raise
        gw.metrics.inc("prompt_tokens", len(self.prompt), help="prompt tokens sent to engines")
        return self

    def finish(self, choices: list[Choice]) -> None:
        """Record the sampled turns (main requests only); they wait for what follows them."""
        if self.ctx.side:
            return
        gw, s = self.gw, self.session
        group = self.ctx.group_id or (self.cid if len(choices) > 1 else "")
        replies = []
        for c in choices:
            record = TurnRecord(
                session_id=self.session_id, turn_index=s.turns, segment=s.segment, main=True,
                prompt_ids=self.prompt, response_ids=c.gen.output_ids, rollout_logprobs=c.gen.logprobs,
                versions=c.gen.versions, temperature=sampled_temperature(self.req), messages=self.messages,
                tools=self.tools, response_text=c.text,
                finish_reason=c.gen.finish_reason, group_id=group, task_id=self.ctx.task_id, created_at=time.time(),
                adapter=c.gen.lora_path or "", adapter_slot=gw.adapters.trained_slot(self.slot))
            s.turns += 1
            replies.append((c.history_message(), c.gen.output_ids, record))
            gw.judge.served(record)
        gw.sessions.record(s, self.messages, self.tools, replies, self.rendered[0], self.asked)
        gw.metrics.inc("main_turns", len(choices), help="turns recorded for training")
        gw._evict()

    async def __aexit__(self, *exc) -> None:
        """Release the session; safe to call more than once (a stream may end before it starts)."""
        if self.holds_lock:
            self.holds_lock = False
            if getattr(self, "session", None) is not None:
                self.session.busy -= 1
            self.gw.session_locks.release(self.session_id)


def sampled_temperature(req: ChatCompletionRequest) -> float:
    """The temperature a turn's log-probs were taken at: the request's, or 1 (the default, and greedy decoding's)."""
    t = 1.0 if req.temperature is None else req.temperature
    return t if t >= 1e-6 else 1.0


def _top_k(req: ChatCompletionRequest) -> int:
    """How many alternatives per output token the engine must return."""
    return (req.top_logprobs or 0) if req.logprobs else 0


def fingerprint(weight_version: int) -> str:
    """OpenAI's `system_fingerprint`: here, the weight version that produced the reply."""
    return f"clawr1-v{weight_version}"


def _sse(obj: dict) -> bytes:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n".encode()
