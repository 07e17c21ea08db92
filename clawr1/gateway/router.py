"""Routing across engines: session affinity (warm prefix caches) with health-based failover.

Each session prefers the same engine (rendezvous hashing over the engine
list, so adding or losing an engine moves only its own sessions). An engine
that fails a request, or its health check, is skipped until it is healthy
again; a request that failed before any output retries on the next engine.
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
from typing import AsyncIterator, Awaitable, Callable, TypeVar

from clawr1.engine_api.client import EngineClient, EngineUnavailable, EngineUnreachable

log = logging.getLogger("clawr1.gateway")
T = TypeVar("T")


class NoEngineError(RuntimeError):
    """Every engine failed or is unhealthy."""


class EngineRouter:
    def __init__(self, urls: list[str], health_interval_s: float = 2.0):
        if not urls:
            raise ValueError("the gateway needs at least one engine URL")
        self.engines = [EngineClient(u) for u in urls]
        self.healthy = [True] * len(urls)
        self.seen_up = [False] * len(urls)  # no failover warning for an engine that is still starting
        self.health_interval_s = health_interval_s

    def order(self, key: str) -> list[int]:
        """Engines for this key, preferred first: healthy ones by rendezvous hash, then the unhealthy ones."""
        def score(i: int) -> bytes:
            return hashlib.blake2b(f"{key}|{self.engines[i].url}".encode(), digest_size=8).digest()

        ranked = sorted(range(len(self.engines)), key=score, reverse=True)
        return [i for i in ranked if self.healthy[i]] + [i for i in ranked if not self.healthy[i]]

    async def call(self, key: str, fn: Callable[[EngineClient], Awaitable[T]]) -> T:
        """Run `fn` on the key's engine, failing over to the next one on connection errors."""
        errors = []
        for i in self.order(key):
            try:
                return await fn(self.engines[i])
            except (EngineUnreachable, EngineUnavailable) as e:
                self.mark(i, False)
                errors.append(f"{self.engines[i].url}: {type(e).__name__}")
        raise NoEngineError("no engine reachable (" + "; ".join(errors) + ")")

    def mark(self, i: int, ok: bool) -> None:
        self.seen_up[i] = self.seen_up[i] or ok
        if self.healthy[i] != ok and self.seen_up[i]:
            log.warning("engine %s is %s", self.engines[i].url, "back" if ok else "unreachable; failing over")
        self.healthy[i] = ok

    async def watch_health(self) -> None:
        while True:
            results = await asyncio.gather(*(e.health() for e in self.engines))
            for i, ok in enumerate(results):
                self.mark(i, ok)
            await asyncio.sleep(self.health_interval_s)

    async def stream(self, key: str, open_stream: Callable[[EngineClient], AsyncIterator[T]]) -> AsyncIterator[T]:
        """Stream from the key's engine; fail over only while nothing has been received yet."""
        errors = []
        for i in self.order(key):
            it = open_stream(self.engines[i]).__aiter__()
            try:
                first = await it.__anext__()
            except StopAsyncIteration:
                return
            except (EngineUnreachable, EngineUnavailable) as e:
                self.mark(i, False)
                errors.append(f"{self.engines[i].url}: {type(e).__name__}")
                continue
            yield first
            async for item in it:
                yield item
            return
        raise NoEngineError("no engine reachable (" + "; ".join(errors) + ")")

    async def close(self) -> None:
        for e in self.engines:
            await e.close()
