"""`clawr1 gateway` over HTTP: OpenAI-compatible routes, auth, size limits and errors in OpenAI's shape."""
from __future__ import annotations

import contextlib
import hmac
import ipaddress
import re
from typing import Any, Awaitable, Callable, Mapping, Optional
from pathlib import Path
from urllib.parse import parse_qs, quote

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response, StreamingResponse
from pydantic import ValidationError

from clawr1.config import GatewayConfig
from clawr1.gateway.openai_types import (ChatCompletionRequest, CompleteRequest, FeedbackRequest, IngestRequest,
                                         ScoreRequest, error_body)
from clawr1.gateway.errors import GatewayError
from clawr1.gateway.service import Gateway, TurnContext

OPEN_PATHS = {"/health"}
PLAYGROUND_PATH = "/playground"
PLAYGROUND_HTML = Path(__file__).with_name("playground.html")
CHAT_PATH = re.compile(r"^(?:/s/(?P<session>[^/]+))?/v1/chat/completions$")
ASGIApp = Callable[[dict, Callable[[], Awaitable[dict]], Callable[[dict], Awaitable[None]]], Awaitable[None]]


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_exposure(cfg: GatewayConfig, key: Optional[str]) -> None:
    if not is_loopback(cfg.host) and not key:
        raise SystemExit(f"gateway.host={cfg.host} is reachable from other machines: set an API key in the "
                         f"environment variable {cfg.api_key_env} or in a file named by gateway.api_key_file")


class BodyLimit:
    """ASGI middleware: a request body larger than `limit` bytes gets 413 before the app reads it."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            return await self._reject(send)
        seen = 0

        async def counted():
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit:
                raise _TooLarge
            return message

        try:
            await self.app(scope, counted, send)
        except _TooLarge:
            await self._reject(send)

    async def _reject(self, send):
        await _send_json(send, 413, error_body(f"the request body is larger than {self.limit} bytes",
                                               code="request_too_large"))


class _TooLarge(Exception):
    pass


class RequireKey:
    """ASGI middleware: every path but /health needs `Authorization: Bearer <key>`.

    The playground page is opened by a browser, which cannot set that header on a navigation: it may
    carry the key as `?key=...` instead (the page then sends it as a header on every API call)."""

    def __init__(self, app, key: str):
        self.app, self.key, self.expected = app, key.encode(), f"Bearer {key}".encode()

    def _allowed(self, scope) -> bool:
        given = dict(scope.get("headers") or []).get(b"authorization", b"")
        if hmac.compare_digest(given, self.expected):
            return True
        if scope["path"] == PLAYGROUND_PATH:
            query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
            return hmac.compare_digest(query.get("key", [""])[0].encode(), self.key)
        return False

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS:
            if not self._allowed(scope):
                return await _send_json(send, 401, error_body("missing or wrong API key", "authentication_error",
                                                              code="invalid_api_key"))
        await self.app(scope, receive, send)


class FastChat:
    """ASGI: non-streaming chat completions served ahead of FastAPI's middleware stack and router.

    Those cost about as much CPU per request as all of the gateway's own work, and the gateway's
    goal is to add under 2 ms. Streaming requests, and every other path, go on to FastAPI (with the
    body already read); FastAPI's routes for the same paths define the OpenAPI schema and answer
    exactly like this path: same validation, same errors.
    """

    def __init__(self, app: ASGIApp, gateway: Gateway):
        self.app, self.gateway = app, gateway

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        match = scope["type"] == "http" and scope["method"] == "POST" and CHAT_PATH.match(scope["path"])
        if not match:
            return await self.app(scope, receive, send)
        raw = await _read_body(receive)
        try:
            body = ChatCompletionRequest.model_validate(orjson.loads(raw))
        except orjson.JSONDecodeError as e:
            return await _send_json(send, 400, error_body(f"the body is not valid JSON ({e})"), self.gateway)
        except ValidationError as e:
            return await _send_json(send, 400, validation_error(e.errors()), self.gateway)
        if body.stream:
            return await self.app(scope, _replay(raw, receive), send)
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        try:
            result, sid = await self.gateway.chat(body, turn_context(headers, match["session"], body))
        except GatewayError as e:
            return await _send_json(send, e.status, error_body(e.message, e.type, code=e.code), self.gateway)
        await _send_json(send, 200, result, extra=_session_header(sid))


async def _read_body(receive: Callable) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


def _replay(body: bytes, receive: Callable) -> Callable[[], Awaitable[dict]]:
    """An ASGI `receive` that hands over a body already read, then the connection's own messages (disconnect)."""
    sent = False

    async def replayed() -> dict:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed


