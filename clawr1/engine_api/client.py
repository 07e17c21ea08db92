"""Client for SGLang's native API, spoken by both SGLang servers and our embedded engine.

Payload builders are plain functions so contract tests can pin the exact JSON
we send; `parse_*` functions pin what we read back.
"""
from __future__ import annotations

import contextlib
import logging
import re
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Iterator, Optional

import httpx
import orjson

from clawr1.engine_api import lora
from clawr1.engine_api.http_client import ConnectionFailed, HttpClient
from clawr1.engine_api.versions import parse_version, token_versions

log = logging.getLogger("clawr1.engine_api")


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
    top_ids: list[list[int]] = field(default_factory=list)  # top-k ids at each output position (top_logprobs_num)
    top_logprobs: list[list[float]] = field(default_factory=list)
    lora_path: Optional[str] = None  # the LoRA adapter the request named (set by generate: `through_adapter`)


def joined(first: Generation, rest: Generation) -> Generation:
    """A generation continued by another that started where it stopped (prompt + first's output ids)."""
    return Generation(
        output_ids=first.output_ids + rest.output_ids, logprobs=first.logprobs + rest.logprobs,
        versions=first.versions + rest.versions, text=first.text + rest.text, finish_reason=rest.finish_reason,
        prompt_logprobs=first.prompt_logprobs, weight_version=rest.weight_version, matched_stop=rest.matched_stop,
        top_ids=first.top_ids + rest.top_ids, top_logprobs=first.top_logprobs + rest.top_logprobs,
        lora_path=rest.lora_path)


def generate_payload(input_ids: list[int], sampling_params: dict[str, Any], *, return_logprob: bool = True,
                     logprob_start_len: int = -1, top_logprobs_num: int = 0, stream: bool = False,
                     lora_path: Optional[str] = None) -> dict[str, Any]:
    """POST /generate; `lora_path` names a loaded LoRA adapter (None: the base weights)."""
    payload = {
        "input_ids": list(input_ids), "sampling_params": sampling_params, "return_logprob": return_logprob,
        "logprob_start_len": logprob_start_len, "top_logprobs_num": top_logprobs_num, "stream": stream,
    }
    if lora_path is not None:
        payload["lora_path"] = lora_path
    return payload


def prompt_logprobs_payload(input_ids: list[int], first_scored: int, top_k: int = 0,
                            temperature: float = 1.0, lora_path: Optional[str] = None) -> dict[str, Any]:
    """Score tokens first_scored.. of `input_ids` with one prefill (SGLang's entry 0 is always null, hence -1).

    A temperature other than 1 uses the embedded engine's `input_logprob_temperature` (SGLang has none:
    its prompt log-probs are always of the raw logits)."""
    if first_scored < 1:
        raise ValueError("the first token of a prompt has no log-prob")
    payload = generate_payload(input_ids, {"max_new_tokens": 0, "temperature": 0.0}, logprob_start_len=first_scored - 1,
                               top_logprobs_num=top_k, lora_path=lora_path)
    if temperature != 1.0:
        payload["input_logprob_temperature"] = temperature
    return payload


def parse_generation(reply: dict) -> Generation:
    meta = reply["meta_info"]
    entries = meta.get("output_token_logprobs") or []
    ids = [int(e[1]) for e in entries] if entries else list(reply.get("output_ids") or [])
    prompt = [float(e[0]) for e in (meta.get("input_token_logprobs") or [])[1:]]
    tops = (meta.get("input_top_logprobs") or [])[1:]
    out_tops = meta.get("output_top_logprobs") or []
    reason = meta.get("finish_reason") or {}
    return Generation(
        output_ids=ids, logprobs=[float(e[0]) for e in entries], versions=token_versions(meta, len(ids)),
        text=reply.get("text", ""), finish_reason=reason.get("type", "abort") if isinstance(reason, dict) else "",
        matched_stop=reason.get("matched") if isinstance(reason, dict) and isinstance(reason.get("matched"), str) else None,
        prompt_logprobs=prompt, weight_version=parse_version(meta.get("weight_version")),
        prompt_top_ids=[[int(e[1]) for e in row] for row in tops if row],
        prompt_top_logprobs=[[float(e[0]) for e in row] for row in tops if row],
        top_ids=[[int(e[1]) for e in row or []] for row in out_tops],
        top_logprobs=[[float(e[0]) for e in row or []] for row in out_tops],
    )


