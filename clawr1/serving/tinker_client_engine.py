"""`clawr1 serve` with serve.backend=tinker: the engine API in front of Tinker sampling clients.

Why: the gateway, the judge's teacher and the trainer's weight publishing all speak one engine API (SGLang's native
subset that the embedded engine serves, clawr1/serving/server.py; callers in clawr1/engine_api/client.py). With
trainer.backend=tinker the weights live in Tinker's service, so sampling must go through Tinker too. This process
translates, so none of those callers changes: the same requests, the same reply JSON.

- /generate is one `SamplingClient.sample` per prompt (and per `n`). Tokens and log-probs are exactly what Tinker
  returned; nothing is re-tokenized. Prompt log-probs (`logprob_start_len`, the teacher's scoring) come from the
  same call (`include_prompt_logprobs`), or from `compute_logprobs` when no token is asked for.
- Stop rules are the embedded engine's: EOS and `stop_token_ids` (unless `ignore_eos`) and `stop` strings end a
  generation at the token that completes them. Tinker takes strings or ids but not both, so the stop set it can
  express is sent, and the returned tokens are cut at the first stop by the embedded rules (a no-op whenever
  Tinker already stopped there). Cutting a sample at a point is the same as stopping there: tokens are sampled
  left to right.
- No token streaming: Tinker answers a sample whole. A streamed request (`stream: true`) gets, once Tinker has
  answered, the whole result in one `data:` chunk (the final one, with its finish_reason), then `data: [DONE]`;
  a batch gets one such chunk per prompt (with its `index`). Nothing is paced to look like token streaming.
- Weights: POST /update_weights_from_disk {"model_path": "tinker://...", "weight_version": N} makes a new
  sampling client of that path, checks it with a one-token sample, and sends new requests to it. A request keeps
  the client (and version) it started on, so in-flight requests finish on the old weights and none fails; a path
  Tinker refuses leaves the old client in use. /pause_generation, /continue_generation and /flush_cache succeed
  and do nothing: there is no local scheduler or KV cache. Every reply's weight_version is that of the client
  the request went to.
- Refused with 400, naming what: LoRA adapters (Tinker samples one set of weights per client), tensor and IPC
  weight pushes (the weights are Tinker's), top_logprobs_num > 0, input_logprob_temperature != 1, min_p,
  images. A Tinker call slower than tinker.request_timeout_s fails its request with 504; a Tinker failure is 502
  (400 when Tinker says the request was the client's error).

The teacher engine of judge.teacher=frozen is this same code started on judge.teacher_port: nobody updates it,
so it stays on the base model. The API key (the `tinker.api_key_env` variable) goes to the SDK only: it is never
logged or written.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable, Iterable, Optional

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from clawr1.config import Config
from clawr1.engine_api.versions import parse_version
from clawr1.engine_api.client import TINKER_ENGINE
from clawr1.model_path import load_tokenizer, read_model_facts, resolve_model_path, tinker_base_model
from clawr1.serving.engine import GenerateRequest, RequestError, SamplingParams
from clawr1.serving.server import error_response, parse_generate, read_json_body

log = logging.getLogger("clawr1.serve")

BACKEND = "serve.backend=tinker"
PROBE_PROMPT = [0]  # a new sampler's check: one token every vocabulary has
UNSUPPORTED_INPUTS = ("image_data", "video_data", "audio_data", "input_embeds")


class TinkerCallError(RuntimeError):
    """A Tinker call that failed or timed out; `status` is the HTTP status the request gets."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


def unsupported(what: str) -> str:
    return f"{what} is not supported with {BACKEND}"


def _reason(message: str) -> str:
    """The server's reason in the SDK's RequestFailedError text, without the SDK's request bookkeeping."""
    return message.removeprefix("Request failed: ").split(" for self.request_id=")[0]


@dataclass(frozen=True)
class Sampler:
    """One Tinker sampling client and the weight version it serves."""

    client: Any  # tinker.SamplingClient
    version: int
    model_path: Optional[str] = None  # the tinker:// weights; None: the base model


# ---------------------------------------------------------------------------------------------------------------
# Engine requests -> Tinker calls, Tinker answers -> engine replies (pure functions)
# ---------------------------------------------------------------------------------------------------------------

