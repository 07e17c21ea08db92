"""clawr1/tinker_serve/server.py driven by the real, unchanged Tinker SDK over loopback HTTP.

`RecordingBackend` is a test double that stands in for the trainer only to test the wire layer: it implements
the TinkerBackend contract deterministically (log-prob of target token i is -0.1 * (i + 1); the loss is the
documented formula, clawr1.algo.tinker_serve_losses; sampling returns fixed tokens) and records what it was asked.
"""
from __future__ import annotations

import logging
import math
import socket
import threading
import time
from contextlib import ExitStack, contextmanager
from typing import Iterator, Optional

import httpx
import numpy as np
import pytest
import torch
import uvicorn

tinker = pytest.importorskip("tinker", reason="needs the Tinker SDK (the `tinker` extra: scripts/setup.sh installs it)")
from tinker import types  # noqa: E402
from tinker.proto.request_conv import forward_backward_request_to_proto  # noqa: E402

from clawr1.algo.tinker_serve_losses import LossInputError, tinker_loss  # noqa: E402
from clawr1.tinker_serve.backend import (  # noqa: E402
    Datum, ForwardBackwardResult, ModelInfo, SampledSequence, SampleResult, TinkerRequestError,
)
from clawr1.tinker_serve.server import create_app  # noqa: E402

API_KEY = "tml-test-9f3c2a71e5"
BASE_MODEL = "test/base-model"
POLL_TIMEOUT_S = 1.0
MAX_CONTEXT = 64


def target_logprobs(n: int) -> np.ndarray:
    return (-0.1 * np.arange(1, n + 1)).astype(np.float32)


class RecordingBackend:
    """The TinkerBackend contract, deterministic, with every call recorded in `calls`."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.seeds: dict[str, Optional[int]] = {}

    def info(self) -> ModelInfo:
        return ModelInfo(model_name=BASE_MODEL, tokenizer_dir="test-tokenizer-dir", lora_rank=8, arch="test",
                         max_context=MAX_CONTEXT)

    def create_model(self, model_id: str, base_model: str, rank: int, seed: Optional[int]) -> None:
        if base_model != BASE_MODEL:
            raise TinkerRequestError(f"cannot train {base_model}")
        self.calls.append(("create_model", model_id, rank))
        self.seeds[model_id] = seed

    def forward_backward(self, model_id: str, data: list[Datum], loss_fn: str, loss_fn_config: dict[str, float],
                         forward_only: bool) -> ForwardBackwardResult:
        self.calls.append(("forward_backward", model_id, [d.tokens for d in data], loss_fn, forward_only))
        logprobs = [target_logprobs(len(d.tokens)) for d in data]
        try:
            loss = sum(tinker_loss(loss_fn, torch.from_numpy(lp), {k: torch.from_numpy(v) for k, v in d.inputs.items()},
                                   loss_fn_config).item() for lp, d in zip(logprobs, data))
        except LossInputError as e:
            raise TinkerRequestError(str(e)) from e
        return ForwardBackwardResult(logprobs=logprobs, metrics={"loss:sum": loss})

    def release_model(self, model_id: str) -> None:
        self.calls.append(("release_model", model_id))

    def optim_step(self, model_id: str, learning_rate: float, beta1: float, beta2: float, eps: float,
                   weight_decay: float, grad_clip_norm: float) -> dict[str, float]:
        self.calls.append(("optim_step", model_id, learning_rate, beta1, beta2, eps, weight_decay, grad_clip_norm))
        return {"grad_norm:mean": 0.5}

    def save_state(self, model_id: str, name: str, overwrite: bool) -> str:
        if name == "boom":
            raise RuntimeError("disk full")
        if ("save_state", model_id, name) in self.calls and not overwrite:
            raise TinkerRequestError(f"a state named {name!r} is saved already")
        self.calls.append(("save_state", model_id, name))
        return f"tinker://{model_id.replace(':', '_')}/weights/{name}"

    def load_state(self, model_id: str, path: str, with_optimizer: bool) -> None:
        self.calls.append(("load_state", model_id, path, with_optimizer))

    def delete_checkpoint(self, path: str) -> None:
        self.calls.append(("delete_checkpoint", path))

    def check_sampler(self, path: str) -> None:
        if "/sampler_weights/" not in path:
            raise TinkerRequestError(f"no sampler weights at {path!r}")

    def save_for_sampler(self, model_id: str, name: Optional[str]) -> str:
        self.calls.append(("save_for_sampler", model_id, name))
        return f"tinker://{model_id.replace(':', '_')}/sampler_weights/{name or 'latest'}"

    def sample(self, sampler: str, prompt: list[int], num_samples: int, max_tokens: int, temperature: float,
               top_p: float, top_k: int, stop: Optional[list], seed: Optional[int],
               prompt_logprobs: bool) -> SampleResult:
        self.calls.append(("sample", sampler, prompt, num_samples, max_tokens, temperature, stop, seed))
        sequences = [SampledSequence(tokens=[100 + i + j for j in range(max_tokens)], logprobs=[-0.5] * max_tokens,
                                     stop_reason="length") for i in range(num_samples)]
        scored = [math.nan] + [-0.25 * i for i in range(1, len(prompt))] if prompt_logprobs else None
        return SampleResult(sequences=sequences, prompt_logprobs=scored)

    def close(self) -> None:
        pass

    def called(self, method: str) -> list[tuple]:
        return [c for c in self.calls if c[0] == method]


@contextmanager
def serving(app) -> Iterator[str]:
    """`app` on a free loopback port, in a thread; yields its base URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    # log_config=None: uvicorn's loggers (access log included) propagate to pytest's capture
    server = uvicorn.Server(uvicorn.Config(app, log_config=None, log_level="info", timeout_graceful_shutdown=1))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.started, "the test server did not start"
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


