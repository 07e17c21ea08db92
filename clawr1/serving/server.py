"""`clawr1 serve`: the embedded engine behind SGLang's native HTTP API."""
from __future__ import annotations

import asyncio
import json
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from clawr1.engine_api.client import EMBEDDED_ENGINE
from clawr1.engine_api.ipc import IpcFormatError, open_payload
from clawr1.engine_api.nccl import local_nccl_version
from clawr1.engine_api.versions import parse_version
from clawr1.serving.adapters import AdapterError, read_peft_dir
from clawr1.serving.engine import Engine, GenerateRequest, RequestError, SamplingParams


MIN_TEMPERATURE, MAX_TEMPERATURE = 1e-3, 100.0  # logits / a smaller temperature overflow to inf


def error_response(message: str, status: int = 400) -> JSONResponse:
    return JSONResponse({"error": {"message": message}}, status_code=status)


async def read_json_body(request: Request) -> dict:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise RequestError("the body is not valid JSON") from None
    if not isinstance(body, dict):
        raise RequestError("the body must be a JSON object")
    return body


def _per_prompt(value: Any, n: int, name: str) -> list:
    """A value for every prompt: one list entry each, or one value shared by all."""
    if isinstance(value, list):
        if len(value) != n:
            raise RequestError(f"{name} must have one entry per prompt ({n}), got {len(value)}")
        return value
    return [value] * n


def parse_generate(body: dict, tokenizer: Any) -> tuple[list[GenerateRequest], bool]:
    """Expand a /generate body into engine requests; returns (requests, is_batch)."""
    if body.get("input_ids") is not None:
        prompts = body["input_ids"]
        if not isinstance(prompts, list) or not prompts:
            raise RequestError("input_ids cannot be empty.")
        batch = isinstance(prompts[0], list)
        prompts = prompts if batch else [prompts]
    elif body.get("text") is not None:
        texts = body["text"]
        batch = isinstance(texts, list)
        prompts = [tokenizer.encode(t, add_special_tokens=False) for t in (texts if batch else [texts])]
    else:
        raise RequestError("give either text or input_ids")
    n = len(prompts)
    params = [SamplingParams.from_dict(p) for p in _per_prompt(body.get("sampling_params") or {}, n, "sampling_params")]
    adapters = _per_prompt(body.get("lora_path"), n, "lora_path")
    if any(a is not None and not isinstance(a, str) for a in adapters):
        raise RequestError("lora_path must be an adapter name, or a list of one (or null) per prompt")
    rid = body.get("rid")
    input_temperature = body.get("input_logprob_temperature", 1.0)
    if (not isinstance(input_temperature, (int, float)) or isinstance(input_temperature, bool)
            or not MIN_TEMPERATURE <= input_temperature <= MAX_TEMPERATURE):
        raise RequestError(f"input_logprob_temperature must be a number in [{MIN_TEMPERATURE}, {MAX_TEMPERATURE}], "
                           f"got {input_temperature!r}")
    requests = []
    for ids, sp, adapter in zip(prompts, params, adapters):
        for _ in range(sp.n):
            kwargs = {}
            if rid is not None and not (batch or sp.n > 1):
                kwargs["rid"] = str(rid)
            requests.append(GenerateRequest(
                input_ids=list(ids), params=sp, return_logprob=bool(body.get("return_logprob") or False),
                logprob_start_len=int(body["logprob_start_len"]) if body.get("logprob_start_len") is not None else -1,
                top_logprobs_num=int(body.get("top_logprobs_num") or 0), input_logprob_temperature=float(input_temperature),
                stream=bool(body.get("stream")), lora_path=adapter, **kwargs))
    return requests, batch or any(p.n > 1 for p in params)