def through_adapter(gen: Generation, lora_path: Optional[str]) -> Generation:
    """`gen`, generated through the LoRA adapter `lora_path` (None: the base), named so; through `slotK@vN` its
    tokens carry version N. The embedded engine reports that version itself; SGLang reports its weight_version,
    the base's, which a LoRA run never moves."""
    gen.lora_path = lora_path
    version = lora.adapter_version(lora_path) if lora_path else None
    if version is not None:
        gen.versions = [version] * len(gen.versions)
    return gen


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
        self._model_info_path: Optional[str] = None  # found on first use (see model_info)

    async def _post(self, what: str, payload: dict) -> Any:
        try:
            status, body = await self.http.request("POST", "/generate", orjson.dumps(payload))
        except ConnectionFailed as e:
            raise EngineUnreachable(f"{what}: {self.url} unreachable ({e})") from None
        return _check_status(status, body, what)

    async def generate(self, input_ids: list[int], sampling_params: dict[str, Any], **kw: Any) -> Generation:
        reply = await self._post("generate", generate_payload(input_ids, sampling_params, **kw))
        return through_adapter(parse_generation(reply), kw.get("lora_path"))

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
                    yield through_adapter(parse_generation(chunk), kw.get("lora_path"))
        except ConnectionFailed as e:
            raise EngineUnreachable(f"generate: {self.url} unreachable ({e})") from None

    async def health(self) -> bool:
        try:
            status, _ = await self.http.request("GET", "/health", read_timeout_s=5)
            return status == 200
        except ConnectionFailed:
            return False

    async def score(self, input_ids: list[int], first_scored: int, top_k: int = 0, temperature: float = 1.0,
                    lora_path: Optional[str] = None) -> Generation:
        """Log-probs of input_ids[first_scored:] from one prefill (`.prompt_logprobs`, `.prompt_top_*`)."""
        payload = prompt_logprobs_payload(input_ids, first_scored, top_k, temperature, lora_path)
        return parse_generation(await self._post("prompt scoring", payload))

    async def model_info(self) -> dict:
        """GET /model_info; an engine that answers 404 gets the deprecated /get_model_info from then on."""
        for path in _model_info_paths(self._model_info_path):
            try:
                status, body = await self.http.request("GET", path, read_timeout_s=30)
            except ConnectionFailed as e:
                raise EngineUnreachable(f"model info: {self.url} unreachable ({e})") from None
            if status == 404 and path == MODEL_INFO:
                self._model_info_path = OLD_MODEL_INFO
                continue
            self._model_info_path = path
            return _check_status(status, body, path.lstrip("/"))
        raise EngineError(f"model info: {self.url} has neither {MODEL_INFO} nor {OLD_MODEL_INFO}", 404)

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


# ---------------------------------------------------------------- model info and what an engine supports
#
# Facts from SGLang's sources (docs/sglang_api_notes.md §6 and §6a):
# - /model_info is the endpoint; /get_model_info is its deprecated alias (both in 0.5.15.post1 and 0.5.23).
# - /server_info (alias /get_server_info) reports "version": sglang.__version__.
# - From 0.5.21 on, /update_weights_from_distributed and /update_weights_from_tensor are refused (HTTP 400,
#   {"success": false, "message": "... must run between begin_weight_update() and end_weight_update()"})
#   unless a session was opened with POST /begin_weight_update; 0.5.20 and older have no such endpoint (404).
# - From 0.5.21 on, the scheduler flushes its cache while paused even with retracted requests queued
#   (Scheduler.flush_cache: is_fully_idle(ignore_waiting=self._engine_paused)); up to 0.5.20 a flush needs an
#   empty waiting queue, so after a `retract` pause it is refused for as long as the pause lasts. Only an
#   `abort` pause (which ends every request) lets those versions flush.

MODEL_INFO, OLD_MODEL_INFO = "/model_info", "/get_model_info"
SERVER_INFO_PATHS = ("/server_info", "/get_server_info")
SESSION_SINCE = (0, 5, 21)  # the first SGLang release with /begin_weight_update and flush-while-retracted
EMBEDDED_ENGINE = "clawr1-embedded"  # what our embedded engine's /server_info reports as "engine"
TINKER_ENGINE = "clawr1-tinker"  # serve.backend=tinker (clawr1/serving/tinker_client_engine.py): no scheduler to pause


