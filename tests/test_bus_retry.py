"""bus.Retry, the one retry loop of the bus clients, over real ZeroMQ sockets: each stop rule its callers use."""
import asyncio
import threading

import pytest

from clawr1 import bus
from clawr1.ports import free_port
from clawr1.protocol import Ack, StatsRequest

TIMEOUT_S = 0.2  # each unanswered request's wait


def _addr() -> str:
    return f"tcp://127.0.0.1:{free_port()}"


class SilentServer:
    """A pool that leaves the first `silent` requests unanswered (as one that died holding them) and acks the rest."""

    def __init__(self, addr: str, silent: int, answers: int = 1):
        self.server, self.silent, self.requests = bus.RpcServer(addr), silent, 0
        self.thread = threading.Thread(target=self._serve, args=(silent + answers,), daemon=True)
        self.thread.start()

    def _serve(self, total: int) -> None:
        for _ in range(total):
            route, _, _ = self.server.recv()
            self.requests += 1
            if self.requests > self.silent:
                self.server.reply(route, Ack(id=str(self.requests)))

    def close(self) -> None:
        self.thread.join(timeout=30)
        self.server.close()


def test_a_request_is_asked_again_until_answered():
    addr = _addr()
    pool = SilentServer(addr, silent=2)
    client = bus.RpcClient(addr, timeout_s=TIMEOUT_S)
    reply = None
    for attempt in bus.Retry(tries=5).attempts():
        with attempt:
            reply = client.call(StatsRequest())
    pool.close()
    client.close()
    assert reply == Ack(id="3") and pool.requests == 3


def test_an_asyncio_client_is_asked_again_until_answered():
    addr = _addr()
    pool = SilentServer(addr, silent=1)

    async def ask() -> Ack:
        client = bus.AsyncRpcClient(addr, timeout_s=TIMEOUT_S)
        try:
            for attempt in bus.Retry().attempts():  # no limit: the judge's rule
                with attempt:
                    return await client.call(StatsRequest())
        finally:
            client.close()

    assert asyncio.run(ask()) == Ack(id="2")
    pool.close()
    assert pool.requests == 2


def _asks(retry: bus.Retry) -> int:
    """How many requests `retry` makes to an address nobody serves."""
    client = bus.RpcClient(_addr(), timeout_s=TIMEOUT_S)
    asked = 0
    try:
        for attempt in retry.attempts():
            with attempt:
                asked += 1
                client.call(StatsRequest())
    finally:
        client.close()
    return asked


def test_the_tries_are_spent_then_the_timeout_is_raised():
    client = bus.RpcClient(_addr(), timeout_s=TIMEOUT_S)
    asked = 0
    with pytest.raises(bus.BusTimeout):
        for attempt in bus.Retry(tries=3).attempts():  # the trainer's commit
            with attempt:
                asked += 1
                client.call(StatsRequest())
    client.close()
    assert asked == 3


def test_without_then_raise_the_loop_ends_unanswered():
    assert _asks(bus.Retry(tries=1, then_raise=False)) == 1  # the rollout's rule: one request, then go on
    assert _asks(bus.Retry(tries=2, then_raise=False)) == 2


def test_a_stop_rule_ends_the_loop_after_a_timeout():
    stop = threading.Event()
    stop.set()
    assert _asks(bus.Retry(stop=stop.is_set)) == 1  # the trainer's rule while it shuts down


def test_other_errors_go_through_at_once():
    asked = []
    with pytest.raises(RuntimeError, match="refused"):
        for attempt in bus.Retry(tries=5).attempts():
            with attempt:
                asked.append(1)
                raise RuntimeError("the pool refused the request")
    assert asked == [1]


def test_the_trainers_pool_client_stops_asking_when_told_to_and_gives_up_a_commit():
    from clawr1.trainer.pool_client import commit_batch, wait_for_batch

    client = bus.RpcClient(_addr(), timeout_s=TIMEOUT_S)
    stop = threading.Event()
    stop.set()
    try:
        # a set stop event ends the wait before it asks (the loop's own check) ...
        assert wait_for_batch(client, 0, -1, 4, None, stop) is None
        # ... and after the first timeout once it is set while waiting for the pool
        stop.clear()
        threading.Timer(TIMEOUT_S / 2, stop.set).start()
        assert wait_for_batch(client, 0, -1, 4, None, stop) is None
        with pytest.raises(bus.BusTimeout):
            commit_batch(client, 7, tries=2)
    finally:
        client.close()