@pytest.fixture
def backend() -> RecordingBackend:
    return RecordingBackend()


@pytest.fixture
def start(backend, monkeypatch):
    """`start(**create_app_options)` -> (base_url, `client(api_key=API_KEY)` making SDK clients of that server)."""
    monkeypatch.setenv("TINKER_TELEMETRY", "0")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    with ExitStack() as stack:
        def client(url: str, api_key: str = API_KEY) -> tinker.ServiceClient:
            service_client = tinker.ServiceClient(base_url=url, api_key=api_key)
            stack.callback(lambda: service_client.close("success").result(timeout=10))
            return service_client

        def start_server(**options) -> tuple[str, callable]:
            url = stack.enter_context(serving(create_app(backend, API_KEY, poll_timeout_s=POLL_TIMEOUT_S, **options)))
            return url, lambda api_key=API_KEY: client(url, api_key)

        yield start_server


def datum(tokens: list[int], **inputs) -> types.Datum:
    return types.Datum(model_input=types.ModelInput.from_ints(tokens), loss_fn_inputs=inputs)


def logprobs_of(output: types.ForwardBackwardOutput) -> list[list[float]]:
    return [list(o["logprobs"].data) for o in output.loss_fn_outputs]


def test_training_client_cross_entropy_and_optim_step(start, backend, caplog):
    caplog.set_level(logging.DEBUG)
    _, client = start()
    training = client().create_lora_training_client(base_model=BASE_MODEL, rank=8).result()
    info = training.get_info()
    assert (info.model_data.model_name, info.model_data.tokenizer_id, info.lora_rank) == (
        BASE_MODEL, BASE_MODEL, 8)  # the tokenizer is the served model's, from this server's /hub
    assert backend.called("create_model") == [("create_model", training.model_id, 8)]

    data = [datum([1, 2, 3], target_tokens=[2, 3, 4], weights=[0.0, 1.0, 1.0]),
            datum([5, 6], target_tokens=[6, 7], weights=[1.0, 1.0])]
    fb = training.forward_backward(data, "cross_entropy")
    optim = training.optim_step(types.AdamParams(learning_rate=1e-3, grad_clip_norm=1.0))
    output = fb.result()
    assert np.allclose(logprobs_of(output)[0], target_logprobs(3)) and np.allclose(logprobs_of(output)[1],
                                                                                  target_logprobs(2))
    assert output.metrics["loss:sum"] == pytest.approx((0.2 + 0.3) + (0.1 + 0.2), rel=1e-6)
    assert optim.result().metrics == {"grad_norm:mean": 0.5}
    assert backend.calls[1:] == [
        ("forward_backward", training.model_id, [[1, 2, 3], [5, 6]], "cross_entropy", False),
        ("optim_step", training.model_id, 1e-3, 0.9, 0.95, 1e-12, 0.0, 1.0)]
    assert {"clawr1.tinker_serve.server", "uvicorn.access"} <= {r.name for r in caplog.records}
    assert API_KEY not in caplog.text