async def _send_json(send: Callable, status: int, obj: Any, gateway: Optional[Gateway] = None,
                     extra: Optional[dict] = None) -> None:
    if gateway is not None and status >= 400:
        gateway.metrics.inc("errors", help="requests answered with an error", status=str(status))
    body = orjson.dumps(obj)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in (extra or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def validation_error(errors: list[dict]) -> dict:
    """OpenAI's error shape for the first problem pydantic found: `param` is where it is."""
    first = errors[0] if errors else {}
    where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
    return error_body(f"{where}: {first.get('msg', 'invalid request')}", param=where or None)


def turn_context(headers: Mapping[str, str], path_session: Optional[str], body: ChatCompletionRequest) -> TurnContext:
    """Whose turn this is: X-Session-Id, else the session in the path, else the `user` field. The user (whose
    LoRA adapter serves it, lora.per_user): X-User-Id, else the `user` field, else the session (the path's, else
    X-Session-Id); empty for an anonymous request."""
    return TurnContext(session_id=headers.get("x-session-id") or path_session or body.user,
                       side=headers.get("x-turn-type", "main").lower() == "side",
                       group_id=headers.get("x-group-id", ""), task_id=headers.get("x-task-id", ""),
                       user=headers.get("x-user-id") or body.user or path_session or headers.get("x-session-id") or "")


def create_app(gateway: Gateway, api_key: Optional[str] = None) -> ASGIApp:
    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI):
        await gateway.start()
        yield
        await gateway.stop()

    app = FastAPI(title="clawr1 gateway (OpenAI-compatible)", lifespan=lifespan)

    @app.exception_handler(GatewayError)
    async def _gateway_error(_: Request, exc: GatewayError) -> JSONResponse:
        gateway.metrics.inc("errors", help="requests answered with an error", status=str(exc.status))
        return JSONResponse(error_body(exc.message, exc.type, code=exc.code), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        gateway.metrics.inc("errors", help="requests answered with an error", status="400")
        return JSONResponse(validation_error(exc.errors()), status_code=400)

    @app.get("/health")
    async def health() -> JSONResponse:
        """200 only while a request would be served: an engine has answered its last health check."""
        healthy = sum(gateway.router.healthy)
        if not healthy:
            return JSONResponse({"status": "waiting for an engine", "engines_healthy": 0}, status_code=503)
        return JSONResponse({"status": "ok", "engines_healthy": healthy})

    @app.get("/v1/models")
    @app.get("/s/{session_id}/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": gateway.cfg.model_name, "object": "model", "owned_by": "clawr1"}]}

    async def _chat(body: ChatCompletionRequest, request: Request, path_session: Optional[str]) -> Response:
        ctx = turn_context(request.headers, path_session, body)
        if body.stream:
            events, sid, release = await gateway.chat_stream(body, ctx)
            return TurnStream(events, release, headers=_session_header(sid))
        result, sid = await gateway.chat(body, ctx)
        return Response(orjson.dumps(result), media_type="application/json", headers=_session_header(sid))

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        return await _chat(body, request, None)

    @app.post("/s/{session_id}/v1/chat/completions")
    async def session_chat_completions(session_id: str, body: ChatCompletionRequest, request: Request) -> Response:
        return await _chat(body, request, session_id)

    @app.post("/v1/feedback")
    async def feedback(body: FeedbackRequest) -> dict:
        if body.score is None and not body.text:
            raise GatewayError(400, "feedback needs a score, a text, or both")
        turn = gateway.feedback(body.session_id, body.turn_index, body.score, body.text)
        return {"session_id": body.session_id, "turn_index": turn, "accepted": True}

    @app.post("/v1/ingest")
    async def ingest(body: IngestRequest) -> dict:
        """One pre-collected conversation (`clawr1 ingest` sends a file's lines here)."""
        return await gateway.ingest(body)

    @app.post("/v1/score")
    async def score(body: ScoreRequest) -> dict:
        """Log-probs of a response under the current policy (with `hint`: the judge's teacher), for probes."""
        return await gateway.score(body)

    @app.get("/v1/status")
    async def status() -> dict:
        """The run's live figures: weight version, steps, reward, judge backlog, pool pending, turns served."""
        return gateway.status()

    @app.get(PLAYGROUND_PATH, response_class=HTMLResponse)
    async def playground() -> HTMLResponse:
        return HTMLResponse(PLAYGROUND_HTML.read_text())

    @app.post("/v1/sessions/{session_id}/complete")
    async def complete(session_id: str, body: CompleteRequest) -> dict:
        if not gateway.complete(session_id, body.reward, body.text, body.done):
            raise GatewayError(404, f"no open session {session_id!r}", code="session_not_found")
        return {"session_id": session_id, "completed": body.done}

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(gateway.metrics.render(), media_type="text/plain; version=0.0.4")

    served: ASGIApp = BodyLimit(FastChat(app, gateway), limit=gateway.cfg.max_request_bytes)
    return RequireKey(served, key=api_key) if api_key else served


class TurnStream(StreamingResponse):
    """SSE for one turn; its session is released when the response ends, even if the body never started
    (a client that disconnects at once cancels the response before Starlette iterates the events)."""

    def __init__(self, events: Any, release: Callable[[], Awaitable[None]], headers: dict):
        super().__init__(events, media_type="text/event-stream", headers=headers)
        self.release = release

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.release()


def _session_header(sid: str) -> dict:
    """The session id for the client to reuse; percent-encoded, since ids from the `user` field may be any text."""
    return {"X-Session-Id": quote(sid, safe="")} if sid else {}
