"""Routing across engines: session affinity (warm prefix caches) with health-based failover.

Each session prefers the same engine (rendezvous hashing over the engine
list, so adding or losing an engine moves only its own sessions). An engine
that fails a request, or its health check, is skipped until it is healthy
again; a request that failed before any output retries on the next engine.

An engine counts as healthy only once its /health has answered. While an engine
has never answered, or none is healthy, the router checks every PROBE_INTERVAL_S,
so it learns of an engine as it comes up. A request that finds no engine
reachable waits up to `engine_wait_s` for one to come up (the run starting, an
engine restarting) before it is refused.
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from typing import AsyncIterator, Awaitable, Callable, TypeVar

from clawr1.engine_api.client import EngineClient, EngineUnavailable, EngineUnreachable

log = logging.getLogger("clawr1.gateway")
T = TypeVar("T")
PROBE_INTERVAL_S = 0.1  # health checks while an engine is starting, or none is up


class NoEngineError(RuntimeError):
    """Every engine failed or is unhealthy."""


class EngineRouter:
    def __init__(self, urls: list[str], health_interval_s: float = 2.0, engine_wait_s: float = 30.0):
        if not urls:
            raise ValueError("the gateway needs at least one engine URL")
        self.engines = [EngineClient(u) for u in urls]
        self.healthy = [False] * len(urls)  # until its health check or a request answers
        self.seen_up = [False] * len(urls)  # no failover warning for an engine that is still starting
        self.health_interval_s = health_interval_s
        self.engine_wait_s = engine_wait_s
        self._some_up = asyncio.Event()  # set while any engine is healthy

    @property
    def ready(self) -> bool:
        """Whether a request would be sent to an engine that answered its last check."""
        return any(self.healthy)

    def order(self, key: str) -> list[int]:
        """Engines for this key, preferred first: healthy ones by rendezvous hash, then the unhealthy ones."""
        def score(i: int) -> bytes:
            return hashlib.blake2b(f"{key}|{self.engines[i].url}".encode(), digest_size=8).digest()

        ranked = sorted(range(len(self.engines)), key=score, reverse=True)
        return [i for i in ranked if self.healthy[i]] + [i for i in ranked if not self.healthy[i]]

    async def call(self, key: str, fn: Callable[[EngineClient], Awaitable[T]]) -> T:
        """Run `fn` on the key's engine, failing over to the next one on connection errors; with none reachable,
        wait for one (up to engine_wait_s) and try again."""
        deadline = time.monotonic() + self.engine_wait_s
        while True:
            errors = []
            for i in self.order(key):
                try:
                    result = await fn(self.engines[i])
                except (EngineUnreachable, EngineUnavailable) as e:
                    errors.append(self._failed(i, e))
                    continue
                self.mark(i, True)
                return result
            await self._wait_for_an_engine(deadline, errors)

    def _failed(self, i: int, error: Exception) -> str:
        """Mark engine i down; what to say about it if every engine fails."""
        self.mark(i, False)
        return f"{self.engines[i].url}: {type(error).__name__}"

    async def _wait_for_an_engine(self, deadline: float, errors: list[str]) -> None:
        """Return once an engine's health check answers; NoEngineError naming `errors` if the deadline passes."""
        left = deadline - time.monotonic()
        try:
            if left <= 0:
                raise asyncio.TimeoutError
            await asyncio.wait_for(self._some_up.wait(), left)
        except asyncio.TimeoutError:
            raise NoEngineError(f"no engine reachable within {self.engine_wait_s:g} s (gateway.engine_wait_s): "
                                + "; ".join(errors)) from None

    def mark(self, i: int, ok: bool) -> None:
        self.seen_up[i] = self.seen_up[i] or ok
        if self.healthy[i] != ok and self.seen_up[i]:
            log.warning("engine %s is %s", self.engines[i].url, "back" if ok else "unreachable; failing over")
        self.healthy[i] = ok
        if self.ready:
            self._some_up.set()
        else:
            self._some_up.clear()

    async def watch_health(self) -> None:
        while True:
            results = await asyncio.gather(*(e.health() for e in self.engines))
            for i, ok in enumerate(results):
                self.mark(i, ok)
            starting = not (all(self.seen_up) and self.ready)
            await asyncio.sleep(PROBE_INTERVAL_S if starting else self.health_interval_s)

    async def stream(self, key: str, open_stream: Callable[[EngineClient], AsyncIterator[T]]) -> AsyncIterator[T]:
        """Stream from the key's engine; fail over (or wait for an engine, as `call` does) only while nothing has
        been received yet."""
        deadline = time.monotonic() + self.engine_wait_s
        while True:
            errors = []
            for i in self.order(key):
                it = open_stream(self.engines[i]).__aiter__()
                try:
                    first = await it.__anext__()
                except StopAsyncIteration:
                    return
                except (EngineUnreachable, EngineUnavailable) as e:
                    errors.append(self._failed(i, e))
                    continue
                self.mark(i, True)
                yield first
                async for item in it:
                    yield item
                return
            await self._wait_for_an_engine(deadline, errors)

    async def close(self) -> None:
        for e in self.engines:
            await e.close()