def test_ppo_loss_with_config(start):
    _, client = start()
    training = client().create_lora_training_client(base_model=BASE_MODEL, rank=8).result()
    sampler_logprobs = [[-0.3, -0.1, -0.2], [-0.5, -0.05, -0.4]]
    advantages = [[0.0, 1.0, -1.0], [2.0, 1.0, -0.5]]
    data = [datum([1, 2, 3], target_tokens=[2, 3, 4], logprobs=q, advantages=a)
            for q, a in zip(sampler_logprobs, advantages)]
    output = training.forward_backward(data, "ppo", {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}).result()

    ratio = np.exp(target_logprobs(3)[None, :] - np.array(sampler_logprobs))
    a = np.array(advantages)
    expected = -np.minimum(ratio * a, np.clip(ratio, 0.9, 1.1) * a).sum()
    assert output.metrics["loss:sum"] == pytest.approx(expected, rel=1e-5)
    assert [len(lp) for lp in logprobs_of(output)] == [3, 3]


def test_chunked_forward_backward_reaches_the_backend_in_seq_order(start, backend):
    """One datum per request (the client sends the later chunks first), zstd-compressed."""
    _, client = start(client_config={"fwdbwd_max_chunk_len": 1, "proto_compress_fwdbwd": True})
    training = client().create_lora_training_client(base_model=BASE_MODEL, rank=8).result()
    data = [datum([10 * k, 10 * k + 1], target_tokens=[10 * k + 1, 10 * k + 2], weights=[1.0, 1.0]) for k in (1, 2, 3)]
    output = training.forward_backward(data, "cross_entropy").result()
    assert [c[2] for c in backend.called("forward_backward")] == [[[10, 11]], [[20, 21]], [[30, 31]]]
    assert len(output.loss_fn_outputs) == 3 and output.metrics["loss:sum"] == pytest.approx(3 * 0.3, rel=1e-6)


def test_a_request_that_arrives_early_waits_for_its_turn(start, backend):
    url, client = start()
    training = client().create_lora_training_client(base_model=BASE_MODEL, rank=8).result()
    headers = {"X-API-Key": API_KEY, "Content-Type": "application/x-protobuf"}

    def post_forward(seq_id: int, tokens: list[int]) -> str:
        request = types.ForwardBackwardRequest(
            forward_backward_input=types.ForwardBackwardInput(
                data=[datum(tokens, target_tokens=tokens, weights=[1.0] * len(tokens))], loss_fn="cross_entropy"),
            model_id=training.model_id, seq_id=seq_id)
        body = forward_backward_request_to_proto(request).SerializeToString()
        return httpx.post(f"{url}/api/v1/forward_backward", content=body, headers=headers).json()["request_id"]

    def retrieve(request_id: str) -> httpx.Response:
        return httpx.post(f"{url}/api/v1/retrieve_future", json={"request_id": request_id},
                          headers={"X-API-Key": API_KEY}, timeout=10)

    second = post_forward(2, [2])
    assert retrieve(second).json()["type"] == "try_again" and not backend.called("forward_backward")
    first = post_forward(1, [1])
    assert all(retrieve(r).headers["content-type"] == "application/x-protobuf" for r in (second, first))
    assert [c[2] for c in backend.called("forward_backward")] == [[[1]], [[2]]]


def a_sampler(start) -> tuple:
    """(service client, a training client, a sampling client of its weights, a 3-token prompt)."""
    _, client = start()
    service = client()
    training = service.create_lora_training_client(base_model=BASE_MODEL, rank=8).result()
    return service, training, training.save_weights_and_get_sampling_client().result(), \
        types.ModelInput.from_ints([11, 12, 13])


def test_sampling_clients(start, backend):
    service, training, sampling, prompt = a_sampler(start)
    result = sampling.sample(prompt, 2, types.SamplingParams(max_tokens=3, seed=5, stop=["\n"])).result()
    assert [s.tokens for s in result.sequences] == [[100, 101, 102], [101, 102, 103]]
    assert result.sequences[0].logprobs == [-0.5] * 3 and result.sequences[0].stop_reason == "length"
    saved = f"tinker://{training.model_id.replace(':', '_')}/sampler_weights/latest"
    assert backend.called("sample")[0] == ("sample", saved, [11, 12, 13], 2, 3, 1.0, ["\n"], 5)
    assert sampling.compute_logprobs(prompt).result() == [None, -0.25, -0.5]

    path = training.save_weights_for_sampler("s1").result().path
    assert backend.called("save_for_sampler")[-1] == ("save_for_sampler", training.model_id, "s1")
    by_path = service.create_sampling_client(model_path=path)
    assert by_path.get_base_model() == BASE_MODEL
    by_path.sample(prompt, 1, types.SamplingParams(max_tokens=1)).result()
    base = service.create_sampling_client(base_model=BASE_MODEL)
    base.sample(prompt, 1, types.SamplingParams(max_tokens=1)).result()
    assert [c[1] for c in backend.called("sample")[-2:]] == [path, ""]