def check_request(req: GenerateRequest) -> None:
    """Refuse (RequestError, 400) what Tinker cannot do, before anything is sent."""
    if not req.input_ids:
        raise RequestError("input_ids cannot be empty")
    if any(not isinstance(t, int) or isinstance(t, bool) or t < 0 for t in req.input_ids):
        raise RequestError("input_ids must be non-negative integers")
    if req.logprob_start_len > len(req.input_ids):
        raise RequestError(f"logprob_start_len ({req.logprob_start_len}) is higher than the number of input tokens "
                           f"({len(req.input_ids)})")
    # no "LoRA adapter" in this message: the gateway reads that phrase as an adapter unloaded mid-publish, and retries
    refusals = {"top_logprobs_num > 0": req.top_logprobs_num > 0, "lora_path": req.lora_path is not None,
                "input_logprob_temperature other than 1": req.input_logprob_temperature != 1.0,
                "sampling_params.min_p": req.params.min_p > 0}
    named = [what for what, refused in refusals.items() if refused]
    if named:
        raise RequestError(unsupported(", ".join(named)))


def wants_prompt_logprobs(req: GenerateRequest) -> bool:
    return req.return_logprob and 0 <= req.logprob_start_len < len(req.input_ids)


def tinker_stop(p: SamplingParams, end_ids: Iterable[int]) -> Optional[list]:
    """Tinker's `stop`: None keeps its EOS stopping, [] stops on nothing, else strings or token ids (not both)."""
    if p.stop:
        return list(p.stop)  # the ids, if any, are applied to the answer (finish_point)
    if p.ignore_eos:
        return []
    if p.stop_token_ids:
        return sorted(set(p.stop_token_ids) | set(end_ids))
    return None


def tinker_params(p: SamplingParams, end_ids: Iterable[int]) -> Any:
    from tinker import types

    return types.SamplingParams(max_tokens=p.max_new_tokens, seed=p.sampling_seed, stop=tinker_stop(p, end_ids),
                                temperature=p.temperature, top_k=p.top_k, top_p=p.top_p)


@dataclass(frozen=True)
class Finish:
    keep: int  # how many of the returned tokens the reply keeps
    reason: dict  # the embedded engine's finish_reason
    text_cut: Optional[int] = None  # where a matched stop string cuts the text


def finish_point(tokens: list[int], tinker_reason: str, p: SamplingParams, end_ids: Iterable[int],
                 decode: Callable[[list[int]], str]) -> Finish:
    """Where the embedded engine's rules end these tokens: the first stop id or stop string, else their end."""
    stop_ids = set() if p.ignore_eos else set(end_ids) | set(p.stop_token_ids)
    strings = p.stop if p.stop and any(s in decode(tokens) for s in p.stop) else []
    for i, token in enumerate(tokens):
        if token in stop_ids:
            return Finish(i + 1, {"type": "stop", "matched": token})
        if strings:
            text = decode(tokens[: i + 1])
            for s in strings:
                at = text.find(s)
                if at >= 0:
                    return Finish(i + 1, {"type": "stop", "matched": s}, at + (len(s) if p.no_stop_trim else 0))
    if tinker_reason == "length" or len(tokens) >= p.max_new_tokens:
        return Finish(len(tokens), {"type": "length", "length": len(tokens)})
    return Finish(len(tokens), {"type": "stop", "matched": tokens[-1] if tokens else None})


def prompt_entries(ids: list[int], start: int, logprobs: Optional[list]) -> list[list]:
    """SGLang's input_token_logprobs from `start` on: entry 0 has no log-prob, entry k is ids[start + k]'s."""
    if logprobs is None or len(logprobs) != len(ids):
        raise TinkerCallError(f"Tinker returned {len(logprobs or [])} prompt log-probs for {len(ids)} tokens", 502)
    return [[None, ids[start], None]] + [[float(logprobs[k]), ids[k], None] for k in range(start + 1, len(ids))]


def reply(req: GenerateRequest, version: int, tokens: list[int], logprobs: list[float], finish: Finish,
          prompt: list[list], text: str, cached: int, started: float) -> dict:
    """The embedded engine's reply (clawr1/serving/engine.py Engine.result), all tokens of one weight version."""
    meta: dict[str, Any] = {
        "id": req.rid, "finish_reason": finish.reason, "prompt_tokens": len(req.input_ids),
        "completion_tokens": len(tokens), "cached_tokens": cached, "num_retractions": 0,
        "weight_version": str(version),
        "weight_versions": [{"version": str(version), "start": 0, "end": len(tokens)}] if tokens else [],
        "e2e_latency": time.time() - started,
    }
    if req.return_logprob:
        meta["input_token_logprobs"] = prompt
        meta["output_token_logprobs"] = [[float(lp), t, None] for lp, t in zip(logprobs, tokens)]
    return {"text": text, "output_ids": list(tokens), "meta_info": meta}


