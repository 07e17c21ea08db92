"""A small keep-alive HTTP/1.1 client for talking to engines.

The gateway makes one engine request per turn, and aiohttp's general-purpose
client cost more CPU per request than all of the gateway's own work (see
benchmarks/gateway_overhead.py). This client does only what engine APIs need:
requests with a JSON body, replies with Content-Length or chunked bodies
(parsed by httptools, the parser uvicorn uses), connection reuse, and bodies
read as they stream in. Plain HTTP only: engines sit on the cluster network.
"""
from __future__ import annotations

import asyncio
import socket
from typing import AsyncIterator, Optional, Union
from urllib.parse import urlsplit

import httptools

_END = None  # the event that ends a reply body


class ConnectionFailed(ConnectionError):
    """No connection, or the connection broke before the reply was complete."""


class ReplyTimeout(ConnectionFailed):
    """The server took longer than the read timeout to send the next byte."""


class _Connection(asyncio.Protocol):
    """One TCP connection; parser callbacks turn the reply into events: status, body chunks, end (or an error)."""

    def __init__(self) -> None:
        self.transport: Optional[asyncio.Transport] = None
        self.parser = httptools.HttpResponseParser(self)
        self.events: asyncio.Queue[Union[int, bytes, None, Exception]] = asyncio.Queue()
        self.closed = False
        self.replies = 0  # complete replies read on this connection
        self.reply_started = False  # a byte of the current reply has arrived
        self.keep_alive = True

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.reply_started = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as e:
            self.events.put_nowait(ConnectionFailed(f"malformed HTTP reply ({e})"))
            self.close()

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self.closed = True
        self.events.put_nowait(ConnectionFailed(f"connection closed by the server{f' ({exc})' if exc else ''}"))

    # httptools callbacks
    def on_headers_complete(self) -> None:
        self.events.put_nowait(self.parser.get_status_code())

    def on_body(self, body: bytes) -> None:
        self.events.put_nowait(bytes(body))

    def on_message_complete(self) -> None:
        self.keep_alive = self.parser.should_keep_alive()
        self.replies += 1
        self.events.put_nowait(_END)

    def send(self, data: bytes) -> None:
        self.reply_started = False
        self.transport.write(data)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class HttpClient:
    """Keep-alive connections to one server. `read_timeout_s` bounds every wait for the next byte of a reply."""

    def __init__(self, base_url: str, read_timeout_s: float = 300.0, connect_timeout_s: float = 10.0,
                 max_idle: int = 64):
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"engine URLs are plain http://host:port URLs, got {base_url!r}")
        self.host, self.port = parts.hostname, parts.port or 80
        self.prefix = parts.path.rstrip("/")
        self.read_timeout_s, self.connect_timeout_s, self.max_idle = read_timeout_s, connect_timeout_s, max_idle
        self._host_header = f"{self.host}:{self.port}".encode()
        self._idle: list[_Connection] = []

    async def request(self, method: str, path: str, body: bytes = b"",
                      read_timeout_s: Optional[float] = None) -> tuple[int, bytes]:
        """Send a request and read its whole reply: (status, body)."""
        status, chunks = await self.open(method, path, body, read_timeout_s)
        return status, b"".join([c async for c in chunks])

    async def open(self, method: str, path: str, body: bytes = b"",
                   read_timeout_s: Optional[float] = None) -> tuple[int, AsyncIterator[bytes]]:
        """Send a request; return its status and an iterator over the body as it arrives.

        Iterate the body to its end (the connection is then reused) or close the iterator."""
        timeout = self.read_timeout_s if read_timeout_s is None else read_timeout_s
        request = self._head(method, path, body) + body
        for attempt in range(2):
            conn = await self._connection()
            try:
                conn.send(request)
                status = await _next_event(conn, timeout)
            except BaseException as e:
                conn.close()
                # A kept-alive connection that the server closed as we sent: it never read the request, send it again.
                closed_while_idle = (isinstance(e, ConnectionFailed) and not isinstance(e, ReplyTimeout)
                                     and conn.replies > 0 and not conn.reply_started)
                if closed_while_idle and attempt == 0:
                    continue
                raise
            if not isinstance(status, int):
                conn.close()
                raise ConnectionFailed("the server sent a body before its status line")
            return status, self._body(conn, timeout)
        raise AssertionError("unreachable")

    async def close(self) -> None:
        for conn in self._idle:
            conn.close()
        self._idle.clear()

    # ------------------------------------------------------------ internals
    def _head(self, method: str, path: str, body: bytes) -> bytes:
        lines = [f"{method} {self.prefix}{path} HTTP/1.1".encode(), b"Host: " + self._host_header,
                 b"Content-Length: " + str(len(body)).encode()]
        if body:
            lines.append(b"Content-Type: application/json")
        return b"\r\n".join(lines) + b"\r\n\r\n"

    async def _connection(self) -> _Connection:
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed:
                return conn
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(loop.create_connection(_Connection, self.host, self.port),
                                             self.connect_timeout_s)
        except (OSError, asyncio.TimeoutError) as e:
            raise ConnectionFailed(f"cannot connect to {self.host}:{self.port} ({type(e).__name__}: {e})") from None
        return conn

    async def _body(self, conn: _Connection, timeout: float) -> AsyncIterator[bytes]:
        finished = False
        try:
            while True:
                event = await _next_event(conn, timeout)
                if event is _END:
                    finished = True
                    return
                if isinstance(event, bytes):
                    yield event
        finally:
            if finished and conn.keep_alive and not conn.closed and len(self._idle) < self.max_idle:
                self._idle.append(conn)
            else:
                conn.close()


async def _next_event(conn: _Connection, timeout: float) -> Union[int, bytes, None]:
    if conn.events.empty():
        try:
            async with asyncio.timeout(timeout):
                event = await conn.events.get()
        except TimeoutError:
            raise ReplyTimeout(f"no reply from the server within {timeout:g} s") from None
    else:
        event = conn.events.get_nowait()
    if isinstance(event, Exception):
        raise event
    return event
