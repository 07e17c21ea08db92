"""The keep-alive HTTP client against real loopback servers that misbehave on purpose."""
from __future__ import annotations

import asyncio

import pytest

from clawr1.engine_api.http_client import ConnectionFailed, HttpClient, ReplyTimeout


class ScriptedServer:
    """A raw TCP server: answers each request with `reply(request_number)` bytes (None: close the connection)."""

    def __init__(self, reply):
        self.reply = reply
        self.connections = 0
        self.requests = 0
        self.server = None

    async def __aenter__(self) -> "ScriptedServer":
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc) -> None:
        self.server.close()
        await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                await reader.readexactly(length)
                self.requests += 1
                reply = self.reply(self.requests)
                if reply is None:
                    break
                for part in reply if isinstance(reply, list) else [reply]:
                    if isinstance(part, float):
                        await asyncio.sleep(part)
                    else:
                        writer.write(part)
                        await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def json_reply(body: bytes, status: int = 200) -> bytes:
    return b"HTTP/1.1 %d OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (status, len(body), body)


def chunked(*parts: bytes) -> list:
    head = [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"]
    return head + [b"%x\r\n%s\r\n" % (len(p), p) if isinstance(p, bytes) else p for p in parts] + [b"0\r\n\r\n"]


def test_requests_reuse_one_connection():
    async def go():
        async with ScriptedServer(lambda n: json_reply(b'{"n": %d}' % n)) as srv:
            client = HttpClient(srv.url)
            replies = [await client.request("POST", "/generate", b'{"x": 1}') for _ in range(5)]
            await client.close()
            return srv, replies

    srv, replies = asyncio.run(go())
    assert replies == [(200, b'{"n": %d}' % n) for n in range(1, 6)]
    assert srv.connections == 1 and srv.requests == 5


def test_status_and_body_of_an_error_reply():
    async def go():
        async with ScriptedServer(lambda n: json_reply(b'{"error": "no"}', status=503)) as srv:
            client = HttpClient(srv.url)
            try:
                return await client.request("GET", "/health")
            finally:
                await client.close()

    assert asyncio.run(go()) == (503, b'{"error": "no"}')


def test_chunked_body_arrives_as_it_is_sent():
    """Each chunk is handed over before the server has sent the next one (real streaming, not buffering)."""
    async def go():
        async with ScriptedServer(lambda n: chunked(b"data: 1\n\n", 2.0, b"data: 2\n\n")) as srv:
            client = HttpClient(srv.url)
            loop = asyncio.get_running_loop()
            start = loop.time()
            status, body = await client.open("POST", "/generate", b"{}")
            seen = [(chunk, loop.time() - start) async for chunk in body]
            again = await client.request("POST", "/generate", b"{}")  # the connection went back to the pool
            await client.close()
            return status, seen, again, srv.connections

    status, seen, again, connections = asyncio.run(go())
    assert status == 200 and [c for c, _ in seen] == [b"data: 1\n\n", b"data: 2\n\n"]
    assert seen[1][1] >= 2.0 and seen[1][1] - seen[0][1] >= 1.0  # the first came well before the second was sent
    assert again == (200, b"data: 1\n\ndata: 2\n\n") and connections == 1


def test_kept_alive_connection_closed_by_the_server_is_replaced():
    """The server drops the connection after each reply (an idle timeout): the next request still succeeds."""
    async def go():
        replies = {1: json_reply(b"a"), 2: None, 3: json_reply(b"b")}
        async with ScriptedServer(lambda n: replies.get(n)) as srv:
            client = HttpClient(srv.url)
            first = await client.request("POST", "/p", b"{}")
            second = await client.request("POST", "/p", b"{}")  # sent on the dropped connection, retried on a new one
            await client.close()
            return first, second, srv

    first, second, srv = asyncio.run(go())
    assert first == (200, b"a") and second == (200, b"b")
    assert srv.connections == 2 and srv.requests == 3


def test_a_new_connection_that_breaks_is_an_error_not_a_retry():
    async def go():
        async with ScriptedServer(lambda n: None) as srv:
            client = HttpClient(srv.url)
            with pytest.raises(ConnectionFailed, match="closed"):
                await client.request("POST", "/p", b"{}")
            await client.close()
            return srv.requests

    assert asyncio.run(go()) == 1  # sent once: a fresh connection's failure may have reached the server


def test_unreachable_server():
    async def go():
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
        with pytest.raises(ConnectionFailed, match="cannot connect"):
            await HttpClient(f"http://127.0.0.1:{port}").request("GET", "/health")

    asyncio.run(go())


def test_read_timeout_drops_the_connection():
    async def go():
        async with ScriptedServer(lambda n: [0.5, json_reply(b"late")] if n == 1 else json_reply(b"ok")) as srv:
            client = HttpClient(srv.url)
            with pytest.raises(ReplyTimeout):
                await client.request("POST", "/p", b"{}", read_timeout_s=0.1)
            after = await client.request("POST", "/p", b"{}")
            await client.close()
            return after, srv.connections

    after, connections = asyncio.run(go())
    assert after == (200, b"ok") and connections == 2  # the late reply never lands on a reused connection


def test_abandoned_stream_is_not_reused():
    async def go():
        async with ScriptedServer(lambda n: chunked(b"one", 0.2, b"two") if n == 1 else json_reply(b"ok")) as srv:
            client = HttpClient(srv.url)
            _, body = await client.open("POST", "/p", b"{}")
            assert await body.__anext__() == b"one"
            await body.aclose()
            after = await client.request("POST", "/p", b"{}")
            await client.close()
            return after, srv.connections

    after, connections = asyncio.run(go())
    assert after == (200, b"ok") and connections == 2


def test_malformed_reply_is_a_connection_failure():
    async def go():
        async with ScriptedServer(lambda n: b"this is not HTTP\r\n\r\n") as srv:
            client = HttpClient(srv.url)
            with pytest.raises(ConnectionFailed, match="malformed"):
                await client.request("GET", "/health")
            await client.close()

    asyncio.run(go())


@pytest.mark.parametrize("url", ["https://engine:30000", "engine:30000", "http://"])
def test_only_plain_http_urls(url):
    with pytest.raises(ValueError, match="plain http"):
        HttpClient(url)