def _model_info_paths(known: Optional[str]) -> tuple[str, ...]:
    return (known,) if known else (MODEL_INFO, OLD_MODEL_INFO)


@dataclass(frozen=True)
class UpdateProtocol:
    """How to change one engine's weights without stale cache entries or refused calls.

    pause_mode: "retract" where the engine can flush its cache while retracted requests wait
    (they are recomputed on the new weights after /continue_generation, nothing is lost);
    "abort" elsewhere (every running request ends with finish_reason abort, then the flush is
    accepted). session: wrap the update in /begin_weight_update ... /end_weight_update (True),
    never (False), or unknown (None: the first /begin_weight_update tells, 404 meaning no).
    adapter_tensors: whether LoRA adapters may come as tensors in the request. Not to SGLang on CPU: it takes
    pickled tensors whose memory is shared, which on CPU means file descriptors handed over by the sender's
    multiprocessing resource sharer; the server cannot authenticate to it, and its scheduler dies (0.5.23).
    """

    engine: str
    pause_mode: str
    session: Optional[bool]
    release: Optional[str] = None  # the version SGLang reported, as it reported it
    adapter_tensors: bool = True


def _release(version: Any) -> Optional[tuple[tuple[int, int, int], bool]]:
    """"0.5.15.post1" -> ((0, 5, 15), True); "0.5.21.dev3+g1a2b" -> ((0, 5, 21), False): (release, is final)."""
    if not isinstance(version, str):
        return None
    m = re.fullmatch(r"\s*v?(\d+)\.(\d+)(?:\.(\d+))?([^+\s]*)(\+\S*)?\s*", version)
    if not m:
        return None
    rest = m.group(4).lower()
    return (int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)), bool(re.fullmatch(r"(\.?post\d*)?", rest))


def update_protocol(info: Optional[dict]) -> UpdateProtocol:
    """The update protocol for an engine whose /server_info (or /model_info) reads `info` (None: it has neither)."""
    info = info if isinstance(info, dict) else {}
    if info.get("engine") == EMBEDDED_ENGINE:
        return UpdateProtocol(EMBEDDED_ENGINE, "retract", False)
    if info.get("engine") == TINKER_ENGINE:
        return UpdateProtocol(TINKER_ENGINE, "retract", False)
    version = info.get("version")
    release = _release(version)
    if release is None:  # not SGLang, or one that does not say: the safe choices, and ask about the session
        return UpdateProtocol(f"unknown engine (version {version!r})", "abort", None)
    base, final = release
    name, tensors = f"sglang {version}", info.get("device") != "cpu"
    if base > SESSION_SINCE or (base == SESSION_SINCE and final):
        return UpdateProtocol(name, "retract", True, version, tensors)
    if base < SESSION_SINCE:
        return UpdateProtocol(name, "abort", False, version, tensors)
    return UpdateProtocol(name, "abort", None, version, tensors)  # a 0.5.21 pre-release: may or may not have either


def detect_update_protocol(http: httpx.Client) -> UpdateProtocol:
    """Ask the engine what it is: /server_info, /get_server_info, then /model_info (the first that answers)."""
    info: Optional[dict] = None
    for path in (*SERVER_INFO_PATHS, MODEL_INFO):
        resp = http.get(path)
        if resp.status_code == 404:
            continue
        body = _check(resp, path.lstrip("/"))
        if isinstance(body, dict) and ("version" in body or "engine" in body):
            info = body
            break
    proto = update_protocol(info)
    log.info("engine %s: %s; weight updates pause with %s, %s", http.base_url, proto.engine, proto.pause_mode,
             {True: "inside a weight-update session", False: "without a session",
              None: "with a session if /begin_weight_update exists"}[proto.session])
    return proto