def test_save_and_load_state(start, backend):
    _, client = start()
    service = client()
    training = service.create_lora_training_client(base_model=BASE_MODEL, rank=8).result()
    path = training.save_state("step1").result().path
    assert path == f"tinker://{training.model_id.replace(':', '_')}/weights/step1"

    resumed = service.create_training_client_from_state_with_optimizer(path).result()
    assert resumed.model_id != training.model_id and resumed.get_info().model_data.model_name == BASE_MODEL
    assert backend.calls[-2:] == [("create_model", resumed.model_id, 8), ("load_state", resumed.model_id, path, True)]
    training.load_state(path).result()  # the deprecated in-place form
    assert backend.calls[-1] == ("load_state", training.model_id, path, False)


def test_failures_become_the_sdk_error_and_the_model_goes_on(start, backend):
    _, client = start()
    training = client().create_lora_training_client(base_model=BASE_MODEL, rank=8).result()
    with pytest.raises(tinker.RequestFailedError, match="unsupported loss_fn 'dro'"):
        training.forward_backward([datum([1], target_tokens=[2])], "dro").result()
    with pytest.raises(tinker.RequestFailedError, match="internal error: RuntimeError: disk full"):
        training.save_state("boom").result()
    output = training.forward_backward([datum([1], target_tokens=[2], weights=[1.0])], "cross_entropy").result()
    assert output.metrics["loss:sum"] == pytest.approx(0.1, rel=1e-6)


def test_a_wrong_api_key_is_refused(start):
    url, client = start()
    with pytest.raises(tinker.AuthenticationError, match="missing or wrong X-API-Key"):
        client(api_key="tml-wrong").create_lora_training_client(base_model=BASE_MODEL, rank=8).result(timeout=10)
    assert httpx.post(f"{url}/api/v1/create_session", json={}).status_code == 401


def test_an_unsupported_endpoint_is_named_and_takes_its_turn(start, backend):
    """The SDK numbered the unsupported training request; the model's next request must not wait for it."""
    url, client = start()
    training = client().create_lora_training_client(base_model=BASE_MODEL, rank=8).result()
    with pytest.raises(tinker.NotFoundError,
                       match="clawr1 tinker-serve does not support POST /api/v1/save_weights_external"):
        training.save_weights_external("exported").result(timeout=10)
    assert training.save_state("after").result(timeout=10).path.endswith("/weights/after")

    answer = httpx.get(f"{url}/api/v1/sessions", headers={"X-API-Key": API_KEY})
    assert answer.status_code == 404
    assert answer.json() == {"error": "clawr1 tinker-serve does not support GET /api/v1/sessions"}


def test_a_finished_session_releases_its_training_clients(start, backend):
    _, client = start()
    service = client()
    training = service.create_lora_training_client(base_model=BASE_MODEL, rank=8).result()
    training.forward_backward([datum([1, 2], target_tokens=[2, 3])], "cross_entropy").result()
    service.close("success").result()
    deadline = time.monotonic() + 10
    while not backend.called("release_model") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert backend.called("release_model") == [("release_model", training.model_id)]


# ---------------------------------------------------------------- sessions with a lease
SESSION_TTL_S = 25.0  # 2.5 of the SDK's 10-s heartbeats: a live client on a loaded machine is never taken for dead
DYING_CLIENT = """
import sys, time, tinker
client = tinker.ServiceClient(base_url=sys.argv[1], api_key=sys.argv[2])
training = client.create_lora_training_client(base_model=sys.argv[3], rank=8).result()
print(training.model_id, flush=True)
time.sleep(3600)  # never closes its ServiceClient: killed, as a cookbook loop that ends or crashes
"""


