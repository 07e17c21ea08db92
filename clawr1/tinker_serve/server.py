"""`clawr1 tinker-serve`'s HTTP half: Tinker's wire protocol (SDK 0.38) in front of a `TinkerBackend`.

The unchanged Tinker SDK (`tinker.ServiceClient(base_url=..., api_key="tml-...")`) drives this app. What it
expects, in short:

- Every training or sampling call is a *future*: the submit endpoint answers `{"request_id": ...}` at once,
  and the client then polls `POST /api/v1/retrieve_future` until it gets the result. The client re-polls with
  no delay, so retrieve_future holds each poll (long-poll) until the work is done or `poll_timeout_s` passed
  (then `try_again`). A failed request's result is `{"error": message, "category": "User" | "Server"}`.
- Bodies are JSON, except two places that are protobuf (`tinker.proto.tinker_public_pb2`): the
  `/forward_backward` request (possibly zstd-compressed) and the *results* of forward_backward and asample.
- Training requests carry `seq_id`, 1, 2, 3, ... per model (model creation or load is 0), and must run in that
  order. The client sends the chunks of one large forward_backward concurrently, later chunks first, so a
  request can arrive before the one it follows; it waits here for its turn.

All training work runs on ONE worker thread (the trainer is single-threaded), sampling on a small pool. The
event loop only parses requests and keeps the books (which model is at which seq_id, which sampling session
samples which weights), so it never blocks on the backend.

The model's tokenizer files are served at `/hub` the way the Hugging Face Hub serves a repo's files, under the
served model's name, so the SDK's `get_tokenizer()` (both clients call `AutoTokenizer.from_pretrained(name)`)
loads them on any machine whose environment has `HF_ENDPOINT=<this server>/hub` (and, where the server wants
a key, `HF_TOKEN=<the key>`): no Hub, no path on the server's disk.

A session lives while its client heartbeats (the SDK sends one every 10 s). One silent for `session_ttl_s`
(its process died without `ServiceClient.close()`, as the cookbook's loops end) is finished as Tinker finishes
it: its training clients are released, so their slots train others, and its heartbeat is answered 410 (the
SDK's sign to stop). What it saved (states, sampler weights) stays loadable by path.
"""
from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import time
import uuid
from collections import OrderedDict
from concurrent.futures import Executor, ThreadPoolExecutor
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Iterator, Mapping, Optional, Union

import numpy as np
import zstandard
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from tinker.proto import tinker_public_pb2 as pb
from tinker.proto.response_conv import _tensor_data_from_proto

from clawr1.tinker_serve.backend import (
    Datum, ForwardBackwardResult, ModelInfo, SampleResult, TinkerBackend, TinkerRequestError,
)
from clawr1.tinker_serve.runs import NotListed, RunBook

log = logging.getLogger(__name__)

API = "/api/v1"
PROTO = "application/x-protobuf"
POLL_TIMEOUT_S = 20.0  # the client's retrieve_future HTTP timeout is 45 s
KEEP_DELIVERED = 1024  # results kept after delivery, for a client that re-polls after a lost answer
SAMPLE_WORKERS = 4
HUB = "/hub"  # HF_ENDPOINT for the SDK's get_tokenizer()
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.json", "merges.txt", "tokenizer.model", "chat_template.jinja", "config.json",
                   "generation_config.json")  # what AutoTokenizer asks for; never weights
SESSION_TTL_S = 45.0  # a session with no heartbeat for this long is finished (the SDK heartbeats every 10 s)
CLIENT_CONFIG: dict[str, Any] = {
    "pjwt_auth_enabled": False,  # True would make the client exchange its key for a JWT first
    "use_pyqwest_transport": True,  # pyqwest speaks HTTP/1.1 over plain http://, which uvicorn serves
    "proto_compress_fwdbwd": False,  # a zstd body is still accepted
    "sample_use_retrieve_futures": False,
}

Outcome = Union[dict, bytes]  # a future's result: JSON, or an encoded protobuf message
Work = Callable[[], Outcome]


# ---------------------------------------------------------------------------------------------------------------
# Request decoding and result encoding (pure functions)
# ---------------------------------------------------------------------------------------------------------------

@contextmanager
def _decoding(what: str) -> Iterator[None]:
    """A malformed request is the client's error: report it as a TinkerRequestError naming `what`."""
    try:
        yield
    except TinkerRequestError:
        raise
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise TinkerRequestError(f"malformed {what}: {type(e).__name__}: {e}") from e


@dataclass
class ForwardBackwardCall:
    """A decoded /forward_backward request."""

    model_id: str
    seq_id: int
    loss_fn: str
    loss_fn_config: dict[str, float]
    forward_only: bool
    data: list[Datum]