def create_app(engine: Engine) -> FastAPI:
    app = FastAPI(title="clawr1 embedded engine (SGLang native API subset)")
    nccl_version = local_nccl_version()

    @app.exception_handler(RequestError)
    async def _bad_request(_: Request, exc: RequestError) -> JSONResponse:
        return error_response(str(exc))

    @app.get("/health")
    @app.get("/health_generate")
    async def health() -> Response:
        return Response(status_code=200 if engine.alive else 503)

    @app.get("/get_model_info")
    @app.get("/model_info")
    async def model_info() -> dict:
        return {
            "model_path": engine.model_path, "tokenizer_path": engine.model_path, "is_generation": True,
            "weight_version": str(engine.weight_version), "model_type": engine.model.config.model_type,
            "architectures": engine.model.config.architectures, "served_model_name": engine.model_path,
            "input_logprob_temperature": True,  # clawr1 extension: prompt log-probs at a temperature
            "nccl_version": nccl_version,  # clawr1 extension: torch's NCCL (null without), for the trainer's check
        }

    @app.get("/server_info")
    @app.get("/get_server_info")
    async def server_info() -> dict:
        """What a weight publisher asks first (clawr1.engine_api.client.update_protocol): this is not SGLang,
        pause with retract (running requests are recomputed), no weight-update session needed."""
        return {"engine": EMBEDDED_ENGINE, "model_path": engine.model_path, "max_running_requests": engine.max_running,
                "context_length": engine.max_context, "max_total_num_tokens": engine.max_total_tokens,
                "weight_version": str(engine.weight_version)}

    @app.api_route("/generate", methods=["POST", "PUT"])
    async def generate(request: Request) -> Response:
        body = await read_json_body(request)
        reqs, is_batch = parse_generate(body, engine.tokenizer)
        queues = _submit_all(engine, reqs)
        if body.get("stream"):
            return StreamingResponse(_stream(engine, request, reqs, queues, is_batch), media_type="text/event-stream")
        try:
            results = await asyncio.gather(*(_final(q) for q in queues))
        except asyncio.CancelledError:  # the client went away: stop generating for it
            for r in reqs:
                engine.abort(r.rid)
            raise
        return JSONResponse(results if is_batch else results[0])

    @app.post("/update_weights_from_disk")
    async def update_weights_from_disk(request: Request) -> JSONResponse:
        """Loads between decode steps. `flush_cache` is accepted and needs no action: the engine keeps no KV
        across a weight change (running requests are retracted and recomputed, see clawr1/serving/engine.py)."""
        body = await read_json_body(request)
        if not body.get("model_path"):
            return JSONResponse({"success": False, "message": "model_path is required", "num_paused_requests": 0}, 400)
        try:
            version = _version(body.get("weight_version"))
            new = await asyncio.to_thread(engine.update_weights_from_disk, body["model_path"], version)
        except (RequestError, OSError) as e:
            return JSONResponse({"success": False, "message": str(e), "num_paused_requests": 0}, 400)
        return JSONResponse({"success": True, "message": f"Succeeded to update model weights. Weight version updated to {new}.",
                             "num_paused_requests": 0})

    @app.post("/update_weights_from_tensor")
    async def update_weights_from_tensor(request: Request) -> JSONResponse:
        """Tensors in the request itself, in one of two forms.

        JSON (SGLang's shape): `load_format: "safetensors"`, each entry of `serialized_named_tensors` base64 of
        a safetensors file (SGLang's own format is a pickle, which an HTTP endpoint must not unpickle).
        Raw (`Content-Type: application/octet-stream`, clawr1's push across nodes): the body is the safetensors
        file itself, streamed in chunks, and the version is the `weight_version` query parameter or the
        `X-Weight-Version` header; a third less to send than base64, and nothing to decode."""
        try:
            if request.headers.get("content-type", "").split(";")[0].strip() == OCTET_STREAM:
                state, version = await _raw_tensors(request)
            else:
                state, version = _json_tensors(await read_json_body(request))
            new = await asyncio.to_thread(engine.update_weights_from_tensors, state, version)
        except RequestError as e:
            return JSONResponse({"success": False, "message": str(e)}, 400)
        return JSONResponse({"success": True, "message": f"Succeeded to update model weights. Weight version updated to {new}."})

    @app.post("/update_weights_from_ipc")
    async def update_weights_from_ipc(request: Request) -> JSONResponse:
        """Tensors shared in place by a trainer on the same device (trainer.weight_sync=ipc), in clawr1's
        no-pickle format (clawr1/engine_api/ipc.py): every bucket opened, then loaded in one step boundary."""
        try:
            state, version = open_payload(await read_json_body(request))
            new = await asyncio.to_thread(engine.update_weights_from_tensors, state, version)
        except (RequestError, IpcFormatError) as e:
            return JSONResponse({"success": False, "message": str(e)}, 400)
        return JSONResponse({"success": True, "message": f"Succeeded to update model weights. Weight version updated to {new}."})

    @app.post("/load_lora_adapter")
    async def load_lora_adapter(request: Request) -> JSONResponse:
        """SGLang's: a PEFT directory on this machine (`lora_path`) under the name `lora_name`."""
        body = await read_json_body(request)
        path = body.get("lora_path")
        if not isinstance(path, str) or not path:
            return _lora_reply(engine, "lora_path (a PEFT adapter directory) is required")

        def load() -> None:
            engine.lora_bank()  # an engine without LoRA says so before anything is read
            config, tensors = read_peft_dir(path)
            engine.load_adapter(body.get("lora_name"), config, tensors, source=path)

        return await _lora_call(engine, load)

    @app.post("/load_lora_adapter_from_tensors")
    async def load_lora_adapter_from_tensors(request: Request) -> JSONResponse:
        """SGLang 0.5.23's shape: `lora_name`, `config_dict` (adapter_config.json) and `serialized_named_tensors`,
        one entry per TP rank, here base64 safetensors (`load_format: "safetensors"`; SGLang's own is a pickle,
        which an HTTP endpoint must not unpickle)."""
        body = await read_json_body(request)

        def load() -> None:
            engine.lora_bank()
            tensors, _ = _json_tensors(body)
            engine.load_adapter(body.get("lora_name"), body.get("config_dict"), tensors)

        return await _lora_call(engine, load)

    @app.post("/unload_lora_adapter")
    async def unload_lora_adapter(request: Request) -> JSONResponse:
        """Takes no new request for the adapter at once; answers once its in-flight requests are done."""
        body = await read_json_body(request)
        return await _lora_call(engine, lambda: engine.unload_adapter(str(body.get("lora_name"))))

    @app.post("/pause_generation")
    async def pause_generation(request: Request) -> JSONResponse:
        body = await read_json_body(request) if await request.body() else {}
        await asyncio.to_thread(engine.pause, body.get("mode") or "abort")
        return JSONResponse({"message": "Generation paused successfully.", "status": "ok"})

    @app.post("/continue_generation")
    async def continue_generation() -> JSONResponse:
        await asyncio.to_thread(engine.resume)
        return JSONResponse({"message": "Generation continued successfully.", "status": "ok"})

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        rows = [("requests_total", "counter", engine.requests_total), ("generated_tokens_total", "counter", engine.tokens_total),
                ("prompt_tokens_shared_total", "counter", engine.prompt_tokens_shared),
                ("decode_steps_total", "counter", engine.steps), ("running_requests", "gauge", engine.load["running"]),
                ("waiting_requests", "gauge", engine.load["waiting"]), ("weight_version", "gauge", engine.weight_version),
                ("paused", "gauge", int(engine.paused)), ("kv_pool_free_tokens", "gauge", engine.kv_pool_free_tokens)]
        return PlainTextResponse("".join(f"# TYPE clawr1_engine_{n} {t}\nclawr1_engine_{n} {v}\n" for n, t, v in rows))

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache() -> PlainTextResponse:
        """As SGLang: plain text, 200, or 400 while a request holds KV or waits on a running engine (SGLang's 400
        body is "Flush cache failed."; this one says what is pending)."""
        if await asyncio.to_thread(engine.flush_cache):
            return PlainTextResponse("Cache flushed.\nPlease check backend logs for more details. (When there are "
                                     "running or waiting requests, the operation will not be performed.)\n")
        load = engine.load
        return PlainTextResponse("Cache not flushed because there are pending requests. "
                                 f"#queue-req: {load['waiting']}, #running-req: {load['running']}\n", status_code=400)

    return app