def flush_cache_until_accepted(http: httpx.Client, timeout_s: float, interval_s: float = 0.5) -> int:
    """GET /flush_cache until the engine answers 200; returns the number of refusals.

    SGLang answers 400 (plain text) while requests are running or queued; slime retries the same
    way. The `?timeout=` form is not used: its deferred check ignores the pause, so with retracted
    requests queued it would wait out its whole timeout (SchedulerFlushWrapper, 0.5.23)."""
    deadline = time.monotonic() + timeout_s
    refusals = 0
    while True:
        resp = http.get("/flush_cache")
        if resp.status_code == 200:
            return refusals
        if resp.status_code != 400:
            _check(resp, "flush_cache")
        refusals += 1
        if time.monotonic() + interval_s > deadline:
            raise EngineError(f"/flush_cache still refused after {timeout_s:g}s ({refusals} tries): "
                              f"{resp.text.strip()[:300]}", resp.status_code)
        time.sleep(interval_s)


class SyncEngineClient:
    """Blocking client, for the trainer's weight publishing.

    update_weights_from_disk pauses the engine first, flushes its cache, loads, and continues
    (see its doc), so the load never waits for running generations and no cache entry computed
    with the old weights survives. How to pause is detected once per client (`update_protocol`).
    """

    def __init__(self, url: str, timeout_s: float = 300.0, *, flush_timeout_s: float = 120.0,
                 retry_interval_s: float = 0.5):
        self.url = url.rstrip("/")
        self.http = httpx.Client(base_url=self.url, timeout=timeout_s)
        self.flush_timeout_s, self.retry_interval_s = flush_timeout_s, retry_interval_s
        self._model_info_path: Optional[str] = None  # found on first use (see model_info)
        self._protocol: Optional[UpdateProtocol] = None

    def update_protocol(self) -> UpdateProtocol:
        """What this engine supports, asked once (docs/sglang_api_notes.md §6a)."""
        if self._protocol is None:
            self._protocol = detect_update_protocol(self.http)
        return self._protocol

    def pause_generation(self, mode: str) -> None:
        _check(self.http.post("/pause_generation", json={"mode": mode}), "pause_generation")

    def continue_generation(self) -> None:
        _check(self.http.post("/continue_generation", json={}), "continue_generation")

    def flush_cache(self) -> int:
        """Flush the engine's cache, retrying while it refuses (requests running); returns the refusals."""
        return flush_cache_until_accepted(self.http, self.flush_timeout_s, self.retry_interval_s)

    def update_weights_from_disk(self, path: str, version: int) -> dict:
        """Load HF safetensors from `path` as weight version `version`: pause, flush, load, continue.

        The pause comes first so the load does not wait for running generations (SGLang takes
        a writer lock that waits for every in-flight request unless the engine is paused) and
        the flush comes before the load so no cache entry of the old weights serves a request
        tagged with the new version. The load itself asks for no flush (`flush_cache: false`):
        the cache is already empty and stays so while paused. The engine continues even when
        the load fails: SGLang rolls back to the old weights on a failed disk load, and the
        embedded engine checks everything before it changes anything.
        """
        return self._paused_update(
            "update_weights_from_disk",
            lambda: self.http.post("/update_weights_from_disk", json=disk_update_payload(path, version)))

    def update_weights_from_tensor_bytes(self, payload: bytes, version: int, chunk_bytes: int = 1 << 20) -> dict:
        """Stream a safetensors file (`payload`) into /update_weights_from_tensor as raw bytes, chunk by chunk,
        as weight version `version`; paused, flushed and continued as update_weights_from_disk is. The
        engine need not see any disk of ours (clawr1's embedded engine; SGLang takes the JSON form)."""
        def chunks() -> Iterator[bytes]:
            view = memoryview(payload)
            for start in range(0, len(view), chunk_bytes):
                yield bytes(view[start:start + chunk_bytes])

        return self._paused_update(
            "update_weights_from_tensor",
            lambda: self.http.post("/update_weights_from_tensor", content=chunks(),
                                   params={"weight_version": str(version)},
                                   headers={"Content-Type": "application/octet-stream"}))

    def update_weights_from_ipc(self, body: dict) -> dict:
        """Weights shared in place (clawr1/engine_api/ipc.py's payload) into the embedded engine's
        /update_weights_from_ipc; paused, flushed and continued as the other updates are."""
        return self._paused_update("update_weights_from_ipc", lambda: self.http.post("/update_weights_from_ipc", json=body))

    def _paused_update(self, what: str, send: Callable[[], httpx.Response]) -> dict:
        proto = self.update_protocol()
        self.pause_generation(proto.pause_mode)
        try:
            self.flush_cache()
            reply = _check(send(), what)
            if not reply.get("success"):
                raise EngineError(f"{what} refused: {reply.get('message')}")
        except BaseException:
            try:
                self.continue_generation()
            except Exception as e:  # the first failure is the one to report
                log.warning("engine %s: /continue_generation after a failed update: %s", self.url, e)
            raise
        self.continue_generation()
        return reply

    def model_info(self) -> dict:
        """GET /model_info; an engine that answers 404 gets the deprecated /get_model_info from then on."""
        for path in _model_info_paths(self._model_info_path):
            resp = self.http.get(path)
            if resp.status_code == 404 and path == MODEL_INFO:
                self._model_info_path = OLD_MODEL_INFO
                continue
            self._model_info_path = path
            return _check(resp, path.lstrip("/"))
        raise EngineError(f"model info: {self.url} has neither {MODEL_INFO} nor {OLD_MODEL_INFO}", 404)

    def weight_version(self) -> int:
        return parse_version(self.model_info().get("weight_version"))

    # ---- LoRA adapters (clawr1/engine_api/lora.py). Loading never pauses: running requests keep their adapter.
    def load_lora_adapter(self, name: str, path: str) -> dict:
        """A PEFT directory this engine can read."""
        return _lora_reply(self.http.post("/load_lora_adapter", json=lora.load_from_disk_payload(name, path)),
                           f"load_lora_adapter {name}")

    def load_lora_adapter_from_tensors(self, name: str, config: dict, tensors: dict, tp_size: int = 1) -> dict:
        """PEFT tensors in the request, in the shape this engine's kind and release take; EngineError, sending
        nothing, to an engine that cannot take them (UpdateProtocol.adapter_tensors)."""
        proto = self.update_protocol()
        if not proto.adapter_tensors:
            raise EngineError(f"load_lora_adapter_from_tensors {name}: {proto.engine} on CPU takes adapters from disk "
                              "only (/load_lora_adapter)")
        release = _release(proto.release)
        payload = lora.load_from_tensors_payload(name, config, tensors, embedded=proto.engine == EMBEDDED_ENGINE,
                                                 release=release[0] if release else None, tp_size=tp_size)
        return _lora_reply(self.http.post("/load_lora_adapter_from_tensors", json=payload),
                           f"load_lora_adapter_from_tensors {name}")

    def unload_lora_adapter(self, name: str) -> dict:
        """The engine answers once the adapter's in-flight requests are done."""
        return _lora_reply(self.http.post("/unload_lora_adapter", json=lora.unload_payload(name)),
                           f"unload_lora_adapter {name}")

    def generate(self, input_ids: list[int], sampling_params: dict[str, Any], **kw: Any) -> Generation:
        reply = _check(self.http.post("/generate", json=generate_payload(input_ids, sampling_params, **kw)), "generate")
        return through_adapter(parse_generation(reply), kw.get("lora_path"))

    def close(self) -> None:
        self.http.close()


def _lora_reply(resp: httpx.Response, what: str) -> dict:
    """SGLang's LoRAUpdateOutput; a refusal (HTTP 400, success false) raises EngineError with its message."""
    try:
        body = resp.json()
    except ValueError:
        body = None
    if resp.status_code == 200 and isinstance(body, dict) and body.get("success"):
        return body
    message = body.get("error_message") if isinstance(body, dict) else resp.text[:300]
    raise EngineError(f"{what} refused (HTTP {resp.status_code}): {message}", resp.status_code)


def final_weight_version(url: str) -> dict[str, Any]:
    """For a run's summary.json: the engine's weight version at the end, or why it could not be read."""
    client = SyncEngineClient(url, timeout_s=10)
    try:
        return {"engine_weight_version": client.weight_version()}
    except (httpx.HTTPError, EngineError, ValueError) as e:
        return {"engine_weight_version_error": str(e)}
    finally:
        client.close()


def disk_update_payload(path: str, version: int) -> dict[str, Any]:
    """POST /update_weights_from_disk after a pause and a flush (see SyncEngineClient.update_weights_from_disk)."""
    return {"model_path": path, "weight_version": str(version), "flush_cache": False}