def parse_forward_backward(body: bytes, content_encoding: str = "") -> pb.ForwardBackwardRequest:
    """The protobuf message of a /forward_backward body, decompressed if the client sent it as zstd."""
    with _decoding("forward_backward request"):
        if "zstd" in content_encoding:
            body = zstandard.ZstdDecompressor().decompressobj().decompress(body)
        message = pb.ForwardBackwardRequest()
        message.ParseFromString(body)
        return message


def decode_forward_backward(message: pb.ForwardBackwardRequest) -> ForwardBackwardCall:
    """The call a parsed /forward_backward message asks for; refuses what the backend contract cannot carry."""
    data = []
    for i, datum in enumerate(message.data):
        with _decoding(f"datum {i}"):
            data.append(_decode_datum(datum))
    return ForwardBackwardCall(message.model_id, message.seq_id, message.loss_fn, _loss_fn_config(message),
                               message.forward_only, data)


def _loss_fn_config(message: pb.ForwardBackwardRequest) -> dict[str, float]:
    """`loss_fn_config_v2` (numbers or strings) supersedes the legacy numbers-only map that mirrors it."""
    config = dict(message.loss_fn_config)
    for key, value in message.loss_fn_config_v2.items():
        if value.WhichOneof("value") != "number":
            raise TinkerRequestError(f"loss_fn_config[{key!r}] must be a number")
        config[key] = value.number
    return config


def _decode_datum(datum: pb.Datum) -> Datum:
    tokens: list[int] = []
    for chunk in datum.model_input:
        kind = chunk.WhichOneof("chunk")
        if kind != "encoded_text":
            raise TinkerRequestError(f"model_input chunks of type {kind!r} are not supported (token chunks only)")
        tokens.extend(np.frombuffer(chunk.encoded_text.tokens, dtype="<i4").tolist())
    inputs = {}
    for name, tensor in datum.loss_fn_inputs.items():
        array = _tensor_data_from_proto(tensor).to_numpy()
        if array.shape != (len(tokens),):
            raise TinkerRequestError(f"loss_fn_inputs[{name!r}] has shape {list(array.shape)}; expected "
                                     f"[{len(tokens)}], one value per model_input token")
        inputs[name] = array
    return Datum(tokens=tokens, inputs=inputs)


def _batched_tensor(per_datum: list[np.ndarray]) -> pb.BatchedTensor:
    """Per-datum 1-D float32 arrays as one BatchedTensor: their bytes concatenated, with int64 *byte* offsets."""
    arrays = [np.ascontiguousarray(a, dtype=np.float32).ravel() for a in per_datum]
    offsets = np.concatenate([[0], np.cumsum([a.nbytes for a in arrays])]).astype(np.int64)
    return pb.BatchedTensor(data=b"".join(a.tobytes() for a in arrays), offsets=offsets.tobytes(),
                            dtype=pb.DTYPE_FLOAT32)


def encode_forward_backward_output(result: ForwardBackwardResult) -> bytes:
    """A ForwardBackwardOutput: one record with each datum's target-token `logprobs`, and the metrics.

    The client splits every metric key as `name:reduction` (e.g. `loss:sum`) and crashes on any other form,
    so a key without a reduction is refused here."""
    output = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord")
    record = output.loss_fn_outputs.add(type_tag="ArrayRecord", num_datums=len(result.logprobs))
    record.fields["logprobs"].CopyFrom(_batched_tensor(result.logprobs))
    for key, value in result.metrics.items():
        if key.count(":") != 1:
            raise ValueError(f"backend metric {key!r} is not named 'name:reduction'")
        output.metrics[key] = float(value)
    return output.SerializeToString()


def encode_sample_response(result: SampleResult) -> bytes:
    """A SampleResponse. Prompt log-probs are NaN where nothing was computed (the first token); the client
    reads NaN as None."""
    response = pb.SampleResponse()
    for sequence in result.sequences:
        if sequence.stop_reason not in ("stop", "length"):
            raise ValueError(f"backend stop_reason {sequence.stop_reason!r} is neither 'stop' nor 'length'")
        response.sequences.add(
            stop_reason=pb.STOP_REASON_STOP if sequence.stop_reason == "stop" else pb.STOP_REASON_LENGTH,
            tokens=np.asarray(sequence.tokens, dtype="<i4").tobytes(),
            logprobs=np.asarray(sequence.logprobs, dtype="<f4").tobytes())
    if result.prompt_logprobs is not None:
        response.prompt_logprobs = np.asarray(result.prompt_logprobs, dtype="<f4").tobytes()
    return response.SerializeToString()