# ---------------------------------------------------------------------------------------------------------------
# The engine: which sampler serves new requests, and the Tinker calls
# ---------------------------------------------------------------------------------------------------------------

class TinkerEngine:
    """Engine requests on the current Tinker sampler; weight updates switch it for new requests."""

    def __init__(self, service: Any, sampler: Sampler, base_model: str, model_dir: Path, tokenizer: Any,
                 timeout_s: float):
        self.service, self.current, self.base_model = service, sampler, base_model
        self.model_dir, self.tokenizer, self.timeout_s = model_dir, tokenizer, timeout_s
        self.facts = read_model_facts(model_dir)
        self._update_lock = asyncio.Lock()
        self.requests_total = self.tokens_total = self.running = 0

    async def call(self, what: str, future: Any) -> Any:
        """Await an SDK future within tinker.request_timeout_s; failures become TinkerCallError."""
        import tinker
        from tinker import types

        try:
            return await future.result_async(timeout=self.timeout_s)
        except TimeoutError:
            raise TinkerCallError(f"Tinker did not answer {what} within {self.timeout_s:g} s "
                                  "(tinker.request_timeout_s)", 504) from None
        except tinker.RequestFailedError as e:
            user = e.category == types.RequestErrorCategory.User
            raise TinkerCallError(f"Tinker refused {what}: {_reason(e.message)}", 400 if user else 502) from None
        except (tinker.BadRequestError, tinker.UnprocessableEntityError, tinker.NotFoundError) as e:
            raise TinkerCallError(f"Tinker refused {what}: {e}", 400) from None
        except tinker.TinkerError as e:
            raise TinkerCallError(f"Tinker failed {what}: {type(e).__name__}: {e}", 502) from None

    async def generate(self, req: GenerateRequest) -> dict:
        """One prompt, one sample, on the sampler current when it starts."""
        sampler, started = self.current, time.time()
        self.requests_total += 1
        self.running += 1
        try:
            tokens, logprobs, reason, prompt_logprobs, cached = await self._sample(sampler, req)
        finally:
            self.running -= 1
        p = req.params
        finish = finish_point(tokens, reason, p, self.facts.end_ids, self._decoder(p))
        tokens, logprobs = tokens[: finish.keep], logprobs[: finish.keep]
        self.tokens_total += len(tokens)
        prompt = prompt_entries(req.input_ids, req.logprob_start_len, prompt_logprobs) if wants_prompt_logprobs(req) \
            else []
        return reply(req, sampler.version, tokens, logprobs, finish, prompt, self._text(tokens, finish, p),
                     cached, started)

    async def _sample(self, sampler: Sampler, req: GenerateRequest) -> tuple[list[int], list[float], str,
                                                                               Optional[list], int]:
        """(tokens, their log-probs, Tinker's stop reason, the prompt's log-probs, cached prompt tokens)."""
        from tinker import types

        prompt = types.ModelInput.from_ints(req.input_ids)
        with_prompt = wants_prompt_logprobs(req)
        if req.params.max_new_tokens == 0:
            scored = await self.call("compute_logprobs", sampler.client.compute_logprobs(prompt)) if with_prompt \
                else None
            return [], [], "length", scored, 0
        answer = await self.call("sample", sampler.client.sample(
            prompt, 1, tinker_params(req.params, self.facts.end_ids), include_prompt_logprobs=with_prompt))
        if len(answer.sequences) != 1:
            raise TinkerCallError(f"Tinker returned {len(answer.sequences)} samples for 1", 502)
        sequence = answer.sequences[0]
        if req.return_logprob and sequence.logprobs is None:
            raise TinkerCallError("Tinker returned no log-probs for the sampled tokens", 502)
        tokens = list(sequence.tokens)
        logprobs = list(sequence.logprobs) if sequence.logprobs is not None else [0.0] * len(tokens)
        return tokens, logprobs, str(sequence.stop_reason), answer.prompt_logprobs, answer.prompt_cache_hit_tokens

    def _decoder(self, p: SamplingParams) -> Callable[[list[int]], str]:
        return lambda ids: self.tokenizer.decode(ids, skip_special_tokens=p.skip_special_tokens)

    def _text(self, tokens: list[int], finish: Finish, p: SamplingParams) -> str:
        """As the embedded engine: the stop token is not in the text (unless no_stop_trim), nor what follows a
        matched stop string."""
        by_id = finish.reason.get("type") == "stop" and isinstance(finish.reason.get("matched"), int)
        text = self._decoder(p)(tokens[:-1] if by_id and not p.no_stop_trim else tokens)
        return text if finish.text_cut is None else text[: finish.text_cut]

    async def update(self, model_path: str, version: Optional[int]) -> int:
        """Sample `model_path` from now on, as `version` (None: one more than now); the old sampler stays
        current if Tinker refuses the path."""
        from tinker import types

        async with self._update_lock:
            client = await self.call(f"create_sampling_client({model_path!r})",
                                     self.service.create_sampling_client(model_path=model_path))
            await self.call(f"a sample of {model_path!r}", client.sample(
                types.ModelInput.from_ints(PROBE_PROMPT), 1, types.SamplingParams(max_tokens=1)))
            new = self.current.version + 1 if version is None else version
            self.current = Sampler(client, new, model_path)
        log.info("sampling %s as weight version %d", model_path, new)
        return new


