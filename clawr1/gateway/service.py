"""The gateway's turn logic, independent of HTTP.

For every request: render the prompt (extending the session's recorded ids),
generate on an engine (one request per choice), read reasoning and tool calls
out of the exact sampled ids, answer in OpenAI's shape, and leave each sampled
turn pending in its session until what follows it arrives. Then the turn's
`TurnRecord` goes to the judge over ZeroMQ (a bounded queue; overflow is
counted, never silent).
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from dataclasses import dataclass
from typing import AsyncIterator, Awaitable, Callable, Optional

from clawr1 import bus, protocol
from clawr1.config import Config
from clawr1.gateway.chat_template import ChatRenderer
from clawr1.gateway.metrics import Metrics
from clawr1.gateway.openai_types import ChatCompletionRequest, chat_completion, chunk, completion_id
from clawr1.gateway.parsers import ParsedOutput, StreamSplitter, parse_output
from clawr1.gateway.router import EngineRouter, NoEngineError
from clawr1.gateway.sessions import Session, SessionStore, canonical
from clawr1.protocol import NextState, TurnRecord
from clawr1.serving.client import EngineError, Generation

log = logging.getLogger("clawr1.gateway")


class GatewayError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", code: Optional[str] = None):
        super().__init__(message)
        self.status, self.message, self.type, self.code = status, message, type_, code


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


class Gateway:
    def __init__(self, cfg: Config, tokenizer, judge_addr: Optional[str]):
        self.cfg = cfg.gateway
        self.renderer = ChatRenderer(tokenizer)
        self.tokenizer = tokenizer
        self.router = EngineRouter(cfg.engine_urls)
        self.sessions = SessionStore(self.renderer, self.cfg.max_sessions, self.cfg.session_ttl_s, self.cfg.max_session_tokens)
        self.judge_addr = judge_addr
        self.judge_queue: asyncio.Queue[TurnRecord] = asyncio.Queue(maxsize=self.cfg.judge_queue_size)
        self.metrics = Metrics()
        self.metrics.gauge("sessions_open", lambda: len(self.sessions.sessions), "sessions with state in memory")
        self.metrics.gauge("session_tokens", lambda: self.sessions.tokens, "token ids held by sessions")
        self.metrics.gauge("judge_queue_depth", lambda: self.judge_queue.qsize(), "TurnRecords waiting for the judge")
        self.metrics.counter_fn("prefix_breaks", lambda: self.sessions.prefix_breaks, "histories that stopped extending")
        self.metrics.gauge("engines_healthy", lambda: sum(self.router.healthy), "engines passing health checks")
        self.session_locks = SessionLocks()
        self._engine_wait = 0.0  # seconds spent awaiting engines (for the overhead metric)
        self._tasks: list[asyncio.Task] = []
        self.eos_ids = {self.renderer.im_end_id, tokenizer.convert_tokens_to_ids("<|endoftext|>")}

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        if self.judge_addr:
            self._tasks.append(asyncio.create_task(self._send_to_judge()))
        self._tasks.append(asyncio.create_task(self._expire_sessions()))
        self._tasks.append(asyncio.create_task(self.router.watch_health()))

    async def stop(self) -> None:
        for s in list(self.sessions.sessions.values()):
            self._emit(s, [(r, NextState(kind="none")) for r in s.pending()])
        deadline = time.monotonic() + 5
        while not self.judge_queue.empty() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for t in self._tasks:
            t.cancel()
        await self.router.close()

    async def _send_to_judge(self) -> None:
        sock = bus.push_socket(self.judge_addr, asyncio=True)
        try:
            while True:
                record = await self.judge_queue.get()
                await sock.send_multipart(protocol.encode(record))
                self.metrics.inc("turns_sent", help="TurnRecords delivered to the judge")
        finally:
            sock.close(linger=2000)

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
            try:
                self.judge_queue.put_nowait(record)
            except asyncio.QueueFull:
                self.metrics.inc("turns_dropped", help="TurnRecords dropped because the judge queue was full")
                log.warning("judge queue full (%d): dropped turn %s/%d", self.judge_queue.qsize(), record.session_id,
                            record.turn_index)
        sent = {id(r) for r, _ in outcomes}
        session.candidates = [c for c in session.candidates if id(c.record) not in sent]

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
        text = self.tokenizer.decode(ids, skip_special_tokens=False)
        if gen.matched_stop and gen.matched_stop in text:
            text = text[: text.index(gen.matched_stop)]
        return text

    def _checked_prompt(self, prompt: list[int]) -> list[int]:
        if len(prompt) > self.cfg.max_prompt_tokens:
            raise GatewayError(400, f"the conversation is {len(prompt)} tokens; the limit is {self.cfg.max_prompt_tokens}",
                               code="context_length_exceeded")
        return prompt

    async def _generate(self, key: str, prompt: list[int], params: dict) -> Generation:
        t0 = time.perf_counter()
        try:
            return await self.router.call(key, lambda e: e.generate(prompt, params, return_logprob=True))
        except NoEngineError as e:
            raise GatewayError(503, str(e), "engine_unavailable") from None
        except EngineError as e:
            raise engine_failure(e) from None
        finally:
            self._engine_wait += time.perf_counter() - t0

    async def _stream(self, key: str, prompt: list[int], params: dict) -> AsyncIterator[Generation]:
        try:
            async for partial in self.router.stream(key, lambda e: e.generate_stream(prompt, params, return_logprob=True)):
                yield partial
        except NoEngineError as e:
            raise GatewayError(503, str(e), "engine_unavailable") from None
        except EngineError as e:
            raise engine_failure(e) from None

    # ------------------------------------------------------------ turns
    async def chat(self, req: ChatCompletionRequest, ctx: TurnContext) -> tuple[dict, str]:
        """A non-streaming completion; returns (response body, session id)."""
        t0 = time.perf_counter()
        waited_before = self._engine_wait
        async with self._turn(req, ctx) as turn:
            calls = [self._generate(turn.key, turn.prompt, self._sampling_params(req, i)) for i in range(req.n)]
            gens = [await calls[0]] if req.n == 1 else await asyncio.gather(*calls)
            choices = [self._choice(i, g, turn.parse_tools) for i, g in enumerate(gens)]
            turn.finish(choices)
        body = chat_completion(turn.cid, req.model or self.cfg.model_name,
                               [{"index": c.index, "message": c.message(), "logprobs": None,
                                 "finish_reason": c.finish_reason()} for c in choices],
                               len(turn.prompt), sum(len(c.gen.output_ids) for c in choices))
        total = time.perf_counter() - t0
        self.metrics.observe(total, stream="false")
        if req.n == 1:  # the gateway's own work: the request's time minus the time spent waiting for the engine
            self.metrics.inc("overhead_seconds", max(0.0, total - (self._engine_wait - waited_before)),
                             help="non-streaming requests: time not spent waiting for an engine")
            self.metrics.inc("overhead_requests", help="requests counted in overhead_seconds")
        return body, turn.session_id

    def _choice(self, index: int, gen: Generation, parse_tools: bool) -> Choice:
        text = self.decode(gen)
        self.metrics.inc("completion_tokens", len(gen.output_ids), help="tokens generated")
        return Choice(index, gen, text, parse_output(text, parse_tools))

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
                splitter = StreamSplitter(turn.parse_tools)
                sent, last = "", None
                try:
                    async for partial in self._stream(turn.key, turn.prompt, self._sampling_params(req, i)):
                        last = partial
                        text = self.decode(partial)
                        if text.endswith("\ufffd"):  # half a UTF-8 character: wait for the rest
                            continue
                        reasoning, content = splitter.feed(text[len(sent):])
                        sent = text
                        await queue.put(("delta", i, reasoning, content))
                    reasoning, content = splitter.finish()
                    await queue.put(("delta", i, reasoning, content))
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
                        delta = {k: v for k, v in (("reasoning_content", a), ("content", b)) if v}
                        if delta:
                            yield _sse(chunk(turn.cid, model, [{"index": i, "delta": delta, "finish_reason": None}]))
                    elif kind == "done":
                        running -= 1
                        if a.parsed.tool_calls:
                            calls = [c.openai(index=j) for j, c in enumerate(a.parsed.tool_calls)]
                            yield _sse(chunk(turn.cid, model, [{"index": i, "delta": {"tool_calls": calls}, "finish_reason": None}]))
                        yield _sse(chunk(turn.cid, model, [{"index": i, "delta": {}, "finish_reason": a.finish_reason()}]))
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


class _Turn:
    """One request's hold on its session: lock, prompt, and recording the sampled choices."""

    def __init__(self, gw: Gateway, req: ChatCompletionRequest, ctx: TurnContext):
        self.gw, self.req, self.ctx = gw, req, ctx
        self.cid = completion_id()
        self.tools = req.tool_dicts()
        self.parse_tools = bool(self.tools)
        self.messages = [m.as_dict() for m in req.messages]
        self.session_id = "" if ctx.side else (ctx.session_id or f"anon-{uuid.uuid4().hex}")
        self.key = ctx.session_id or self.session_id or self.cid  # engine affinity, side turns included
        self.holds_lock = False

    async def __aenter__(self) -> "_Turn":
        gw = self.gw
        kind = "side" if self.ctx.side else "main"
        gw.metrics.inc("requests", help="chat completion requests", kind=kind)
        if self.ctx.side:
            self.prompt = gw._checked_prompt(gw.renderer.encode_messages(self.messages, tools=self.tools))
        else:
            await gw.session_locks.acquire(self.session_id)
            self.holds_lock = True
            try:
                self.session = gw.sessions.get(self.session_id)
                self.asked = [canonical(m) for m in self.messages]
                prompt, outcomes = gw.sessions.prompt_for(self.session, self.messages, self.tools, self.asked)
                self.prompt = gw._checked_prompt(prompt)
                gw._emit(self.session, outcomes)
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
                versions=c.gen.versions, messages=self.messages, tools=self.tools, response_text=c.text,
                finish_reason=c.gen.finish_reason, group_id=group, task_id=self.ctx.task_id, created_at=time.time())
            s.turns += 1
            replies.append((c.history_message(), c.gen.output_ids, record))
        gw.sessions.record(s, self.messages, self.tools, replies, self.prompt, self.asked)
        gw.metrics.inc("main_turns", len(choices), help="turns recorded for training")
        gw._evict()

    async def __aexit__(self, *exc) -> None:
        """Release the session; safe to call more than once (a stream may end before it starts)."""
        if self.holds_lock:
            self.holds_lock = False
            self.gw.session_locks.release(self.session_id)


def engine_failure(e: EngineError) -> GatewayError:
    """An engine's 4xx means the request cannot be served (e.g. longer than the context): the client's 400."""
    if 400 <= e.status < 500:
        return GatewayError(400, f"the engine refused the request: {e}", code="engine_rejected")
    return GatewayError(502, f"the engine failed: {e}", "engine_error")


def _sse(obj: dict) -> bytes:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n".encode()
