"""ZeroMQ sockets with bounded queues, timeouts, acks and schema checks.

Three patterns, each a thin layer over real ZeroMQ sockets:

- stream (PUSH -> PULL): gateway TurnRecords to the judge;
- request/reply (DEALER -> ROUTER): judge Samples to the pool (acked once
  durable) and trainer batch requests/commits. Every request carries an id, the
  reply echoes it, and a client that times out raises `BusTimeout` so the caller
  can retry (the pool makes retries idempotent): `Retry` is the one retry loop, the
  caller's stop rule its parameters;
- broadcast (PUB -> SUB): `WeightsPublished`.
"""
from __future__ import annotations

import itertools
import logging
import os
import time
from dataclasses import dataclass
from typing import Callable, Iterator, Optional

import zmq
import zmq.asyncio

from clawr1 import protocol
from clawr1.protocol import ErrorReply, Message, SchemaMismatch

DEFAULT_HWM = 1000
log = logging.getLogger("clawr1.bus")


class BusTimeout(TimeoutError):
    """No reply within the deadline."""


@dataclass(frozen=True)
class Retry:
    """The retry loop of a request that may time out, for blocking and asyncio clients alike:

        for attempt in bus.Retry(tries=5, note="committing again").attempts():
            with attempt:
                return pool.call(msg)

    A `BusTimeout` inside `with attempt` is logged (with `note`) and the request asked again, `tries` requests in
    all (None: until one is answered). Once they are spent the last `BusTimeout` is raised, or, with
    `then_raise=False`, the loop just ends and the caller goes on without an answer. It also ends, unanswered,
    when `stop()` is true after a timeout (a loop told to shut down). Any other error goes through at once."""

    tries: Optional[int] = None
    note: str = "asking again"
    then_raise: bool = True
    stop: Callable[[], bool] = lambda: False

    def attempts(self) -> Iterator["Attempt"]:
        for number in itertools.count(1):
            attempt = Attempt(self, last=self.tries is not None and number >= self.tries)
            yield attempt
            if attempt.answered or attempt.last or self.stop():
                return


class Attempt:
    """One request of a `Retry` loop, as a context manager."""

    def __init__(self, retry: Retry, last: bool):
        self.retry, self.last, self.answered = retry, last, False

    def __enter__(self) -> "Attempt":
        return self

    def __exit__(self, kind, error, traceback) -> bool:
        if kind is None:
            self.answered = True
            return False
        if not issubclass(kind, BusTimeout):
            return False
        give_up = self.last and self.retry.then_raise
        if not give_up:
            log.warning("%s; %s", error, self.retry.note)
        return not give_up


def _configure(sock: zmq.Socket, hwm: int, linger_ms: int) -> zmq.Socket:
    sock.setsockopt(zmq.SNDHWM, hwm)
    sock.setsockopt(zmq.RCVHWM, hwm)
    sock.setsockopt(zmq.LINGER, linger_ms)
    return sock


def socket(ctx: zmq.Context, kind: int, hwm: int = DEFAULT_HWM, linger_ms: int = 0) -> zmq.Socket:
    return _configure(ctx.socket(kind), hwm, linger_ms)


def _request_ids():
    prefix = f"{os.getpid()}-".encode()
    return (prefix + str(i).encode() for i in itertools.count())


# ---------------------------------------------------------------- request/reply
class RpcClient:
    """Blocking request/reply over a DEALER socket (one request in flight)."""

    def __init__(self, addr: str, timeout_s: float = 10.0, hwm: int = DEFAULT_HWM, ctx: Optional[zmq.Context] = None):
        self.addr = addr
        self.timeout_s = timeout_s
        self._ctx = ctx or zmq.Context.instance()
        self._hwm = hwm
        self._ids = _request_ids()
        self._sock = self._connect()

    def _connect(self) -> zmq.Socket:
        sock = socket(self._ctx, zmq.DEALER, self._hwm)
        sock.connect(self.addr)
        return sock

    def call(self, msg: Message, timeout_s: Optional[float] = None) -> Message:
        req_id = next(self._ids)
        self._sock.send_multipart([req_id, *protocol.encode(msg)])
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        while True:
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0 or not self._sock.poll(left_ms):
                raise BusTimeout(f"no reply from {self.addr} within {timeout_s or self.timeout_s:.1f}s")
            frames = self._sock.recv_multipart()
            if frames[0] != req_id:
                continue  # a late reply to an earlier, timed-out request
            reply = protocol.decode(frames[1:])
            if isinstance(reply, ErrorReply):
                raise RuntimeError(f"{self.addr} refused the request: {reply.error}")
            return reply

    def close(self) -> None:
        self._sock.close(0)