# ---------------------------------------------------------------------------------------------------------------
# The app
# ---------------------------------------------------------------------------------------------------------------

async def _all(calls: list[Awaitable[dict]]) -> list[dict]:
    """Every call's result; one failure (or the client leaving) cancels the rest."""
    tasks = [asyncio.ensure_future(c) for c in calls]
    try:
        return await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()


async def _chunks(results: list[dict], is_batch: bool) -> AsyncIterator[bytes]:
    """The embedded engine's SSE stream, each result being its final chunk: `data: {json}` each, then [DONE]."""
    for i, result in enumerate(results):
        yield f"data: {json.dumps({**result, 'index': i} if is_batch else result)}\n\n".encode()
    yield b"data: [DONE]\n\n"


def _parse(body: dict, tokenizer: Any) -> tuple[list[GenerateRequest], bool]:
    named = [k for k in UNSUPPORTED_INPUTS if body.get(k) is not None]
    if named:
        raise RequestError(unsupported(", ".join(named)))
    reqs, is_batch = parse_generate(body, tokenizer)
    for r in reqs:
        check_request(r)
    return reqs, is_batch


def _update_reply(success: bool, message: str, status: int = 200) -> JSONResponse:
    return JSONResponse({"success": success, "message": message, "num_paused_requests": 0}, status_code=status)