def test_a_client_that_dies_without_closing_frees_its_slot_within_the_ttl(start, backend):
    import os
    import subprocess
    import sys

    url, client = start(session_ttl_s=SESSION_TTL_S)
    live = client().create_lora_training_client(base_model=BASE_MODEL, rank=8).result()
    dying = subprocess.Popen([sys.executable, "-c", DYING_CLIENT, url, API_KEY, BASE_MODEL], stdout=subprocess.PIPE,
                             text=True, env={**os.environ, "TINKER_TELEMETRY": "0", "NO_PROXY": "127.0.0.1"})
    try:
        model_id = dying.stdout.readline().strip()
        assert ("create_model", model_id, 8) in backend.calls
    finally:
        dying.kill()
        dying.wait(30)
        dying.stdout.close()
    killed = time.monotonic()
    while ("release_model", model_id) not in backend.calls and time.monotonic() - killed < 2 * SESSION_TTL_S:
        time.sleep(0.2)
    assert ("release_model", model_id) in backend.calls
    assert time.monotonic() - killed <= SESSION_TTL_S + 10 + 5  # the TTL, its last beat's age at most, a check
    assert ("release_model", live.model_id) not in backend.calls  # a client that heartbeats keeps its session
    assert live.forward_backward([datum([1, 2, 3], target_tokens=[2, 3, 4], weights=[1.0, 1.0, 1.0])],
                                 "cross_entropy").result().loss_fn_outputs
    session_id = model_id.split(":")[0]
    beat = httpx.post(f"{url}/api/v1/session_heartbeat", json={"session_id": session_id},
                      headers={"X-API-Key": API_KEY})
    assert beat.status_code == 410  # the SDK's sign that its session has ended
    with httpx.Client(base_url=url, headers={"X-API-Key": API_KEY}) as http:
        answer = http.post("/api/v1/optim_step", json={"model_id": model_id, "seq_id": 1, "adam_params": {
            "learning_rate": 1e-3}}).json()
    assert "has ended" in answer["error"] and f"no heartbeat for {SESSION_TTL_S:g} s" in answer["error"], answer


# ---------------------------------------------------------------- a user's mistake, named
def test_a_users_mistake_is_named_and_never_an_internal_error(start, backend):
    service, training, sampling, prompt = a_sampler(start)
    mistakes = [
        (lambda: sampling.sample(prompt, 0, types.SamplingParams(max_tokens=3)), "num_samples must be at least 1"),
        (lambda: sampling.sample(prompt, 1, types.SamplingParams(max_tokens=MAX_CONTEXT)),
         f"the prompt (3 tokens) and max_tokens ({MAX_CONTEXT}) exceed the model's context of {MAX_CONTEXT} tokens"),
        (lambda: sampling.sample(types.ModelInput.from_ints([]), 1, types.SamplingParams(max_tokens=3)),
         "the prompt (model_input) has no tokens"),
    ]
    for call, message in mistakes:
        with pytest.raises(tinker.RequestFailedError) as raised:
            call().result(timeout=30)
        assert message in str(raised.value) and "internal error" not in str(raised.value)
    assert sampling.sample(prompt, 1, types.SamplingParams(max_tokens=MAX_CONTEXT - 3)).result().sequences

    training.save_state("kept").result()
    with pytest.raises(tinker.RequestFailedError, match="a state named 'kept' is saved already"):
        training.save_state("kept").result()
    assert training.save_state("kept", overwrite=True).result().path.endswith("/weights/kept")
    with pytest.raises(Exception, match="no sampler weights at 'tinker://nowhere/weights/x'"):
        service.create_sampling_client(model_path="tinker://nowhere/weights/x").result(timeout=30)  # not at a sample


def test_the_lora_seed_reaches_the_backend(start, backend):
    _, client = start()
    service = client()
    seeded = service.create_lora_training_client(base_model=BASE_MODEL, rank=8, seed=7).result()
    unseeded = service.create_lora_training_client(base_model=BASE_MODEL, rank=8).result()
    assert backend.seeds == {seeded.model_id: 7, unseeded.model_id: None}


# ---------------------------------------------------------------- the RestClient
def test_the_rest_client_lists_runs_and_checkpoints_and_deletes_one(start, backend):
    _, client = start()
    service = client()
    training = service.create_lora_training_client(base_model=BASE_MODEL, rank=8).result()
    state = training.save_state("s1").result().path
    sampler = training.save_weights_for_sampler("w1").result().path
    rest = service.create_rest_client()
    runs = rest.list_training_runs().result()
    assert [r.training_run_id for r in runs.training_runs] == [training.model_id] and runs.cursor.total_count == 1
    run = rest.get_training_run(training.model_id).result()
    assert (run.base_model, run.lora_rank, run.last_checkpoint.tinker_path,
            run.last_sampler_checkpoint.tinker_path) == (BASE_MODEL, 8, state, sampler)
    listed = rest.list_checkpoints(training.model_id).result().checkpoints
    assert [(c.checkpoint_type, c.tinker_path) for c in listed] == [("training", state), ("sampler", sampler)]
    rest.delete_checkpoint_from_tinker_path(state).result()
    assert backend.calls[-1] == ("delete_checkpoint", state)
    assert [c.tinker_path for c in rest.list_checkpoints(training.model_id).result().checkpoints] == [sampler]
    with pytest.raises(Exception, match="no training run 'nope' on this server"):
        rest.list_checkpoints("nope").result()
    with pytest.raises(Exception, match="has no checkpoint 'weights/s1'"):
        rest.delete_checkpoint_from_tinker_path(state).result()
