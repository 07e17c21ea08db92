"""A session's lock is held by one request at a time and forgotten when idle; a stream always releases it."""
from __future__ import annotations

import asyncio

import pytest
from starlette.requests import ClientDisconnect

from clawr1.gateway.app import TurnStream
from clawr1.gateway.service import SessionLocks


def test_requests_of_one_session_take_turns_and_idle_locks_are_forgotten():
    async def go():
        locks, order = SessionLocks(), []

        async def turn(session: str, name: str) -> None:
            await locks.acquire(session)
            order.append(f"{name} in")
            await asyncio.sleep(0.01)
            order.append(f"{name} out")
            locks.release(session)

        await asyncio.gather(turn("s", "a"), turn("s", "b"), turn("t", "c"))
        held_during = []
        for i in range(100):  # one lock per new session while it is in use, none after
            await locks.acquire(f"anon-{i}")
            held_during.append(len(locks))
            locks.release(f"anon-{i}")
        return order, held_during, len(locks)

    order, held_during, left = asyncio.run(go())
    assert order.index("a out") < order.index("b in")  # same session: one after the other
    assert order.index("c in") < order.index("a out")  # other session: alongside
    assert held_during == [1] * 100 and left == 0


def test_a_cancelled_waiter_leaves_no_lock_behind():
    async def go():
        locks = SessionLocks()
        await locks.acquire("s")
        waiter = asyncio.create_task(locks.acquire("s"))
        await asyncio.sleep(0)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        locks.release("s")
        return len(locks)

    assert asyncio.run(go()) == 0


def test_turn_stream_releases_when_the_client_left_before_the_first_byte():
    released = []

    async def events():
        released.append("started")  # never reached: the client is gone before the body starts
        yield b"data: [DONE]\n\n"

    async def release() -> None:
        released.append("released")

    async def gone(message: dict) -> None:
        raise OSError("client disconnected")

    async def receive() -> dict:
        return {"type": "http.disconnect"}

    scope = {"type": "http", "asgi": {"spec_version": "2.4"}, "method": "POST", "path": "/v1/chat/completions",
             "headers": []}
    with pytest.raises(ClientDisconnect):
        asyncio.run(TurnStream(events(), release, headers={})(scope, receive, gone))
    assert released == ["released"]
