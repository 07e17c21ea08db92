"""`clawr1 gateway` over HTTP: OpenAI-compatible routes, auth, size limits and errors in OpenAI's shape."""
from __future__ import annotations

import contextlib
import hmac
import ipaddress
import os
from pathlib import Path
from urllib.parse import quote

import orjson
from typing import Optional

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from clawr1.config import GatewayConfig
from clawr1.gateway.openai_types import ChatCompletionRequest, CompleteRequest, FeedbackRequest, error_body
from clawr1.gateway.service import Gateway, GatewayError, TurnContext

OPEN_PATHS = {"/health"}


def resolve_api_key(cfg: GatewayConfig) -> Optional[str]:
    """The key from the file named in the config, else from the environment variable it names."""
    if cfg.api_key_file:
        key = Path(cfg.api_key_file).expanduser().read_text().strip()
        if not key:
            raise SystemExit(f"gateway.api_key_file {cfg.api_key_file} is empty")
        return key
    return os.environ.get(cfg.api_key_env) or None


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
        body = JSONResponse(error_body(f"the request body is larger than {self.limit} bytes", code="request_too_large"),
                            status_code=413)
        await send({"type": "http.response.start", "status": 413, "headers": body.raw_headers})
        await send({"type": "http.response.body", "body": body.body})


class _TooLarge(Exception):
    pass


class RequireKey:
    """ASGI middleware: every path but /health needs `Authorization: Bearer <key>`."""

    def __init__(self, app, key: str):
        self.app, self.expected = app, f"Bearer {key}".encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS:
            given = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                body = JSONResponse(error_body("missing or wrong API key", "authentication_error", code="invalid_api_key"),
                                    status_code=401)
                await send({"type": "http.response.start", "status": 401, "headers": body.raw_headers})
                await send({"type": "http.response.body", "body": body.body})
                return
        await self.app(scope, receive, send)


def create_app(gateway: Gateway, api_key: Optional[str] = None) -> FastAPI:
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
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        return JSONResponse(error_body(f"{where}: {first.get('msg', 'invalid request')}", param=where or None),
                            status_code=400)

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "engines_healthy": sum(gateway.router.healthy)}

    @app.get("/v1/models")
    @app.get("/s/{session_id}/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": gateway.cfg.model_name, "object": "model", "owned_by": "clawr1"}]}

    async def _chat(body: ChatCompletionRequest, request: Request, path_session: Optional[str]) -> Response:
        h = request.headers
        ctx = TurnContext(session_id=h.get("x-session-id") or path_session or body.user,
                          side=h.get("x-turn-type", "main").lower() == "side",
                          group_id=h.get("x-group-id", ""), task_id=h.get("x-task-id", ""))
        if body.stream:
            events, sid = await gateway.chat_stream(body, ctx)
            return StreamingResponse(events, media_type="text/event-stream", headers=_session_header(sid))
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

    @app.post("/v1/sessions/{session_id}/complete")
    async def complete(session_id: str, body: CompleteRequest) -> dict:
        if not gateway.complete(session_id, body.reward, body.text, body.done):
            raise GatewayError(404, f"no open session {session_id!r}", code="session_not_found")
        return {"session_id": session_id, "completed": body.done}

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(gateway.metrics.render(), media_type="text/plain; version=0.0.4")

    app.add_middleware(BodyLimit, limit=gateway.cfg.max_request_bytes)
    if api_key:
        app.add_middleware(RequireKey, key=api_key)
    return app


def _session_header(sid: str) -> dict:
    """The session id for the client to reuse; percent-encoded, since ids from the `user` field may be any text."""
    return {"X-Session-Id": quote(sid, safe="")} if sid else {}
