"""Client for SGLang's native API, spoken by both SGLang servers and our embedded engine.

Payload builders are plain functions so contract tests can pin the exact JSON
we send; `parse_*` functions pin what we read back.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Optional

import httpx
import orjson

from clawr1.serving.http_client import ConnectionFailed, HttpClient


class EngineError(RuntimeError):
    """The engine answered with an error or not at all."""

    def __init__(self, message: str, status: int = 0):
        super().__init__(message)
        self.status = status


class EngineUnavailable(EngineError):
    """The engine answered 503 (starting up or shutting down): another engine may serve the request."""


class EngineUnreachable(EngineError):
    """No connection to the engine (down, or timed out): another engine may serve the request."""


@dataclass
class Generation:
    """What the gateway and judge need from one /generate reply."""

    output_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    text: str
    finish_reason: str  # stop | length | abort ("" while streaming)
    prompt_logprobs: list[float]  # log P(x_i | x_<i) for the requested prompt suffix
    weight_version: int = 0  # the engine's version when the request finished
    matched_stop: Optional[str] = None  # the stop string that ended generation, if one did
    prompt_top_ids: list[list[int]] = field(default_factory=list)  # top-k ids at each scored prompt position
    prompt_top_logprobs: list[list[float]] = field(default_factory=list)


def generate_payload(input_ids: list[int], sampling_params: dict[str, Any], *, return_logprob: bool = True,
                     logprob_start_len: int = -1, top_logprobs_num: int = 0, stream: bool = False) -> dict[str, Any]:
    return {
        "input_ids": list(input_ids), "sampling_params": sampling_params, "return_logprob": return_logprob,
        "logprob_start_len": logprob_start_len, "top_logprobs_num": top_logprobs_num, "stream": stream,
    }


def prompt_logprobs_payload(input_ids: list[int], first_scored: int, top_k: int = 0) -> dict[str, Any]:
    """Score tokens first_scored.. of `input_ids` with one prefill (SGLang's entry 0 is always null, hence -1)."""
    if first_scored < 1:
        raise ValueError("the first token of a prompt has no log-prob")
    return generate_payload(input_ids, {"max_new_tokens": 0, "temperature": 0.0}, logprob_start_len=first_scored - 1,
                            top_logprobs_num=top_k)


def parse_version(value: Any) -> int:
    """SGLang versions are strings ('default' before any update); ours count publishes."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def token_versions(meta: dict, n: int) -> list[int]:
    """Per-token versions from SGLang's `weight_versions` spans, else the single `weight_version`."""
    spans = meta.get("weight_versions")
    if spans:
        out = [0] * n
        for span in spans:
            for i in range(span["start"], min(span["end"], n)):
                out[i] = parse_version(span["version"])
        return out
    return [parse_version(meta.get("weight_version"))] * n


def parse_generation(reply: dict) -> Generation:
    meta = reply["meta_info"]
    entries = meta.get("output_token_logprobs") or []
    ids = [int(e[1]) for e in entries] if entries else list(reply.get("output_ids") or [])
    prompt = [float(e[0]) for e in (meta.get("input_token_logprobs") or [])[1:]]
    tops = (meta.get("input_top_logprobs") or [])[1:]
    reason = meta.get("finish_reason") or {}
    return Generation(
        output_ids=ids, logprobs=[float(e[0]) for e in entries], versions=token_versions(meta, len(ids)),
        text=reply.get("text", ""), finish_reason=reason.get("type", "abort") if isinstance(reason, dict) else "",
        matched_stop=reason.get("matched") if isinstance(reason, dict) and isinstance(reason.get("matched"), str) else None,
        prompt_logprobs=prompt, weight_version=parse_version(meta.get("weight_version")),
        prompt_top_ids=[[int(e[1]) for e in row] for row in tops if row],
        prompt_top_logprobs=[[float(e[0]) for e in row] for row in tops if row],
    )


def _check_status(status: int, body: bytes, what: str) -> Any:
    if status == 503:
        raise EngineUnavailable(f"{what}: engine unavailable (HTTP 503)", status)
    if status != 200:
        raise EngineError(f"{what} failed with HTTP {status}: {body[:300].decode(errors='replace')}", status)
    return orjson.loads(body)


def _check(resp: httpx.Response, what: str) -> Any:
    return _check_status(resp.status_code, resp.content, what)


class EngineClient:
    """Async client for one engine, on the small keep-alive HTTP client (the gateway's hot path)."""

    def __init__(self, url: str, timeout_s: float = 300.0):
        self.url = url.rstrip("/")
        self.http = HttpClient(self.url, read_timeout_s=timeout_s)

    async def _post(self, what: str, payload: dict) -> Any:
        try:
            status, body = await self.http.request("POST", "/generate", orjson.dumps(payload))
        except ConnectionFailed as e:
            raise EngineUnreachable(f"{what}: {self.url} unreachable ({e})") from None
        return _check_status(status, body, what)

    async def generate(self, input_ids: list[int], sampling_params: dict[str, Any], **kw: Any) -> Generation:
        return parse_generation(await self._post("generate", generate_payload(input_ids, sampling_params, **kw)))

    async def generate_stream(self, input_ids: list[int], sampling_params: dict[str, Any],
                              **kw: Any) -> AsyncIterator[Generation]:
        """Partial results as the engine streams them (SGLang's default cumulative chunks); the last one is final."""
        payload = orjson.dumps(generate_payload(input_ids, sampling_params, stream=True, **kw))
        try:
            status, body = await self.http.open("POST", "/generate", payload)
            async with contextlib.aclosing(body):
                if status != 200:
                    _check_status(status, b"".join([c async for c in body]), "generate")
                async for data in _sse_events(body):
                    if data == b"[DONE]":
                        continue  # read on to the end of the reply, so the connection is reused
                    chunk = orjson.loads(data)
                    if "error" in chunk:
                        raise EngineError(f"generate failed mid-stream: {chunk['error']}")
                    yield parse_generation(chunk)
        except ConnectionFailed as e:
            raise EngineUnreachable(f"generate: {self.url} unreachable ({e})") from None

    async def health(self) -> bool:
        try:
            status, _ = await self.http.request("GET", "/health", read_timeout_s=5)
            return status == 200
        except ConnectionFailed:
            return False

    async def score(self, input_ids: list[int], first_scored: int, top_k: int = 0) -> Generation:
        """Log-probs of input_ids[first_scored:] from one prefill (`.prompt_logprobs`, `.prompt_top_*`)."""
        return parse_generation(await self._post("prompt scoring", prompt_logprobs_payload(input_ids, first_scored, top_k)))

    async def close(self) -> None:
        await self.http.close()


async def _sse_events(body: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The `data:` payloads of a server-sent-event stream, whatever the chunking of the bytes."""
    pending = b""
    async for chunk in body:
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            line = line.strip()
            if line.startswith(b"data:"):
                yield line[5:].strip()


class SyncEngineClient:
    """Blocking client, for the trainer's weight publishing."""

    def __init__(self, url: str, timeout_s: float = 300.0):
        self.url = url.rstrip("/")
        self.http = httpx.Client(base_url=self.url, timeout=timeout_s)

    def update_weights_from_disk(self, path: str, version: int) -> dict:
        reply = _check(self.http.post("/update_weights_from_disk",
                                      json={"model_path": path, "weight_version": str(version)}), "update_weights_from_disk")
        if not reply.get("success"):
            raise EngineError(f"update_weights_from_disk refused: {reply.get('message')}")
        return reply

    def model_info(self) -> dict:
        return _check(self.http.get("/get_model_info"), "get_model_info")

    def generate(self, input_ids: list[int], sampling_params: dict[str, Any], **kw: Any) -> Generation:
        return parse_generation(_check(self.http.post("/generate", json=generate_payload(input_ids, sampling_params, **kw)), "generate"))

    def close(self) -> None:
        self.http.close()