class AsyncRpcClient:
    """Request/reply over a DEALER socket from asyncio; many requests may be in flight."""

    def __init__(self, addr: str, timeout_s: float = 10.0, hwm: int = DEFAULT_HWM):
        import asyncio

        self.addr = addr
        self.timeout_s = timeout_s
        self._ctx = zmq.asyncio.Context.instance()
        self._sock = socket(self._ctx, zmq.DEALER, hwm)
        self._sock.connect(addr)
        self._ids = _request_ids()
        self._waiters: dict[bytes, "asyncio.Future"] = {}
        self._reader: Optional["asyncio.Task"] = None

    async def _read_replies(self) -> None:
        while True:
            frames = await self._sock.recv_multipart()
            fut = self._waiters.pop(frames[0], None)
            if fut is None or fut.done():
                continue
            try:
                fut.set_result(protocol.decode(frames[1:]))
            except SchemaMismatch as e:
                fut.set_exception(e)

    async def call(self, msg: Message, timeout_s: Optional[float] = None) -> Message:
        import asyncio

        if self._reader is None:
            self._reader = asyncio.ensure_future(self._read_replies())
        req_id = next(self._ids)
        fut = asyncio.get_running_loop().create_future()
        self._waiters[req_id] = fut
        await self._sock.send_multipart([req_id, *protocol.encode(msg)])
        try:
            reply = await asyncio.wait_for(fut, self.timeout_s if timeout_s is None else timeout_s)
        except asyncio.TimeoutError:
            raise BusTimeout(f"no reply from {self.addr}") from None
        finally:
            self._waiters.pop(req_id, None)
        if isinstance(reply, ErrorReply):
            raise RuntimeError(f"{self.addr} refused the request: {reply.error}")
        return reply

    def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
        self._sock.close(0)


class RpcServer:
    """The ROUTER side: receive requests and reply to their sender."""

    def __init__(self, addr: str, hwm: int = DEFAULT_HWM, ctx: Optional[zmq.Context] = None):
        self.sock = socket(ctx or zmq.Context.instance(), zmq.ROUTER, hwm)
        self.sock.bind(addr)

    def recv(self) -> tuple[list[bytes], Optional[Message], str]:
        """Return (route, message, error). A malformed request gets an error, not an exception."""
        frames = self.sock.recv_multipart()
        route, body = frames[:2], frames[2:]
        try:
            return route, protocol.decode(body), ""
        except SchemaMismatch as e:
            return route, None, str(e)

    def reply(self, route: list[bytes], msg: Message) -> None:
        self.sock.send_multipart([*route, *protocol.encode(msg)])

    def close(self) -> None:
        self.sock.close(0)


# ---------------------------------------------------------------- stream and broadcast
def push_socket(addr: str, hwm: int = DEFAULT_HWM, linger_ms: int = 2000, asyncio: bool = False) -> zmq.Socket:
    ctx = zmq.asyncio.Context.instance() if asyncio else zmq.Context.instance()
    sock = socket(ctx, zmq.PUSH, hwm, linger_ms)
    sock.connect(addr)
    return sock


def pull_socket(addr: str, hwm: int = DEFAULT_HWM, asyncio: bool = False) -> zmq.Socket:
    ctx = zmq.asyncio.Context.instance() if asyncio else zmq.Context.instance()
    sock = socket(ctx, zmq.PULL, hwm)
    sock.bind(addr)
    return sock


def pub_socket(addr: str, hwm: int = DEFAULT_HWM) -> zmq.Socket:
    sock = socket(zmq.Context.instance(), zmq.PUB, hwm)
    sock.bind(addr)
    return sock


def sub_socket(addr: str, hwm: int = DEFAULT_HWM, asyncio: bool = False) -> zmq.Socket:
    ctx = zmq.asyncio.Context.instance() if asyncio else zmq.Context.instance()
    sock = socket(ctx, zmq.SUB, hwm)
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    sock.connect(addr)
    return sock