def _version(value: Any) -> int | None:
    """An update's weight_version: None bumps the engine's own; else a count of publishes (or "default": 0)."""
    if value is None:
        return None
    try:
        return parse_version(value)
    except ValueError as e:
        raise RequestError(f"weight_version: {e}") from None


OCTET_STREAM = "application/octet-stream"


def _json_tensors(body: dict) -> tuple[dict, int | None]:
    if (body.get("load_format") or "safetensors") != "safetensors":
        raise RequestError(f"load_format {body.get('load_format')!r} is not supported; use 'safetensors'")
    entries = body.get("serialized_named_tensors")
    if not isinstance(entries, list) or not entries:
        raise RequestError("serialized_named_tensors must be a non-empty list")
    return _decode_tensors(entries[0]), _version(body.get("weight_version"))  # one entry per TP rank; we are one


async def _raw_tensors(request: Request) -> tuple[dict, int | None]:
    """The safetensors bytes of a raw push, read chunk by chunk into one buffer, and the version it names."""
    from safetensors.torch import load

    version = request.query_params.get("weight_version", request.headers.get("x-weight-version"))
    buffer = bytearray()
    async for chunk in request.stream():
        buffer += chunk
    if not buffer:
        raise RequestError("the body is empty: send the safetensors file as the body")
    try:
        return load(bytes(buffer)), _version(version)
    except RequestError:
        raise
    except Exception as e:  # not a safetensors file
        raise RequestError(f"the body is not a safetensors file: {type(e).__name__}") from None