def prompt_tokens(model_input: Mapping[str, Any]) -> list[int]:
    """The token ids of a JSON ModelInput (`{"chunks": [{"type": "encoded_text", "tokens": [...]}, ...]}`)."""
    tokens: list[int] = []
    for chunk in model_input["chunks"]:
        if chunk.get("type", "encoded_text") != "encoded_text":
            raise TinkerRequestError(f"prompt chunks of type {chunk.get('type')!r} are not supported (tokens only)")
        tokens.extend(int(t) for t in chunk["tokens"])
    return tokens


UNSUPPORTED_SAMPLE_OPTIONS = ("topk_prompt_logprobs", "topk_sample_logprobs", "prompt_alt_tokens_k",
                              "target_prompt_logprobs", "prompt_logprobs_last_n")


def decode_sample_request(body: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments of `TinkerBackend.sample`, all but `sampler`, from an /asample body."""
    with _decoding("sample request"):
        for option in UNSUPPORTED_SAMPLE_OPTIONS:
            if body.get(option):
                raise TinkerRequestError(f"sampling option {option} is not supported")
        params = body["sampling_params"]
        if params.get("max_tokens") is None:
            raise TinkerRequestError("sampling_params.max_tokens is required")
        if int(params["max_tokens"]) < 1:
            raise TinkerRequestError(f"sampling_params.max_tokens must be at least 1, got {params['max_tokens']}")
        if int(body.get("num_samples", 1)) < 1:
            raise TinkerRequestError(f"num_samples must be at least 1, got {body.get('num_samples')}")
        prompt = prompt_tokens(body["prompt"])
        if not prompt:
            raise TinkerRequestError("the prompt (model_input) has no tokens")
        stop = params.get("stop")
        return {
            "prompt": prompt, "num_samples": int(body.get("num_samples", 1)),
            "max_tokens": int(params["max_tokens"]), "temperature": float(params.get("temperature", 1.0)),
            "top_p": float(params.get("top_p", 1.0)), "top_k": int(params.get("top_k", -1)),
            "stop": [stop] if isinstance(stop, str) else stop, "seed": params.get("seed"),
            "prompt_logprobs": bool(body.get("prompt_logprobs")),
        }


# ---------------------------------------------------------------------------------------------------------------
# Futures
# ---------------------------------------------------------------------------------------------------------------

def run_work(work: Work, label: str) -> Outcome:
    """Run one request's work (on a worker thread); a failure becomes the error result the client raises."""
    try:
        return work()
    except TinkerRequestError as e:
        log.warning("%s refused: %s", label, e)
        return {"error": str(e), "category": "User"}
    except Exception as e:
        log.exception("%s failed", label)
        return {"error": f"internal error: {type(e).__name__}: {e}", "category": "Server"}


def _resolve(future: asyncio.Future, outcome: Outcome) -> None:
    if not future.done():
        future.set_result(outcome)


class Futures:
    """Request ids and their results. Created on the event loop, filled by worker threads, long-polled by
    retrieve_future. A delivered result is kept a while (`keep_delivered` of them) in case the answer was
    lost and the client polls again."""

    def __init__(self, keep_delivered: int = KEEP_DELIVERED) -> None:
        self._open: dict[str, asyncio.Future] = {}
        self._delivered: OrderedDict[str, asyncio.Future] = OrderedDict()
        self._keep_delivered = keep_delivered

    def create(self) -> str:
        request_id = f"req-{uuid.uuid4().hex}"
        self._open[request_id] = asyncio.get_running_loop().create_future()
        return request_id

    def start(self, request_id: str, executor: Executor, work: Work, label: str) -> None:
        """Run `work` on `executor`; its outcome becomes the result of `request_id`."""
        future, loop = self._open[request_id], asyncio.get_running_loop()

        def run() -> None:
            loop.call_soon_threadsafe(_resolve, future, run_work(work, label))

        executor.submit(run)

    def submit(self, executor: Executor, work: Work, label: str) -> str:
        request_id = self.create()
        self.start(request_id, executor, work, label)
        return request_id

    async def wait(self, request_id: str, timeout: float) -> Optional[Outcome]:
        """The result, waiting up to `timeout` seconds for it; None if it is not ready. KeyError: unknown id."""
        future = self._open.get(request_id) or self._delivered[request_id]
        await asyncio.wait([future], timeout=timeout)
        if not future.done():
            return None
        if self._open.pop(request_id, None) is not None:
            self._delivered[request_id] = future
            while len(self._delivered) > self._keep_delivered:
                self._delivered.popitem(last=False)
        return future.result()


# ---------------------------------------------------------------------------------------------------------------
# The service: the books the event loop keeps, and the work it hands to the worker threads
# ---------------------------------------------------------------------------------------------------------------

@dataclass
class TrainingModel:
    """One training client: what it was created with, and its requests' turn order."""

    session_id: str
    base_model: str
    rank: int
    next_seq: int = 0  # the next seq_id to hand to the training thread
    waiting: dict[int, tuple[str, Work, str]] = field(default_factory=dict)  # seq_id -> (request_id, work, label)
    request_ids: dict[int, str] = field(default_factory=dict)  # every seq_id seen (a resent request is the same)


@dataclass
class SamplingSession:
    sampler: str  # the backend's sampler reference; "" for the base model
    base_model: str
    model_path: Optional[str] = None


def _refuse(message: str) -> Outcome:
    raise TinkerRequestError(message)


def _required(body: Mapping[str, Any], name: str) -> Any:
    if body.get(name) is None:
        raise TinkerRequestError(f"the request needs {name!r}")
    return body[name]


class Sessions:
    """The live sessions and when each was last heard from; the ended ones are remembered, to say why."""

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self.seen: dict[str, float] = {}
        self.ended: set[str] = set()

    def start(self) -> str:
        session_id = f"sess-{uuid.uuid4().hex[:12]}"
        self.seen[session_id] = time.monotonic()
        return session_id

    def beat(self, session_id: str) -> bool:
        """Note that the session's client is alive; False: it is not a live session (ended, or never started)."""
        if session_id not in self.seen:
            return False
        self.seen[session_id] = time.monotonic()
        return True

    def end(self, session_id: str) -> None:
        self.seen.pop(session_id, None)
        self.ended.add(session_id)

    def lapsed(self) -> list[str]:
        """The sessions silent for longer than the TTL."""
        now = time.monotonic()
        return [s for s, t in self.seen.items() if now - t > self.ttl_s]


def model_id_for(session_id: str, model_seq_id: int) -> str:
    """The SDK derives this id on its own when it creates a training client from a checkpoint."""
    return f"{session_id}:train:{model_seq_id}"


class TinkerService:
    """The protocol's operations on a backend. Methods run on the event loop and return JSON-able answers; what
    touches the backend is queued as work: training on one thread (in each model's seq_id order), sampling on
    a pool."""

    def __init__(self, backend: TinkerBackend, sample_workers: int = SAMPLE_WORKERS,
                 session_ttl_s: float = SESSION_TTL_S) -> None:
        self.backend = backend
        self.info: ModelInfo = backend.info()
        self.futures = Futures()
        self.sessions = Sessions(session_ttl_s)
        self.book = RunBook()  # what the RestClient lists: training runs and their checkpoints
        self.models: dict[str, TrainingModel] = {}
        # Written by the training thread just before the future that names the session completes, so a client
        # never asks for a session that is not there yet (a dict assignment is atomic).
        self.sampling_sessions: dict[str, SamplingSession] = {}
        self.train_pool = ThreadPoolExecutor(1, thread_name_prefix="tinker-train")
        self.sample_pool = ThreadPoolExecutor(sample_workers, thread_name_prefix="tinker-sample")

    def shutdown(self) -> None:
        """Drop the queued work and wait for the running calls, so that the backend can be closed after."""
        for pool in (self.train_pool, self.sample_pool):
            pool.shutdown(wait=True, cancel_futures=True)

    # ---- training ----

    def _model(self, model_id: str) -> TrainingModel:
        model = self.models.get(model_id)
        if model is None:
            session_id = model_id.split(":")[0]
            if session_id in self.sessions.ended:
                raise TinkerRequestError(f"model_id {model_id!r}: its session {session_id} has ended (closed, or no "
                                         f"heartbeat for {self.sessions.ttl_s:g} s); create a new training client, "
                                         f"from a saved state if it has one")
            raise TinkerRequestError(f"unknown model_id {model_id!r}")
        return model

    def _submit_training(self, model_id: str, seq_id: int, work: Work, label: str) -> dict:
        """Queue a training request; it runs once every request of its model with a lower seq_id has started."""
        model = self._model(model_id)
        self.book.touched(model_id)
        if seq_id in model.request_ids:  # the client resent a request whose answer it lost
            return {"request_id": model.request_ids[seq_id], "model_id": model_id}
        request_id = self.futures.create()
        model.request_ids[seq_id] = request_id
        model.waiting[seq_id] = (request_id, work, f"{label} {model_id} seq {seq_id}")
        if seq_id > model.next_seq:
            log.debug("%s seq %d waits for seq %d", model_id, seq_id, model.next_seq)
        while model.next_seq in model.waiting:  # the one thread runs them in the order they are handed over
            queued_id, queued_work, queued_label = model.waiting.pop(model.next_seq)
            self.futures.start(queued_id, self.train_pool, queued_work, queued_label)
            model.next_seq += 1
        return {"request_id": request_id, "model_id": model_id}

    def _submit_training_request(self, body: Mapping[str, Any], work: Work, label: str) -> dict:
        """A request on an existing model. Only model_id and seq_id are read here: any other fault of the
        request must become its result, in its turn, or the model's later requests would wait for it forever."""
        return self._submit_training(_required(body, "model_id"), int(_required(body, "seq_id")), work, label)

    def skip_turn(self, body: Any, message: str) -> None:
        """An unsupported request on a model still takes its turn, as a failure: the client gave it a seq_id,
        and the model's later requests would otherwise wait for it forever."""
        if isinstance(body, dict) and body.get("model_id") in self.models and isinstance(body.get("seq_id"), int):
            self._submit_training(body["model_id"], body["seq_id"], partial(_refuse, message), "unsupported request")

    # ---- sessions ----

    def create_session(self) -> dict:
        session_id = self.sessions.start()
        log.info("session %s started", session_id)
        return {"type": "create_session", "session_id": session_id}

    def heartbeat(self, body: Mapping[str, Any]) -> Optional[dict]:
        """The session's client is alive; None: the session has ended (answered 410, which stops the SDK's beat)."""
        return {"type": "session_heartbeat"} if self.sessions.beat(_required(body, "session_id")) else None

    def finish_session(self, session_id: str, why: str = "closed by its client") -> None:
        """Release the session's training clients once the work already handed to the training thread is done."""
        self.sessions.end(session_id)
        for model_id in [m for m, model in self.models.items() if model.session_id == session_id]:
            del self.models[model_id]
            self.train_pool.submit(run_work, partial(self.backend.release_model, model_id), f"release {model_id}")
        log.info("session %s finished: %s", session_id, why)

    def expire_sessions(self) -> None:
        """Finish every session silent for longer than the TTL."""
        for session_id in self.sessions.lapsed():
            self.finish_session(session_id, f"no heartbeat for {self.sessions.ttl_s:g} s; its training slots are free")

    def _new_model(self, session_id: str, model_seq_id: int, base_model: str, rank: int) -> str:
        model_id = model_id_for(session_id, model_seq_id)
        self.models.setdefault(model_id, TrainingModel(session_id, base_model, rank))
        self.book.opened(model_id, base_model, rank)
        return model_id

    def create_model(self, body: Mapping[str, Any]) -> dict:
        session_id, model_seq_id = _required(body, "session_id"), int(_required(body, "model_seq_id"))
        self.sessions.beat(session_id)
        lora_config = _required(body, "lora_config")
        base_model, rank = _required(body, "base_model"), int(_required(lora_config, "rank"))
        seed = lora_config.get("seed")
        model_id = self._new_model(session_id, model_seq_id, base_model, rank)
        optimizer = (body.get("optimizer_config") or {}).get("type", "adamw")

        def work() -> dict:
            if optimizer != "adamw":
                raise TinkerRequestError(f"optimizer {optimizer!r} is not supported (adamw only)")
            self.backend.create_model(model_id, base_model, rank, None if seed is None else int(seed))
            log.info("created %s (%s, LoRA rank %d)", model_id, base_model, rank)
            return {"type": "create_model", "model_id": model_id}

        return self._submit_training(model_id, 0, work, "create_model")

    def get_info(self, body: Mapping[str, Any]) -> dict:
        model_id = _required(body, "model_id")
        info, model = self.info, self._model(model_id)
        return {"type": "get_info", "model_id": model_id, "is_lora": True, "lora_rank": model.rank,
                "model_name": info.model_name,
                # the SDK's get_tokenizer() loads it as a Hub repo: from this server's /hub with HF_ENDPOINT set
                "model_data": {"arch": info.arch, "model_name": info.model_name, "tokenizer_id": info.model_name}}

    def forward_backward(self, body: bytes, content_encoding: str) -> dict:
        message = parse_forward_backward(body, content_encoding)

        def work() -> bytes:
            call = decode_forward_backward(message)
            result = self.backend.forward_backward(call.model_id, call.data, call.loss_fn, call.loss_fn_config,
                                                   call.forward_only)
            if len(result.logprobs) != len(call.data):
                raise ValueError(f"backend returned logprobs for {len(result.logprobs)} of {len(call.data)} datums")
            return encode_forward_backward_output(result)

        label = "forward" if message.forward_only else "forward_backward"
        return self._submit_training(message.model_id, message.seq_id, work, label)

    def optim_step(self, body: Mapping[str, Any]) -> dict:
        def work() -> dict:
            params = adam_params(body)
            return {"metrics": self.backend.optim_step(body["model_id"], **params)}

        return self._submit_training_request(body, work, "optim_step")

    def save_weights(self, body: Mapping[str, Any]) -> dict:
        def work() -> dict:
            path = self.backend.save_state(body["model_id"], _required(body, "path"),
                                           bool(body.get("overwrite", False)))
            self.book.saved(body["model_id"], path)
            return {"type": "save_weights", "path": path}

        return self._submit_training_request(body, work, "save_weights")

    def load_weights(self, body: Mapping[str, Any]) -> dict:
        """In place (TrainingClient.load_state: model_id, seq_id), or as a new training client
        (ServiceClient.create_training_client_from_state: session_id, model_seq_id; the load is its seq 0)."""
        if body.get("model_id") is not None:
            return self._submit_training_request(body, lambda: self._load(body, body["model_id"]), "load_weights")
        # The checkpoint's rank is not in the request: a new client gets the rank this server trains.
        model_id = self._new_model(_required(body, "session_id"), int(_required(body, "model_seq_id")),
                                   body.get("base_model") or self.info.model_name, self.info.lora_rank)

        def work() -> dict:
            model = self.models[model_id]
            self.backend.create_model(model_id, model.base_model, model.rank, None)  # the state's weights follow
            return self._load(body, model_id)

        return self._submit_training(model_id, 0, work, "load_weights")

    def _load(self, body: Mapping[str, Any], model_id: str) -> dict:
        path = _required(body, "path")
        self.backend.load_state(model_id, path, bool(body.get("optimizer", False)))
        return {"type": "load_weights", "path": path, "model_id": model_id}

    def save_weights_for_sampler(self, body: Mapping[str, Any]) -> dict:
        """With `path` (TrainingClient.save_weights_for_sampler(name)): answers the saved weights' path. With
        `sampling_session_seq_id` (save_weights_and_get_sampling_client): answers a new sampling session."""
        def work() -> dict:
            model_id, name = body["model_id"], body.get("path")
            if name is None and body.get("sampling_session_seq_id") is None:
                raise TinkerRequestError("save_weights_for_sampler needs path or sampling_session_seq_id")
            sampler = self.backend.save_for_sampler(model_id, name)
            self.book.saved(model_id, sampler)
            if name is not None:
                return {"type": "save_weights_for_sampler", "path": sampler}
            model = self.models[model_id]
            session_id = f"{model.session_id}:sample:{int(body['sampling_session_seq_id'])}"
            self.sampling_sessions[session_id] = SamplingSession(sampler, model.base_model)
            return {"type": "save_weights_for_sampler", "sampling_session_id": session_id}

        return self._submit_training_request(body, work, "save_weights_for_sampler")

    # ---- sampling ----

    def _check_base_model(self, base_model: str) -> None:
        if base_model != self.info.model_name:
            raise TinkerRequestError(f"this server samples {self.info.model_name!r} only, not {base_model!r}")

    def create_sampling_session(self, body: Mapping[str, Any]) -> dict:
        self.sessions.beat(_required(body, "session_id"))
        session_id = f"{_required(body, 'session_id')}:sample:{int(_required(body, 'sampling_session_seq_id'))}"
        model_path = body.get("model_path")
        if model_path:
            self.backend.check_sampler(model_path)  # a bad path is refused now, not at the first sample
            session = SamplingSession(model_path, self.info.model_name, model_path)
        else:
            self._check_base_model(_required(body, "base_model"))
            session = SamplingSession("", self.info.model_name)
        self.sampling_sessions[session_id] = session
        return {"type": "create_sampling_session", "sampling_session_id": session_id}

    def get_sampler(self, session_id: str) -> dict:
        session = self.sampling_sessions.get(session_id)
        if session is None:
            raise TinkerRequestError(f"unknown sampler {session_id!r}")
        return {"sampler_id": session_id, "base_model": session.base_model, "model_path": session.model_path}

    def _sampler_of(self, body: Mapping[str, Any]) -> str:
        """The backend's sampler reference for an /asample request (by session, by path, or the base model)."""
        if body.get("sampling_session_id"):
            session = self.sampling_sessions.get(body["sampling_session_id"])
            if session is None:
                raise TinkerRequestError(f"unknown sampling_session_id {body['sampling_session_id']!r}")
            return session.sampler
        if body.get("model_path"):
            return body["model_path"]
        self._check_base_model(_required(body, "base_model"))
        return ""

    def asample(self, body: Mapping[str, Any]) -> dict:
        num_samples = int(body.get("num_samples", 1))

        def work() -> bytes:
            call = decode_sample_request(body)
            context = self.info.max_context
            if context and len(call["prompt"]) + call["max_tokens"] > context:
                raise TinkerRequestError(f"the prompt ({len(call['prompt'])} tokens) and max_tokens "
                                         f"({call['max_tokens']}) exceed the model's context of {context} tokens")
            result = self.backend.sample(self._sampler_of(body), **call)
            if len(result.sequences) != num_samples:
                raise ValueError(f"backend returned {len(result.sequences)} of {num_samples} samples")
            return encode_sample_response(result)

        request_id = self.futures.submit(self.sample_pool, work, f"sample {body.get('sampling_session_id', '')}")
        # The client requires one id per sample (it becomes each SampledSequence.sequence_id).
        return {"request_id": request_id, "sample_sequence_ids": [f"{request_id}:{i}" for i in range(num_samples)]}

    # ---- futures ----

    async def retrieve_future(self, body: Mapping[str, Any], timeout: float) -> Response:
        request_id = _required(body, "request_id")
        try:
            outcome = await self.futures.wait(request_id, timeout)
        except KeyError:
            outcome = {"error": f"unknown request_id {request_id!r} (was the server restarted?)", "category": "User"}
        if outcome is None:
            return JSONResponse({"type": "try_again", "request_id": request_id, "queue_state": "active"})
        if isinstance(outcome, bytes):
            return Response(outcome, media_type=PROTO)
        return JSONResponse(outcome)


ADAM_DEFAULTS = {"learning_rate": 1e-4, "beta1": 0.9, "beta2": 0.95, "eps": 1e-12, "weight_decay": 0.0,
                 "grad_clip_norm": 0.0}  # tinker.types.AdamParams'


def adam_params(body: Mapping[str, Any]) -> dict[str, float]:
    """optim_step's AdamW hyperparameters (the SDK sends `adam_params`; other optimizers send `optimizer_params`)."""
    adam = body.get("adam_params")
    if adam is None:
        optimizer = (body.get("optimizer_params") or {}).get("type")
        raise TinkerRequestError(f"optimizer {optimizer!r} is not supported (AdamW only: give adam_params)")
    with _decoding("adam_params"):
        return {name: float(adam.get(name, default)) for name, default in ADAM_DEFAULTS.items()}


# ---------------------------------------------------------------------------------------------------------------
# The app
# ---------------------------------------------------------------------------------------------------------------

async def _json_object(request: Request) -> dict:
    try:
        body = await request.json()
    except ValueError:
        raise TinkerRequestError("the body is not valid JSON") from None
    if not isinstance(body, dict):
        raise TinkerRequestError("the body must be a JSON object")
    return body


def _tokenizer_file(info: ModelInfo, repo_id: str, filename: str) -> Optional[bytes]:
    """The bytes of one of TOKENIZER_FILES of the served model (None: another repo, file, or none there)."""
    path = Path(info.tokenizer_dir) / filename
    if repo_id != info.model_name or filename not in TOKENIZER_FILES or not path.is_file():
        return None
    return path.read_bytes()


def _key_matches(request: Request, api_key: str) -> bool:
    """The SDK sends the key as X-API-Key; huggingface_hub (the tokenizer's files) sends HF_TOKEN as a bearer."""
    sent = request.headers.get("x-api-key") or request.headers.get("authorization", "").removeprefix("Bearer ")
    return hmac.compare_digest(sent.encode(), api_key.encode())


def create_app(backend: TinkerBackend, api_key: Optional[str], *, client_config: Optional[Mapping[str, Any]] = None,
               poll_timeout_s: float = POLL_TIMEOUT_S, sample_workers: int = SAMPLE_WORKERS,
               session_ttl_s: float = SESSION_TTL_S) -> FastAPI:
    """The Tinker API on `backend`. With `api_key`, every request must carry it as `X-API-Key` (the SDK sends its
    `api_key` there; it must start with "tml-"). `client_config` overrides what /client/config tells the SDK
    (e.g. `fwdbwd_max_chunk_len`). A session with no heartbeat for `session_ttl_s` is finished."""
    service = TinkerService(backend, sample_workers, session_ttl_s)
    config = {**CLIENT_CONFIG, **(client_config or {})}

    async def expire_sessions() -> None:
        while True:
            await asyncio.sleep(min(5.0, session_ttl_s / 4))
            service.expire_sessions()

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        reaper = asyncio.create_task(expire_sessions())
        yield
        reaper.cancel()
        await asyncio.to_thread(service.shutdown)

    app = FastAPI(title="clawr1 tinker-serve (Tinker API)", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)

    @app.middleware("http")
    async def require_api_key(request: Request, call_next: Callable) -> Response:
        if api_key and not _key_matches(request, api_key):
            return JSONResponse({"error": "missing or wrong X-API-Key header (or, for /hub, HF_TOKEN)"},
                                status_code=401)
        return await call_next(request)

    @app.exception_handler(TinkerRequestError)
    async def refused(_: Request, exc: TinkerRequestError) -> JSONResponse:
        return JSONResponse({"error": str(exc)}, status_code=400)

    def json_post(name: str, operation: Callable[[dict], Any]) -> None:
        """POST /api/v1/<name>: a JSON body in, `operation`'s answer out; a malformed body is answered 400."""
        async def endpoint(request: Request) -> Any:
            body = await _json_object(request)
            with _decoding(f"{name} request"):
                return operation(body)

        app.post(f"{API}/{name}", name=name)(endpoint)

    json_post("client/config", lambda _: config)
    json_post("client/dynamic_config", lambda _: {"refresh_interval_sec": 300, "sample_cancel_enabled": False})
    json_post("create_session", lambda _: service.create_session())
    json_post("telemetry", lambda _: {"status": "accepted"})
    json_post("create_model", service.create_model)
    json_post("get_info", service.get_info)
    json_post("optim_step", service.optim_step)
    json_post("save_weights", service.save_weights)
    json_post("load_weights", service.load_weights)
    json_post("save_weights_for_sampler", service.save_weights_for_sampler)
    json_post("create_sampling_session", service.create_sampling_session)
    json_post("asample", service.asample)

    @app.post(f"{API}/session_heartbeat")
    async def session_heartbeat(request: Request) -> Any:
        body = await _json_object(request)
        with _decoding("session_heartbeat request"):
            alive = service.heartbeat(body)
        if alive is None:
            return JSONResponse({"error": f"session {body['session_id']} has ended"}, status_code=410)
        return alive

    @app.post(f"{API}/forward_backward")
    async def forward_backward(request: Request) -> dict:
        """The one protobuf request body (ForwardBackwardRequest), zstd-compressed if the client chose to."""
        return service.forward_backward(await request.body(), request.headers.get("content-encoding", ""))

    @app.post(f"{API}/retrieve_future")
    async def retrieve_future(request: Request) -> Response:
        return await service.retrieve_future(await _json_object(request), poll_timeout_s)

    @app.get(API + "/samplers/{session_id:path}")
    async def get_sampler(session_id: str) -> dict:
        return service.get_sampler(session_id)

    @app.post(API + "/sessions/{session_id}/finish")
    async def finish_session(session_id: str) -> None:
        service.finish_session(session_id)

    @app.exception_handler(NotListed)
    async def not_listed(_: Request, exc: NotListed) -> JSONResponse:
        return JSONResponse({"error": str(exc)}, status_code=404)

    @app.get(f"{API}/training_runs")
    async def training_runs(offset: int = 0, limit: int = 20) -> Any:
        return service.book.runs(offset, limit)

    @app.get(API + "/training_runs/{run_id}")
    async def training_run(run_id: str) -> Any:
        return service.book.run(run_id)

    @app.get(API + "/training_runs/{run_id}/checkpoints")
    async def checkpoints(run_id: str) -> Any:
        return service.book.checkpoints(run_id)

    @app.delete(API + "/training_runs/{run_id}/checkpoints/{checkpoint_id:path}")
    async def delete_checkpoint(run_id: str, checkpoint_id: str) -> Response:
        await asyncio.to_thread(backend.delete_checkpoint, service.book.removed(run_id, checkpoint_id))
        return Response(status_code=204)

    @app.api_route(HUB + "/{repo_id:path}/resolve/{revision}/{filename}", methods=["GET", "HEAD"])
    async def tokenizer_file(repo_id: str, filename: str, request: Request) -> Response:
        """A tokenizer file of the served model, with the headers huggingface_hub's download expects."""
        body = _tokenizer_file(service.info, repo_id, filename)
        if body is None:
            return JSONResponse({"error": f"{repo_id}/{filename}: no such tokenizer file here"}, status_code=404,
                                headers={"X-Error-Code": "EntryNotFound"})
        headers = {"X-Repo-Commit": "0" * 40, "ETag": f'"{hashlib.sha256(body).hexdigest()}"',
                   "Content-Length": str(len(body))}
        return Response(b"" if request.method == "HEAD" else body, headers=headers)

    @app.get(f"{API}/healthz")
    async def healthz() -> dict:
        return {"status": "ok"}

    @app.api_route(API + "/{path:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
    async def unsupported(request: Request) -> JSONResponse:
        """Registered last: any other endpoint of the Tinker API."""
        message = f"clawr1 tinker-serve does not support {request.method} {request.url.path}"
        try:
            service.skip_turn(await request.json(), message)
        except ValueError:  # no JSON body: not a training request
            pass
        return JSONResponse({"error": message}, status_code=404)

    return app