def create_app(engine: TinkerEngine) -> FastAPI:
    app = FastAPI(title="clawr1 engine API in front of Tinker", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(RequestError)
    async def _bad_request(_: Request, exc: RequestError) -> JSONResponse:
        return error_response(str(exc))

    @app.exception_handler(TinkerCallError)
    async def _tinker_failed(_: Request, exc: TinkerCallError) -> JSONResponse:
        log.warning("%s", exc)
        return error_response(str(exc), exc.status)

    @app.get("/health")
    @app.get("/health_generate")
    async def health() -> Response:
        return Response(status_code=200 if engine.current is not None else 503)

    @app.get("/get_model_info")
    @app.get("/model_info")
    async def model_info() -> dict:
        facts, current = engine.facts, engine.current
        return {"model_path": str(engine.model_dir), "tokenizer_path": str(engine.model_dir), "is_generation": True,
                "weight_version": str(current.version), "model_type": facts.model_type,
                "architectures": _config(engine.model_dir).get("architectures"),
                "served_model_name": engine.base_model,
                "input_logprob_temperature": False,  # Tinker scores prompts at temperature 1 only
                "nccl_version": None,  # no weights are pushed here
                "tinker_base_model": engine.base_model, "tinker_model_path": current.model_path}

    @app.get("/server_info")
    @app.get("/get_server_info")
    async def server_info() -> dict:
        """Not SGLang (no "version"), not the embedded engine: a weight publisher pauses with its safe default,
        which is a no-op here, and needs no weight-update session."""
        return {"engine": TINKER_ENGINE, "model_path": str(engine.model_dir), "tinker_base_model": engine.base_model,
                "tinker_model_path": engine.current.model_path, "weight_version": str(engine.current.version),
                "context_length": engine.facts.max_position_embeddings or None}

    @app.api_route("/generate", methods=["POST", "PUT"])
    async def generate(request: Request) -> Response:
        body = await read_json_body(request)
        reqs, is_batch = _parse(body, engine.tokenizer)
        results = await _all([engine.generate(r) for r in reqs])
        if body.get("stream"):
            return StreamingResponse(_chunks(results, is_batch), media_type="text/event-stream")
        return JSONResponse(results if is_batch else results[0])

    @app.post("/update_weights_from_disk")
    async def update_weights_from_disk(request: Request) -> JSONResponse:
        body = await read_json_body(request)
        path = body.get("model_path")
        if not isinstance(path, str) or not path:
            return _update_reply(False, "model_path (the tinker:// path of saved sampler weights) is required", 400)
        try:
            version = None if body.get("weight_version") is None else parse_version(body["weight_version"])
            new = await engine.update(path, version)
        except ValueError as e:
            return _update_reply(False, f"weight_version: {e}", 400)
        except TinkerCallError as e:
            log.warning("weights %s not loaded: %s", path, e)
            return _update_reply(False, f"could not sample {path!r} (version {engine.current.version} stays): {e}",
                                 e.status)
        return _update_reply(True, f"Succeeded to update model weights. Weight version updated to {new}.")

    for path in ("/update_weights_from_tensor", "/update_weights_from_ipc"):
        app.post(path)(_refuse_update(path))
    for path in ("/load_lora_adapter", "/load_lora_adapter_from_tensors", "/unload_lora_adapter"):
        app.post(path)(_refuse_lora(path))

    @app.post("/pause_generation")
    async def pause_generation() -> JSONResponse:
        return JSONResponse({"message": "Generation paused successfully.", "status": "ok"})

    @app.post("/continue_generation")
    async def continue_generation() -> JSONResponse:
        return JSONResponse({"message": "Generation continued successfully.", "status": "ok"})

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache() -> PlainTextResponse:
        return PlainTextResponse("Cache flushed.\nThere is no local cache with serve.backend=tinker.\n")

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        rows = [("requests_total", "counter", engine.requests_total),
                ("generated_tokens_total", "counter", engine.tokens_total),
                ("running_requests", "gauge", engine.running), ("weight_version", "gauge", engine.current.version)]
        return PlainTextResponse("".join(f"# TYPE clawr1_engine_{n} {t}\nclawr1_engine_{n} {v}\n" for n, t, v in rows))

    return app


def _refuse_update(path: str) -> Callable[[], Awaitable[JSONResponse]]:
    async def endpoint() -> JSONResponse:
        return JSONResponse({"success": False, "message": unsupported(path[1:]) + ": give Tinker's weights to "
                             "/update_weights_from_disk as a tinker:// path"}, status_code=400)
    return endpoint


def _refuse_lora(path: str) -> Callable[[], Awaitable[JSONResponse]]:
    async def endpoint() -> JSONResponse:  # SGLang's LoRAUpdateOutput, as the embedded engine answers
        return JSONResponse({"success": False, "error_message": unsupported(path[1:]), "loaded_adapters": {}},
                            status_code=400)
    return endpoint


def _config(model_dir: Path) -> dict:
    try:
        return json.loads((model_dir / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return {}


# ---------------------------------------------------------------------------------------------------------------
# `clawr1 serve` with serve.backend=tinker
# ---------------------------------------------------------------------------------------------------------------

def serve_tinker(cfg: Config) -> int:
    """Start the base model's sampling client, then serve the engine API on serve.host:serve.port."""
    import tinker

    t = cfg.tinker
    model_dir = resolve_model_path(cfg.model, weights=False)  # its tokenizer and config.json only
    base_model = tinker_base_model(t, model_dir)
    where = t.base_url or "Tinker's default service"
    log.info("engine API on %s in front of Tinker at %s: base model %s (tokenizer %s), weight version %d",
             cfg.engine_url, where, base_model, model_dir, cfg.serve.weight_version)
    service = tinker.ServiceClient(base_url=t.base_url or None, api_key=os.environ.get(t.api_key_env) or None)
    try:
        client = service.create_sampling_client(base_model=base_model).result(timeout=t.request_timeout_s)
    except Exception as e:  # nothing to serve without it; say why and stop
        log.error("could not create a Tinker sampling client of %s at %s: %s: %s", base_model, where,
                  type(e).__name__, e)
        return 2
    engine = TinkerEngine(service, Sampler(client, cfg.serve.weight_version), base_model, model_dir,
                          load_tokenizer(cfg.model, model_dir), t.request_timeout_s)
    try:
        uvicorn.run(create_app(engine), host=cfg.serve.host, port=cfg.serve.port, log_level="warning",
                    timeout_keep_alive=75)  # longer than clients keep idle connections: no reuse-vs-close race
    finally:
        _close(service)
    return 0


def _close(service: Any) -> None:
    try:
        service.close("success").result(timeout=10)
    except Exception as e:  # the process ends anyway
        log.warning("closing the Tinker session: %s: %s", type(e).__name__, e)