def _decode_tensors(entry: Any) -> dict:
    import base64

    from safetensors.torch import load

    try:
        return load(base64.b64decode(entry))
    except Exception as e:  # not base64, or not a safetensors file
        raise RequestError(f"serialized_named_tensors entry is not base64 safetensors: {type(e).__name__}") from None


def _lora_reply(engine: Engine, error: str = "") -> JSONResponse:
    """SGLang's LoRAUpdateOutput: success, error_message, loaded_adapters (name -> where it came from)."""
    return JSONResponse({"success": not error, "error_message": error or None, "loaded_adapters": engine.loaded_adapters()},
                        status_code=400 if error else 200)


async def _lora_call(engine: Engine, fn) -> JSONResponse:
    try:
        await asyncio.to_thread(fn)
    except (RequestError, AdapterError, TimeoutError) as e:
        return _lora_reply(engine, str(e))
    return _lora_reply(engine)


def _submit_all(engine: Engine, reqs: list[GenerateRequest]) -> list[asyncio.Queue]:
    """Submit every request of a body, or none: one refused (e.g. an unknown adapter) aborts those before it."""
    queues = []
    try:
        for r in reqs:
            queues.append(_submit(engine, r))
    except RequestError:
        for r in reqs[: len(queues)]:
            engine.abort(r.rid)
        raise
    return queues


def _submit(engine: Engine, req: GenerateRequest) -> asyncio.Queue:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    engine.submit(req, lambda event: loop.call_soon_threadsafe(queue.put_nowait, event))
    return queue


async def _final(queue: asyncio.Queue) -> dict:
    while True:
        event = await queue.get()
        if event.pop("type") == "done":
            return event


async def _stream(engine: Engine, request: Request, reqs: list[GenerateRequest], queues: list[asyncio.Queue],
                  is_batch: bool) -> AsyncIterator[bytes]:
    """SGLang's default streaming: cumulative chunks, `data: {json}` each, then `data: [DONE]`."""
    pending = {asyncio.ensure_future(q.get()): i for i, q in enumerate(queues)}
    try:
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for fut in done:
                i = pending.pop(fut)
                event = fut.result()
                kind = event.pop("type")
                if is_batch:
                    event["index"] = i
                yield f"data: {json.dumps(event)}\n\n".encode()
                if kind != "done":
                    pending[asyncio.ensure_future(queues[i].get())] = i
        yield b"data: [DONE]\n\n"
    finally:
        for fut in pending:
            fut.cancel()
        for r in reqs:
            engine.abort(r.rid)  # a no-op for finished requests; stops work for a vanished client
