"""Contract tests for the SGLang backend: the exact flags, JSON and call order we use with SGLang.

SGLang cannot run here (no GPU), so the other side is played by stand-ins that answer as
docs/sglang_api_notes.md says SGLang does: HTTP servers on loopback, a fake broadcast that
completes only once an engine posted the matching receive (as an NCCL broadcast would), a
subprocess that joins weight-update groups the way an engine does (torch's own group helper,
over gloo), and a fake `sglang.launch_server`.

The weight-update stand-ins follow two released SGLang versions, read in their wheels:
0.5.15.post1 (slime's pin) and 0.5.23 (see SGLANG_0_5_15 / SGLANG_0_5_23 and §6a of the notes).
"""
from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import weakref
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
import torch

from clawr1.config import Config, ConfigError, load_config

from clawr1.ports import free_port
from clawr1.engine_api.client import (
    EngineClient, EngineError, Generation, SyncEngineClient, disk_update_payload, parse_generation, update_protocol,
)
from clawr1.serving.sglang import SGLangServer, SGLangStartError, launch_command, launch_env, serve_sglang
from clawr1.engine_api.weight_push import (
    BROADCAST_THREAD, DistributedWeightSync, WeightSyncError, begin_weight_update_payload, buckets, continue_payload,
    destroy_group_payload, dtype_name, end_weight_update_payload, init_group_payload, iter_buckets, pause_payload,
    rank_offsets, update_from_distributed_payload, update_from_tensor_payload,
)
from tests.conftest import REPO, pid_alive

PY = sys.executable


# ================================================================ launch_command


def test_launch_command_with_every_option():
    cfg = load_config(None, [
        "serve.host=0.0.0.0", "serve.sglang.device=cuda", "serve.sglang.tp_size=2", "serve.sglang.mem_fraction_static=0.85",
        "serve.sglang.context_length=32768", "serve.sglang.tool_call_parser=qwen25",
        "serve.sglang.reasoning_parser=qwen3", "serve.sglang.dtype=bfloat16",
        "serve.sglang.extra_args=[--trust-remote-code, --random-seed, '7']",
    ])
    assert launch_command(cfg, "/models/Qwen3-8B", 30001, weight_version=12) == [
        PY, "-m", "sglang.launch_server",
        "--model-path", "/models/Qwen3-8B",
        "--host", "0.0.0.0",
        "--port", "30001",
        "--tp-size", "2",
        "--dtype", "bfloat16",
        "--mem-fraction-static", "0.85",
        "--context-length", "32768",
        "--tool-call-parser", "qwen25",
        "--reasoning-parser", "qwen3",
        "--weight-version", "12",
        "--skip-server-warmup",
        "--enable-metrics",
        "--trust-remote-code", "--random-seed", "7",
    ]


def test_launch_command_defaults_omit_unset_options():
    assert launch_command(load_config(None, ["serve.sglang.device=cuda"]), "Qwen/Qwen2.5-0.5B-Instruct", 30000) == [
        PY, "-m", "sglang.launch_server",
        "--model-path", "Qwen/Qwen2.5-0.5B-Instruct",
        "--host", "127.0.0.1",
        "--port", "30000",
        "--tp-size", "1",
        "--dtype", "auto",
        "--tool-call-parser", "qwen25",
        "--weight-version", "0",
        "--skip-server-warmup",
        "--enable-metrics",
    ]


def test_launch_command_on_cpu_adds_sglangs_cpu_flags_and_float32():
    cfg = load_config(None, ["serve.sglang.device=cpu", "serve.num_threads=2"])
    assert launch_command(cfg, "/models/m", 30000) == [
        PY, "-m", "sglang.launch_server", "--model-path", "/models/m", "--host", "127.0.0.1", "--port", "30000",
        "--tp-size", "1", "--dtype", "float32",
        "--device", "cpu", "--attention-backend", "torch_native", "--disable-overlap-schedule", "--sleep-on-idle",
        "--mem-fraction-static", "0.8", "--max-total-tokens", "4096",
        "--tool-call-parser", "qwen25", "--weight-version", "0", "--skip-server-warmup", "--enable-metrics",
    ]
    env = launch_env(cfg)
    assert (env["SGLANG_USE_CPU_ENGINE"], env["OMP_NUM_THREADS"], env["HF_HUB_OFFLINE"]) == ("1", "2", "1")
    lora = launch_command(load_config(None, ["serve.sglang.device=cpu", "serve.max_loras=2", "serve.max_total_tokens=2048",
                                             "serve.sglang.dtype=bfloat16"]), "/models/m", 30000)
    assert lora[lora.index("--dtype") + 1] == "bfloat16" and lora[lora.index("--max-total-tokens") + 1] == "2048"
    assert lora[lora.index("--lora-backend") + 1] == "torch_native"


def test_device_auto_is_cpu_exactly_where_torch_sees_no_gpu():
    cmd = launch_command(Config(), "/models/m", 30000)
    assert ("--device" in cmd) == (not torch.cuda.is_available())
    gpu_env = launch_env(load_config(None, ["serve.sglang.device=cuda"]))
    assert gpu_env["HF_HUB_OFFLINE"] == "1"
    assert gpu_env.get("SGLANG_USE_CPU_ENGINE") == os.environ.get("SGLANG_USE_CPU_ENGINE")  # clawr1 sets it on CPU only


def test_launch_command_without_tool_parser():
    cmd = launch_command(load_config(None, ["serve.sglang.tool_call_parser="]), "m", 30000)
    assert "--tool-call-parser" not in cmd


@pytest.mark.parametrize("override, match", [
    ("serve.sglang.tp_size=0", r"serve\.sglang\.tp_size: Input should be greater than or equal to 1 \(got 0\)"),
    ("serve.sglang.mem_fraction_static=1.0", r"serve\.sglang\.mem_fraction_static: Input should be less than 1 \(got 1\.0\)"),
    ("serve.sglang.mem_fraction_static=-0.5", r"mem_fraction_static: .* \(got -0\.5\)"),
    ("serve.sglang.context_length=-1", r"serve\.sglang\.context_length: Input should be greater than or equal to 0"),
    ("serve.sglang.dtype=fp8", r"serve\.sglang\.dtype: 'fp8' is not allowed; choose one of: auto, half, float16, bfloat16, "
                               r"float, float32"),
    ("serve.sglang.extra_args=[--port, '1']", r"extra_args sets --port"),
    ("serve.sglang.extra_args=[--tp-size=4]", r"extra_args sets --tp-size"),
])
def test_config_refuses_bad_sglang_values_before_anything_starts(override, match):
    with pytest.raises(ConfigError, match=match):
        load_config(None, [override])


@pytest.mark.parametrize("args, match", [
    ({"port": 0}, r"port must be in 1\.\.65535, got 0"),
    ({"model_path": ""}, r"model_path is empty"),
    ({"weight_version": -1}, r"weight_version must be >= 0"),
])
def test_launch_command_rejects_bad_values(args, match):
    call = {"model_path": "m", "port": 30000, **args}
    with pytest.raises(ValueError, match=match):
        launch_command(load_config(None), **call)


# ================================================================ payloads


def test_init_group_payload():
    assert init_group_payload("10.0.0.1", 29500, 3, 8, "clawr1_weights") == {
        "master_address": "10.0.0.1", "master_port": 29500, "rank_offset": 3, "world_size": 8,
        "group_name": "clawr1_weights", "backend": "nccl",
    }
    assert init_group_payload("h", 1, 1, 2, "g", backend="gloo")["backend"] == "gloo"


def test_update_from_distributed_payload():
    payload = update_from_distributed_payload(
        ["model.embed_tokens.weight", "lm_head.weight"], ["bfloat16", "float32"], [[151936, 896], [151936, 896]],
        "clawr1_weights-0", 7)
    assert payload == {
        "names": ["model.embed_tokens.weight", "lm_head.weight"],
        "dtypes": ["bfloat16", "float32"],
        "shapes": [[151936, 896], [151936, 896]],
        "group_name": "clawr1_weights-0",
        "weight_version": "7",
        "flush_cache": False,
    }
    assert json.loads(json.dumps(payload)) == payload
    flushed = update_from_distributed_payload(["a"], ["float16"], [(2, 3)], "g", 1, flush_cache=True)
    assert flushed["flush_cache"] is True
    assert update_from_distributed_payload(["a"], ["float16"], [(2, 3)], "g", 1)["shapes"] == [[2, 3]]


def test_update_from_tensor_payload():
    assert update_from_tensor_payload(["QUJD", "REVG"], 4) == {
        "serialized_named_tensors": ["QUJD", "REVG"], "weight_version": "4", "flush_cache": False,
    }
    assert update_from_tensor_payload(["QUJD"], 5, load_format="flattened_bucket", flush_cache=True) == {
        "serialized_named_tensors": ["QUJD"], "weight_version": "5", "flush_cache": True,
        "load_format": "flattened_bucket",
    }


def test_control_payloads():
    assert pause_payload() == {"mode": "retract"}
    assert pause_payload("in_place") == {"mode": "in_place"}
    assert pause_payload("abort") == {"mode": "abort"}
    assert pause_payload("retract") == {"mode": "retract"}
    with pytest.raises(ValueError, match="pause mode must be one of abort, retract, in_place"):
        pause_payload("soft")
    assert continue_payload() == {}
    assert destroy_group_payload("clawr1_weights-1") == {"group_name": "clawr1_weights-1"}
    assert begin_weight_update_payload() == {"selector": "all"}
    assert end_weight_update_payload() == {}
    assert disk_update_payload("/w/v000003", 3) == {"model_path": "/w/v000003", "weight_version": "3",
                                                    "flush_cache": False}


def test_dtype_names_are_torch_attribute_names():
    assert [dtype_name(d) for d in (torch.bfloat16, torch.float16, torch.float32)] == ["bfloat16", "float16", "float32"]
    assert all(getattr(torch, dtype_name(d)) is d for d in (torch.bfloat16, torch.float8_e4m3fn, torch.int64))


# ================================================================ buckets and rank offsets


def _named(*spec):
    return [(name, torch.zeros(n, dtype=dtype)) for name, n, dtype in spec]


def test_buckets_group_consecutively_by_bytes():
    named = _named(("a", 4, torch.float32), ("b", 4, torch.float32), ("c", 4, torch.float32),  # 16 B each
                   ("big", 16, torch.float32),  # 64 B: more than a bucket
                   ("d", 4, torch.bfloat16), ("e", 4, torch.bfloat16), ("f", 8, torch.bfloat16))  # 8, 8, 16 B
    got = [[n for n, _ in b] for b in buckets(named, 32)]
    assert got == [["a", "b"], ["c"], ["big"], ["d", "e", "f"]]
    assert [[n for n, _ in b] for b in buckets(named, 10_000)] == [["a", "b", "c", "big", "d", "e", "f"]]
    assert [[n for n, _ in b] for b in buckets(named, 1)] == [[n] for n, _ in named]


def test_buckets_edge_cases():
    assert buckets([], 64) == []
    first = _named(("huge", 100, torch.float32), ("x", 1, torch.float32))
    assert [[n for n, _ in b] for b in buckets(first, 8)] == [["huge"], ["x"]]
    exact = _named(("a", 2, torch.float32), ("b", 2, torch.float32))
    assert [[n for n, _ in b] for b in buckets(exact, 16)] == [["a", "b"]]
    with pytest.raises(ValueError, match="bucket_bytes must be > 0"):
        buckets(exact, 0)


def test_iter_buckets_draws_one_tensor_past_the_bucket_it_yields():
    drawn = []

    def source():
        for name, n in (("a", 4), ("b", 4), ("c", 4), ("d", 1)):  # float32: 16, 16, 16, 4 bytes
            drawn.append(name)
            yield name, torch.zeros(n)

    it = iter_buckets(source(), 32)
    assert [n for n, _ in next(it)] == ["a", "b"] and drawn == ["a", "b", "c"]
    assert [n for n, _ in next(it)] == ["c", "d"] and drawn == ["a", "b", "c", "d"]
    assert next(it, None) is None


def test_rank_offsets():
    assert rank_offsets([2, 4, 1]) == ([1, 3, 7], 8)
    assert rank_offsets([1]) == ([1], 2)
    assert rank_offsets([8, 8]) == ([1, 9], 17)
    with pytest.raises(ValueError, match="engine 1 has 0 GPUs"):
        rank_offsets([2, 0])


# ================================================================ parse_generation on SGLang's /generate reply


def test_parse_generation_of_a_literal_sglang_reply():
    reply = json.loads("""{
      "text": " 4",
      "output_ids": [220, 19, 151645],
      "meta_info": {
        "id": "3f2c0b8e9a", "finish_reason": {"type": "stop", "matched": 151645},
        "prompt_tokens": 4, "weight_version": "3", "num_retractions": 0,
        "input_token_logprobs": [[null, 872, null], [-2.5, 198, null], [-0.25, 17, null], [-1.0, 10, null]],
        "output_token_logprobs": [[-0.0123, 220, null], [-0.0004, 19, null], [-0.2, 151645, null]],
        "output_token_logprobs_length": 3,
        "reasoning_tokens": 0, "completion_tokens": 3, "cached_tokens": 0,
        "weight_versions": [{"version": "2", "start": 0, "end": 1}, {"version": "3", "start": 1, "end": 3}],
        "e2e_latency": 0.0831, "response_sent_to_client_ts": 1760000000.12
      }
    }""")
    assert parse_generation(reply) == Generation(
        output_ids=[220, 19, 151645],  # the EOS is in output_token_logprobs and is kept
        logprobs=[-0.0123, -0.0004, -0.2],
        versions=[2, 3, 3],
        text=" 4",
        finish_reason="stop",
        prompt_logprobs=[-2.5, -0.25, -1.0],  # entry 0 is always null and is dropped
        weight_version=3,
        prompt_top_ids=[],
        prompt_top_logprobs=[],
    )


def test_parse_generation_before_any_update_and_on_length():
    reply = {"text": "ab", "output_ids": [5, 6], "meta_info": {
        "id": "x", "finish_reason": {"type": "length", "length": 2}, "prompt_tokens": 1,
        "weight_version": "default", "num_retractions": 0, "input_token_logprobs": [],
        "output_token_logprobs": [[-1.5, 5, None], [-0.5, 6, None]], "output_token_logprobs_length": 2,
        "completion_tokens": 2, "cached_tokens": 0,
        "weight_versions": [{"version": "default", "start": 0, "end": 2}]}}
    gen = parse_generation(reply)
    assert (gen.output_ids, gen.logprobs, gen.versions, gen.finish_reason, gen.weight_version, gen.prompt_logprobs) == (
        [5, 6], [-1.5, -0.5], [0, 0], "length", 0, [])


# ================================================================ what an engine supports

# Releases the contract tests are derived from (docs/sglang_api_notes.md §6a, read in the released wheels):
SGLANG_0_5_15 = "0.5.15.post1"  # slime's pin: no /begin_weight_update (404); flush needs an empty queue
SGLANG_0_5_23 = "0.5.23"  # session required for distributed/tensor updates; flush ignores the queue while paused
SESSION_REFUSAL_0_5_23 = ("update_weights_from_distributed must run between begin_weight_update() and "
                          "end_weight_update()")  # SchedulerWeightUpdaterManager.update_weights_from_distributed


@pytest.mark.parametrize("info, expected", [
    ({"version": SGLANG_0_5_15}, ("abort", False)),
    ({"version": "0.5.20"}, ("abort", False)),  # the last release without a session or flush-while-retracted
    ({"version": "0.5.21"}, ("retract", True)),  # the first with both
    ({"version": SGLANG_0_5_23}, ("retract", True)),
    ({"version": "0.5.23+cu129"}, ("retract", True)),
    ({"version": "0.6.0"}, ("retract", True)),
    ({"version": "0.5.21.dev12+g1a2b3c"}, ("abort", None)),  # a build before 0.5.21: ask /begin_weight_update
    ({"version": "0.5.22rc1"}, ("retract", True)),
    ({"version": "nightly"}, ("abort", None)),
    ({}, ("abort", None)),
    (None, ("abort", None)),
    ({"engine": "clawr1-embedded"}, ("retract", False)),
    ({"engine": "clawr1-tinker"}, ("retract", False)),  # serve.backend=tinker: nothing to pause, no session
])
def test_update_protocol_follows_the_release(info, expected):
    proto = update_protocol(info)
    assert (proto.pause_mode, proto.session) == expected
    assert (info or {}).get("version", "unknown") in proto.engine or proto.engine == (info or {}).get("engine")


# ================================================================ weight push against HTTP stand-ins


class Log:
    """Every HTTP call and broadcast the engines see, in one global order."""

    def __init__(self):
        self.events: list[tuple] = []
        self.cond = threading.Condition()

    def add(self, *event) -> None:
        with self.cond:
            self.events.append(event)


class Wire:
    """Stands in for the NCCL group: a broadcast completes once `group_size` engines posted a receive.

    The engines' /update_weights_from_distributed calls post the receives (their names, in order)
    and answer only after every tensor arrived. An engine that refuses never posts one, so the
    broadcast waits (as an NCCL broadcast with a missing peer does) until close() or 10 s.
    """

    def __init__(self, log: Log, group_size: int = 1):
        self.log, self.group_size = log, group_size
        self.pending: dict[str, list[str]] = {}
        self.closed = False

    def receive(self, engine: str, names: list[str], timeout: float = 10.0) -> bool:
        with self.log.cond:
            self.pending[engine] = list(names)
            self.log.cond.notify_all()
            return self.log.cond.wait_for(lambda: not self.pending[engine], timeout)

    def close(self) -> None:
        with self.log.cond:
            self.closed = True
            self.log.cond.notify_all()

    def broadcast(self, tensor: torch.Tensor) -> None:
        with self.log.cond:
            ready = lambda: self.closed or sum(1 for v in self.pending.values() if v) >= self.group_size  # noqa: E731
            if not self.log.cond.wait_for(ready, 10.0):
                raise TimeoutError("no engine posted a receive")
            if self.closed:
                raise RuntimeError("broadcast failed: the group was torn down")
            for engine in sorted(e for e, names in self.pending.items() if names):
                self.log.events.append(("broadcast", engine, self.pending[engine].pop(0), tensor.flatten()[0].item()))
            self.log.cond.notify_all()


FLUSHED = ("Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting "
           "requests, the operation will not be performed.)\n")


class FakeEngine:
    """An HTTP server answering SGLang's control endpoints as release `version` does (docs/sglang_api_notes.md §6a).

    running: requests generating when the update starts; they decide whether /flush_cache is accepted
    (0.5.15: only with nothing running or queued; 0.5.23: nothing running, queued ones ignored while the
    scheduler is paused, i.e. after a retract pause). busy_flushes: refuse that many flushes anyway
    (aborted requests still draining). version=None: no /server_info (an engine that does not say).
    reported: the version /server_info reports, if not `version` (a patched build that misreports).
    nccl_version: reported in /model_info, as clawr1's embedded engine does (SGLang reports none).
    stuck_loras: /unload_lora_adapter says it unloaded, and keeps the adapter. unload_delay_s: it answers that late.
    device: what /server_info reports; on "cpu" a tensor payload kills the server, as it does real SGLang 0.5.23
    (tests/sglang): the pickled tensors' shared memory cannot be reached there.
    """

    def __init__(self, name: str, log: Log, wire: Wire, *, version: str | None = SGLANG_0_5_23,
                 reported: str | None = None, fail_update: bool = False, fail_init: bool = False, running: int = 0,
                 busy_flushes: int = 0, refuse_flushes: bool = False, in_session: bool = False,
                 has_begin: bool | None = None, old_model_info: bool = False, fail_disk: bool = False,
                 nccl_version: str | None = None, remote: bool = False, stuck_loras: bool = False,
                 unload_delay_s: float = 0.0, device: str = "cuda"):
        self.name, self.log, self.wire = name, log, wire
        self.device, self.dead = device, False
        self.loras: dict[str, dict] = {}  # LoRA adapters by name: their tensors (or directory)
        self.remote = remote  # on another machine: pickled tensors (shared memory handles) cannot be read
        self.stuck_loras, self.unload_delay_s = stuck_loras, unload_delay_s
        self.nccl_version = nccl_version
        self.version, self.reported = version, reported or version
        self.new = version != SGLANG_0_5_15 if has_begin is None else has_begin  # has the 0.5.23 session API
        self.fail_update, self.fail_init, self.fail_disk = fail_update, fail_init, fail_disk
        self.running, self.waiting, self.busy_flushes, self.refuse_flushes = running, 0, busy_flushes, refuse_flushes
        self.paused = self.scheduler_paused = False
        self.in_session, self.old_model_info = in_session, old_model_info
        self.weight_version = "default"
        engine = self

        class Handler(BaseHTTPRequestHandler):
            def _reply(self, status, reply):
                data = reply.encode() if isinstance(reply, str) else json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain" if isinstance(reply, str) else "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                self._reply(*engine.answer("POST", self.path, body))

            def do_GET(self):
                self._reply(*engine.answer("GET", self.path, None))

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def idle(self) -> bool:
        queued_ok = self.waiting == 0 or (self.new and self.scheduler_paused)
        return self.running == 0 and queued_ok

    def answer(self, method: str, path: str, body: dict | None) -> tuple[int, dict | str]:
        ok = {"success": True, "message": "Succeeded."}
        not_found = (404, {"detail": "Not Found"})
        if path in ("/server_info", "/get_server_info"):
            self.log.add("http", self.name, path, None)
            return (200, {"version": self.reported, "tp_size": 1, "device": self.device}) if self.reported else not_found
        if path in ("/model_info", "/get_model_info"):
            self.log.add("http", self.name, path, None)
            if path == "/model_info" and self.old_model_info:
                return not_found
            info = {"model_path": "m", "weight_version": self.weight_version, "is_generation": True}
            return 200, {**info, "nccl_version": self.nccl_version} if self.nccl_version else info
        if path == "/flush_cache":  # GET or POST, plain text
            accepted = self.idle() and not self.refuse_flushes and self.busy_flushes == 0
            self.busy_flushes -= 0 if accepted else int(self.busy_flushes > 0)
            self.log.add("http", self.name, path, 200 if accepted else 400)
            return (200, FLUSHED) if accepted else (400, "Flush cache failed.\n")
        self.log.add("http", self.name, path, body)
        if path == "/pause_generation":
            mode = body.get("mode", "abort")
            self.paused, self.scheduler_paused = True, mode != "abort"  # abort is handled by the tokenizer manager
            if mode == "abort":
                self.running = self.waiting = 0  # every request ends with finish_reason abort
            elif mode == "retract":
                self.running, self.waiting = 0, self.waiting + self.running
            return 200, {"message": "Generation paused successfully.", "status": "ok"}
        if path == "/continue_generation":
            self.paused = self.scheduler_paused = False
            self.running, self.waiting = self.running + self.waiting, 0
            return 200, {"message": "Generation continued successfully.", "status": "ok"}
        if path == "/init_weights_update_group":
            if self.fail_init:
                return 400, {"success": False, "message": "Failed to initialize custom process group: timed out."}
            return 200, ok
        if path in ("/begin_weight_update", "/end_weight_update"):
            if not self.new:
                return not_found
            opening = path == "/begin_weight_update"
            if self.in_session == opening:
                return 400, {"success": False, "message": "a weight-update session is already open; call "
                             "end_weight_update() first" if opening else "no weight-update session is open; "
                             "call begin_weight_update() first"}
            self.in_session = opening
            return 200, {"success": True, "message": "Success"}
        if path == "/update_weights_from_distributed":
            return self._update(body)
        if path == "/update_weights_from_disk":
            if self.fail_disk:
                return 400, {"success": False, "message": "Failed to update weights: no such file.\nRolling back to "
                             "original weights.", "num_paused_requests": 0}
            self.weight_version = body["weight_version"]
            return 200, {"success": True, "message": "Succeeded to update model weights. Weight version updated to "
                         f"{body['weight_version']}.", "num_paused_requests": 0}
        if path == "/destroy_weights_update_group":
            return 200, ok
        if path in ("/load_lora_adapter", "/load_lora_adapter_from_tensors", "/unload_lora_adapter"):
            return self._lora(path, body)
        return not_found

    def _lora(self, path: str, body: dict) -> tuple[int, dict]:
        """LoRAUpdateOutput as both releases answer; the tensors field as each release's msgspec struct takes it
        (0.5.15.post1: one base64 `serialized_tensors`; 0.5.23: `serialized_named_tensors`, one per TP rank)."""
        def reply(error: str = "") -> tuple[int, dict]:
            return (400 if error else 200), {"success": not error, "error_message": error or None,
                                              "loaded_adapters": {n: "x" for n in self.loras}}

        name = body["lora_name"]
        if path == "/unload_lora_adapter":
            time.sleep(self.unload_delay_s)
            held = self.loras.get(name) if self.stuck_loras else self.loras.pop(name, None)
            return reply() if held is not None else reply(f"LoRA adapter {name} not found")
        if name in self.loras:
            return reply(f"Failed to load LoRA adapter {name}: an adapter with that name is already loaded")
        if path == "/load_lora_adapter":
            self.loras[name] = {"dir": body["lora_path"]}
            return reply()
        field = "serialized_named_tensors" if self.new else "serialized_tensors"
        other = "serialized_tensors" if self.new else "serialized_named_tensors"
        if field not in body or other in body:
            return 400, {"detail": f"Object missing required field `{field}`"}
        blobs = body[field] if self.new else [body[field]]
        if self.remote:
            return reply("Failed to load LoRA adapter: cannot reach the sender's shared memory")
        if self.device == "cpu":
            self.dead = True  # real SGLang's scheduler dies of it (multiprocessing AuthenticationError)
            return 500, {"detail": "the scheduler died"}
        import base64
        import pickle

        self.loras[name] = {"tensors": [pickle.loads(base64.b64decode(b)) for b in blobs], "config": body["config_dict"]}
        return reply()

    def _update(self, body: dict) -> tuple[int, dict]:
        if self.new and not self.in_session:  # refused, and it never joins the broadcast
            return 400, {"success": False, "message": SESSION_REFUSAL_0_5_23}
        if self.fail_update:
            return 400, {"success": False, "message": "Failed to receive weights: shape mismatch."}
        if not self.wire.receive(self.name, body["names"]):
            return 400, {"success": False, "message": "broadcast timed out"}
        if body["flush_cache"] and not self.idle():
            return 400, {"success": False, "message": "Weights were updated, but the cache was not flushed"}
        self.weight_version = body["weight_version"]
        return 200, {"success": True, "message": "Succeeded to update parameter online. "
                                                 f"Weight version updated to {body['weight_version']}."}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fleet():
    """fleet(n, group_size=1, **engine_kw) -> (log, wire, engines); all servers closed afterwards."""
    made: list[FakeEngine] = []
    wires: list[Wire] = []

    def make(n: int, group_size: int = 1, **kw):
        log = Log()
        wire = Wire(log, group_size)
        wires.append(wire)
        engines = [FakeEngine(chr(ord("A") + i), log, wire, **kw.get(chr(ord("A") + i), {})) for i in range(n)]
        made.extend(engines)
        return log, wire, engines

    yield make
    for w in wires:
        w.close()  # releases broadcasts still waiting for an engine that refused
    for e in made:
        e.close()


def _tensors():
    """w0 + w1 fill a 16-byte bucket, w2 gets the next one, w3 (32 B) is too big for any; values identify them."""
    return [("w0", torch.full((2,), 0.0)), ("w1", torch.full((4,), 1.0, dtype=torch.bfloat16)),
            ("w2", torch.full((3,), 2.0)), ("w3", torch.full((8,), 3.0))]


def _engine_script(name: str, group: str, version: str, *, session: bool, pause: str,
                   flush_refusals: int = 0) -> list[tuple]:
    """The exact calls and broadcasts one engine must see for _tensors() in buckets of 16 bytes."""
    def update(names, dtypes, shapes):
        return ("http", name, "/update_weights_from_distributed",
                {"names": names, "dtypes": dtypes, "shapes": shapes, "group_name": group,
                 "weight_version": version, "flush_cache": False})

    def bcast(w):
        return ("broadcast", name, w, float(w[1]))

    return [
        ("http", name, "/pause_generation", {"mode": pause}),
        *([("http", name, "/begin_weight_update", {"selector": "all"})] if session else []),
        *[("http", name, "/flush_cache", 400)] * flush_refusals,
        ("http", name, "/flush_cache", 200),
        update(["w0", "w1"], ["float32", "bfloat16"], [[2], [4]]), bcast("w0"), bcast("w1"),
        update(["w2"], ["float32"], [[3]]), bcast("w2"),
        update(["w3"], ["float32"], [[8]]), bcast("w3"),
        *([("http", name, "/end_weight_update", {})] if session else []),
        ("http", name, "/continue_generation", {}),
    ]


def _sync(urls, wire, **kw) -> DistributedWeightSync:
    return DistributedWeightSync(urls, bucket_bytes=16, broadcast=wire.broadcast, retry_interval_s=0.01, **kw)


def test_connect_asks_each_engine_once_then_posts_one_group_per_engine(fleet):
    log, wire, (a, b) = fleet(2, A={"version": SGLANG_0_5_15})
    with DistributedWeightSync([a.url, b.url], broadcast=wire.broadcast) as sync:
        sync.connect("10.0.0.1", 29500, [2, 1])
        sync.connect("10.0.0.1", 29500, [2, 1])  # a reconnect does not ask again
    assert sorted(e[:3] for e in log.events if e[2] == "/server_info") == [("http", "A", "/server_info"),
                                                                           ("http", "B", "/server_info")]
    assert {(p.engine, p.pause_mode, p.session) for p in sync.protocols.values()} == {
        (f"sglang {SGLANG_0_5_15}", "abort", False), (f"sglang {SGLANG_0_5_23}", "retract", True)}
    joins = [e for e in log.events if e[2] == "/init_weights_update_group"]
    assert sorted(joins[:2], key=lambda e: e[1]) == [
        ("http", "A", "/init_weights_update_group", {"master_address": "10.0.0.1", "master_port": 29500,
         "rank_offset": 1, "world_size": 3, "group_name": "clawr1_weights-0", "backend": "nccl"}),
        ("http", "B", "/init_weights_update_group", {"master_address": "10.0.0.1", "master_port": 29500,
         "rank_offset": 1, "world_size": 2, "group_name": "clawr1_weights-1", "backend": "nccl"}),
    ]


def test_connect_shared_group_uses_slime_rank_layout(fleet):
    log, wire, engines = fleet(3)
    with DistributedWeightSync([e.url for e in engines], rolling=False, group_name="g", broadcast=wire.broadcast) as s:
        s.connect("trainer-0", 29501, [2, 4, 1])
    got = {e[1]: (e[3]["rank_offset"], e[3]["world_size"], e[3]["group_name"]) for e in log.events
           if e[2] == "/init_weights_update_group"}
    assert got == {"A": (1, 8, "g"), "B": (3, 8, "g"), "C": (7, 8, "g")}


def test_push_to_sglang_0_5_23_retracts_opens_a_session_and_flushes(fleet):
    """0.5.23: pause(retract) -> begin -> flush (retried while refused) -> buckets -> end -> continue, per engine."""
    log, wire, (a, b) = fleet(2, A={"running": 3, "busy_flushes": 2}, B={"running": 1})
    with _sync([a.url, b.url], wire) as sync:
        sync.connect("127.0.0.1", 29500, [1, 1])
        log.events.clear()
        sync.push(_tensors(), 7)
    # the whole sequence of engine A, then the whole sequence of engine B: B is untouched until A continues
    assert log.events == _engine_script("A", "clawr1_weights-0", "7", session=True, pause="retract",
                                        flush_refusals=2) + \
        _engine_script("B", "clawr1_weights-1", "7", session=True, pause="retract")
    assert (a.running, a.waiting, a.in_session, a.weight_version) == (3, 0, False, "7")  # retracted ones resumed


def test_push_to_sglang_0_5_15_aborts_and_sends_no_session(fleet):
    """0.5.15.post1 (slime's pin): no /begin_weight_update; a retract pause would leave the flush refused forever."""
    log, wire, (a,) = fleet(1, A={"version": SGLANG_0_5_15, "running": 2})
    with _sync([a.url], wire) as sync:
        sync.connect("127.0.0.1", 29500, [1])
        log.events.clear()
        sync.push(_tensors(), 2)
        sync.push(_tensors(), 3)
    script = lambda v: _engine_script("A", "clawr1_weights-0", v, session=False, pause="abort")  # noqa: E731
    assert log.events == script("2") + script("3")
    assert a.weight_version == "3"


def test_a_retract_pause_on_sglang_0_5_15_never_flushes(fleet):
    """Why 0.5.15 gets `abort`: its flush needs an empty queue, and retracted requests wait in it while paused."""
    log, _, (a,) = fleet(1, A={"version": SGLANG_0_5_15, "running": 2})
    httpx.post(f"{a.url}/pause_generation", json={"mode": "retract"})
    assert [httpx.get(f"{a.url}/flush_cache").status_code for _ in range(3)] == [400, 400, 400]
    httpx.post(f"{a.url}/pause_generation", json={"mode": "abort"})
    assert httpx.get(f"{a.url}/flush_cache").status_code == 200


def test_mixed_releases_each_get_their_own_protocol(fleet):
    log, wire, (a, b) = fleet(2, A={"version": SGLANG_0_5_15}, B={"version": SGLANG_0_5_23})
    with _sync([a.url, b.url], wire) as sync:
        sync.connect("127.0.0.1", 29500, [1, 1])
        log.events.clear()
        sync.push(_tensors(), 5)
    assert log.events == _engine_script("A", "clawr1_weights-0", "5", session=False, pause="abort") + \
        _engine_script("B", "clawr1_weights-1", "5", session=True, pause="retract")


@pytest.mark.parametrize("has_begin", [False, True])
def test_an_engine_that_does_not_say_is_asked_by_begin_weight_update(fleet, has_begin):
    """No version: abort (flushes on every release), and /begin_weight_update once: 404 means no session, ever."""
    log, wire, (a,) = fleet(1, A={"version": None, "has_begin": has_begin})
    with _sync([a.url], wire) as sync:
        sync.connect("127.0.0.1", 29500, [1])
        log.events.clear()
        sync.push(_tensors(), 1)
        sync.push(_tensors(), 2)
    first, second = (_engine_script("A", "clawr1_weights-0", v, session=True, pause="abort") for v in "12")
    if not has_begin:  # the probe is the only /begin_weight_update it gets
        second = [e for e in second if e[2] not in ("/begin_weight_update", "/end_weight_update")]
        first = [e for e in first if e[2] != "/end_weight_update"]
    assert log.events == first + second


def test_a_session_left_open_by_a_failed_push_is_closed_first(fleet):
    log, wire, (a,) = fleet(1, A={"in_session": True})
    with _sync([a.url], wire) as sync:
        sync.connect("127.0.0.1", 29500, [1])
        log.events.clear()
        sync.push(_tensors(), 4)
    script = _engine_script("A", "clawr1_weights-0", "4", session=True, pause="retract")
    assert log.events == script[:2] + [("http", "A", "/end_weight_update", {}),
                                       ("http", "A", "/begin_weight_update", {"selector": "all"})] + script[2:]


def test_a_flush_refused_too_long_fails_and_lets_the_engine_serve_again(fleet):
    log, wire, (a,) = fleet(1, A={"refuse_flushes": True})
    with _sync([a.url], wire, flush_timeout_s=0.3) as sync:
        sync.connect("127.0.0.1", 29500, [1])
        log.events.clear()
        t0 = time.monotonic()
        with pytest.raises(WeightSyncError, match=rf"engine {a.url}: /flush_cache still refused after 0.3s "
                                                  r"\(\d+ tries\): Flush cache failed"):
            sync.push(_tensors(), 4)
        assert time.monotonic() - t0 < 9  # the flush's 0.3 s bound, not the wire's 10 s (machine load aside)
    paths = [e[2] for e in log.events]
    assert paths[:2] == ["/pause_generation", "/begin_weight_update"] and paths.count("/flush_cache") >= 2
    assert paths[-2:] == ["/end_weight_update", "/continue_generation"]  # no weight moved: released
    assert "/update_weights_from_distributed" not in paths and not a.in_session and not a.paused


def test_refusal_names_the_engine_fails_fast_and_leaves_it_paused(fleet):
    log, wire, (a, b) = fleet(2, B={"fail_update": True})
    with _sync([a.url, b.url], wire, refusal_grace_s=0.5) as sync:
        sync.connect("127.0.0.1", 29500, [1, 1])
        log.events.clear()
        t0 = time.monotonic()
        with pytest.raises(WeightSyncError) as err:
            sync.push(_tensors(), 4)
        assert time.monotonic() - t0 < 9  # the 0.5 s refusal grace, not the wire's 10 s (machine load aside)
    msg = str(err.value)
    assert b.url in msg and "/update_weights_from_distributed" in msg and "HTTP 400" in msg
    assert "Failed to receive weights: shape mismatch." in msg
    assert [e for e in log.events if e[1] == "A"] == _engine_script("A", "clawr1_weights-0", "4", session=True,
                                                                     pause="retract")
    assert [e[2] for e in log.events if e[1] == "B"] == [
        "/pause_generation", "/begin_weight_update", "/flush_cache", "/update_weights_from_distributed"]  # no continue
    assert b.paused


def test_an_engine_misreporting_its_release_is_refused_within_the_bound(fleet):
    """A 0.5.23 build that says 0.5.15: no session is opened, the engine answers 400 and never joins the broadcast."""
    log, wire, (a,) = fleet(1, A={"version": SGLANG_0_5_23, "reported": SGLANG_0_5_15})
    with _sync([a.url], wire, refusal_grace_s=1.0) as sync:
        sync.connect("127.0.0.1", 29500, [1])
        t0 = time.monotonic()
        with pytest.raises(WeightSyncError, match=f"engine {a.url}: /update_weights_from_distributed answered "
                                                  f"HTTP 400: .*{re.escape(SESSION_REFUSAL_0_5_23)}"):
            sync.push(_tensors(), 1)
        elapsed = time.monotonic() - t0
    assert 1.0 <= elapsed < 9  # the refusal, then the 1 s grace for the broadcast, not the wire's 10 s


def test_failed_join_names_the_engine(fleet):
    log, wire, (a, b) = fleet(2, B={"fail_init": True})
    with DistributedWeightSync([a.url, b.url], broadcast=wire.broadcast) as sync:
        with pytest.raises(WeightSyncError, match=f"engine {b.url}: /init_weights_update_group answered HTTP 400: "
                                                  ".*Failed to initialize custom process group"):
            sync.connect("127.0.0.1", 29500, [1, 1])
        with pytest.raises(ValueError, match="gpus_per_engine has 1 entries for 2 engines"):
            sync.connect("127.0.0.1", 29500, [1])


def test_refused_join_is_named_even_while_rank_0_waits_in_a_real_group(fleet):
    _, wire, (a,) = fleet(1, A={"fail_init": True})
    with DistributedWeightSync([a.url], backend="gloo", timeout_s=2) as sync:
        with pytest.raises(WeightSyncError, match=f"engine {a.url}: /init_weights_update_group answered HTTP 400"):
            sync.connect("127.0.0.1", 0, [1])


def test_push_before_connect_is_an_error(fleet):
    _, wire, (a,) = fleet(1)
    with DistributedWeightSync([a.url], broadcast=wire.broadcast) as sync:
        with pytest.raises(WeightSyncError, match="connect"):
            sync.push(_tensors(), 1)


def test_push_shared_group_updates_all_engines_together(fleet):
    log, wire, (a, b) = fleet(2, group_size=2)
    with _sync([a.url, b.url], wire, rolling=False) as sync:
        sync.connect("127.0.0.1", 29500, [1, 1])
        log.events.clear()
        sync.push(_tensors(), 3)
    for name in "AB":
        assert [e for e in log.events if e[1] == name] == _engine_script(name, "clawr1_weights", "3", session=True,
                                                                         pause="retract")
    paths = [e[2] if e[0] == "http" else "broadcast" for e in log.events]
    first_bcast, last_bcast = paths.index("broadcast"), len(paths) - 1 - paths[::-1].index("broadcast")
    assert paths[:first_bcast].count("/pause_generation") == 2  # both paused and flushed before any weight moves
    assert paths[:first_bcast].count("/flush_cache") == 2
    assert paths[last_bcast:].count("/continue_generation") == 2


# ================================================================ one bucket on the device at a time (NcclSink)


class Staging:
    """Stands in for the copy to the GPU: counts the bytes of staged copies still alive."""

    def __init__(self, log: Log):
        self.log, self.live, self.peak = log, 0, 0

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        copy = t.clone()
        nbytes = copy.numel() * copy.element_size()
        self.live += nbytes
        self.peak = max(self.peak, self.live)
        weakref.finalize(copy, self._freed, nbytes)
        return copy

    def _freed(self, nbytes: int) -> None:
        self.live -= nbytes


def test_push_draws_stages_and_sends_one_bucket_at_a_time(fleet):
    log, wire, (a, b) = fleet(2)
    staging = Staging(log)

    def draw():
        for name, t in _tensors():
            log.add("draw", name)
            yield name, t

    live_at_broadcast = []

    def broadcast(t):
        live_at_broadcast.append(staging.live)
        wire.broadcast(t)

    with DistributedWeightSync([a.url, b.url], bucket_bytes=16, broadcast=broadcast, stage=staging,
                               retry_interval_s=0.01) as sync:
        sync.connect("127.0.0.1", 29500, [1, 1])
        log.events.clear()
        sync.push(draw, 6)  # read once per engine
    draws_and_sends = [(e[0], e[1] if e[0] == "draw" else e[2]) for e in log.events if e[0] in ("draw", "broadcast")]
    one_pass = [("draw", "w0"), ("draw", "w1"), ("draw", "w2"), ("broadcast", "w0"), ("broadcast", "w1"),
                ("draw", "w3"), ("broadcast", "w2"), ("broadcast", "w3")]
    assert draws_and_sends == one_pass + one_pass  # engine A's pass, then engine B's
    # bytes staged while each tensor goes out: w0+w1 (8 + 8), w2 alone (12), w3 alone (32 > the 16-byte bucket)
    assert live_at_broadcast == [16, 16, 12, 32] * 2
    assert staging.peak == 32 and staging.live == 0


def test_a_mapping_or_a_one_shot_iterator_reaches_every_engine(fleet):
    log, wire, (a, b) = fleet(2)
    with _sync([a.url, b.url], wire) as sync:
        sync.connect("127.0.0.1", 29500, [1, 1])
        for source in (dict(_tensors()), iter(_tensors())):
            log.events.clear()
            sync.push(source, 8)
            sent = [(e[1], e[2]) for e in log.events if e[0] == "broadcast"]
            assert sent == [(n, w) for n in "AB" for w in ("w0", "w1", "w2", "w3")]


# ================================================================ the disk path: SyncEngineClient


@pytest.mark.parametrize("version, pause", [(SGLANG_0_5_15, "abort"), (SGLANG_0_5_23, "retract")])
def test_disk_update_pauses_flushes_loads_and_continues(fleet, version, pause):
    """Without the pause, SGLang's /update_weights_from_disk waits for every running generation (writer lock)."""
    log, _, (a,) = fleet(1, A={"version": version, "running": 2, "busy_flushes": 1})
    client = SyncEngineClient(a.url, retry_interval_s=0.01)
    try:
        client.update_weights_from_disk("/w/v000003", 3)
        client.update_weights_from_disk("/w/v000004", 4)
    finally:
        client.close()

    def script(v, refusals):
        return [("http", "A", "/pause_generation", {"mode": pause}),
                *[("http", "A", "/flush_cache", 400)] * refusals, ("http", "A", "/flush_cache", 200),
                ("http", "A", "/update_weights_from_disk", {"model_path": f"/w/v00000{v}", "weight_version": v,
                                                            "flush_cache": False}),
                ("http", "A", "/continue_generation", {})]

    assert log.events == [("http", "A", "/server_info", None)] + script("3", 1) + script("4", 0)
    assert (a.weight_version, a.running, a.paused) == ("4", 0 if pause == "abort" else 2, False)


def test_a_failed_disk_load_is_reported_and_the_engine_serves_again(fleet):
    log, _, (a,) = fleet(1, A={"fail_disk": True})
    client = SyncEngineClient(a.url, retry_interval_s=0.01)
    try:
        with pytest.raises(EngineError, match="update_weights_from_disk failed with HTTP 400: .*Rolling back"):
            client.update_weights_from_disk("/w/v000009", 9)
    finally:
        client.close()
    assert [e[2] for e in log.events] == ["/server_info", "/pause_generation", "/flush_cache",
                                          "/update_weights_from_disk", "/continue_generation"]
    assert not a.paused


@pytest.mark.parametrize("old", [False, True])
def test_model_info_prefers_model_info_and_remembers_a_404(fleet, old):
    log, _, (a,) = fleet(1, A={"old_model_info": old})
    client = SyncEngineClient(a.url)
    try:
        assert [client.weight_version(), client.weight_version()] == [0, 0]  # "default" before any update
    finally:
        client.close()

    async def twice():
        engine = EngineClient(a.url)
        try:
            return [(await engine.model_info())["weight_version"] for _ in range(2)]
        finally:
            await engine.close()

    assert asyncio.run(twice()) == ["default", "default"]
    asked = [e[2] for e in log.events]
    per_client = ["/model_info", "/get_model_info", "/get_model_info"] if old else ["/model_info", "/model_info"]
    assert asked == per_client * 2


# ================================================================ real groups over gloo: rank 0 vs an engine's join

# Plays engines (tp_size 1) in one process, one per entry of the JSON list in argv[1] ({"version": ...,
# "refuse": message to answer /update_weights_from_distributed with, never joining its broadcast,
# "refuse_from": the first update call refused, counting from 0}).
# On /init_weights_update_group each joins the group as an SGLang engine does: rendezvous at
# tcp://master, the store scoped by the group name, then torch's own group helper; on
# /update_weights_from_distributed it receives one broadcast per name. GET /state tells what it saw.
ENGINES_SCRIPT = r'''
import json, sys, threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
import torch, torch.distributed as dist
from torch.distributed.distributed_c10d import _new_process_group_helper, _world
from torch.distributed.rendezvous import rendezvous

TIMEOUT = timedelta(seconds=60)
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # engines have a default group

def join(p):
    store, rank, world = next(rendezvous(f"tcp://{p['master_address']}:{p['master_port']}", p["rank_offset"],
                                         p["world_size"], timeout=TIMEOUT))
    store.set_timeout(TIMEOUT)
    pg, _ = _new_process_group_helper(world, rank, [], dist.Backend(p["backend"]),
                                      dist.PrefixStore(p["group_name"], store), group_name=p["group_name"],
                                      timeout=TIMEOUT)
    _world.pg_group_ranks[pg] = {i: i for i in range(world)}
    return pg

class Engine:
    def __init__(self, version, refuse=None, refuse_from=0):
        self.version, self.refuse, self.refuse_from = version, refuse, refuse_from
        self.groups, self.calls, self.weights, self.updates = {}, [], {}, 0

    def handle(self, path, body):
        self.calls.append(path)
        if path == "/server_info":
            return 200, {"version": self.version}
        if path == "/flush_cache":
            return 200, "Cache flushed.\n"
        if path == "/init_weights_update_group":
            self.groups[body["group_name"]] = join(body)
        elif path == "/update_weights_from_distributed":
            self.updates += 1
            if self.refuse and self.updates > self.refuse_from:
                return 400, {"success": False, "message": self.refuse}
            for name, dtype, shape in zip(body["names"], body["dtypes"], body["shapes"]):
                t = torch.empty(shape, dtype=getattr(torch, dtype))
                dist.broadcast(t, src=0, group=self.groups[body["group_name"]])
                self.weights[name] = [dtype, t.float().flatten().tolist()]
        elif path == "/destroy_weights_update_group":
            dist.destroy_process_group(self.groups.pop(body["group_name"]))
        if path in ("/pause_generation", "/continue_generation"):
            return 200, {"message": "ok", "status": "ok"}
        return 200, {"success": True, "message": "ok"}

def serve(engine):
    class Handler(BaseHTTPRequestHandler):
        def reply(self, status, obj):
            data = obj.encode() if isinstance(obj, str) else json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        def do_POST(self):
            self.reply(*engine.handle(self.path, json.loads(self.rfile.read(int(self.headers["Content-Length"])))))
        def do_GET(self):
            if self.path == "/state":
                self.reply(200, {"calls": engine.calls, "weights": engine.weights})
            else:
                self.reply(*engine.handle(self.path, None))
        def log_message(self, *a):
            pass
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server.server_address[1]

print(json.dumps([serve(Engine(**spec)) for spec in json.loads(sys.argv[1])]), flush=True)
sys.stdin.read()  # until the test closes our stdin
'''


class GlooEngines:
    """Engine stand-ins in a subprocess (ENGINES_SCRIPT); `stop()` ends them."""

    def __init__(self, script: Path):
        self.script, self.procs = script, []

    def __call__(self, *specs: dict) -> list[str]:
        proc = subprocess.Popen([PY, str(self.script), json.dumps(list(specs))], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True, start_new_session=True)
        self.procs.append(proc)
        return [f"http://127.0.0.1:{p}" for p in json.loads(proc.stdout.readline())]

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.stdin.close()
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()


@pytest.fixture
def gloo_engines(tmp_path):
    script = tmp_path / "engines.py"
    script.write_text(ENGINES_SCRIPT)
    engines = GlooEngines(script)
    yield engines
    engines.stop()


NAMED = [("embed", torch.arange(6, dtype=torch.float32).reshape(2, 3)),
         ("norm", torch.tensor([0.5, -1.25], dtype=torch.bfloat16)),
         ("head", torch.linspace(-1, 1, 10))]


def test_rank_zero_group_interoperates_with_an_engines_join(gloo_engines):
    urls = gloo_engines({"version": SGLANG_0_5_23}, {"version": SGLANG_0_5_15})
    with DistributedWeightSync(urls, backend="gloo", bucket_bytes=32, timeout_s=60) as sync:
        sync.connect("127.0.0.1", 0, [1, 1])
        sync.push(NAMED, 9)
        sync.push([(n, t * 2) for n, t in NAMED], 10)
        sync.disconnect()
    for url, session in zip(urls, (True, False)):
        state = httpx.get(f"{url}/state", timeout=10).json()
        assert state["weights"] == {n: [dtype_name(t.dtype), (t * 2).float().flatten().tolist()] for n, t in NAMED}
        push = ["/pause_generation", *(["/begin_weight_update"] if session else []), "/flush_cache",
                "/update_weights_from_distributed", "/update_weights_from_distributed",
                *(["/end_weight_update"] if session else []), "/continue_generation"]
        assert state["calls"] == ["/server_info", "/init_weights_update_group", *push, *push,
                                  "/destroy_weights_update_group"]


def test_an_engine_that_refuses_and_never_joins_fails_the_push_within_the_bound(gloo_engines):
    """Rank 0's gloo broadcast would wait for the refusing engine until the group's timeout (60 s here)."""
    refusal = "Failed to receive weights: shape mismatch"
    urls = gloo_engines({"version": SGLANG_0_5_23}, {"version": SGLANG_0_5_23, "refuse": refusal})
    with DistributedWeightSync(urls, backend="gloo", bucket_bytes=32, timeout_s=60, refusal_grace_s=1.0) as sync:
        sync.connect("127.0.0.1", 0, [1, 1])
        t0 = time.monotonic()
        with pytest.raises(WeightSyncError, match=f"engine {urls[1]}: /update_weights_from_distributed answered "
                                                  f"HTTP 400: .*{refusal}"):
            sync.push(NAMED, 9)
        elapsed = time.monotonic() - t0
        assert elapsed < 30, elapsed  # the 1 s refusal grace, not the group's 60 s timeout
        stuck = [t for t in threading.enumerate() if t.name == BROADCAST_THREAD]
        for t in stuck:
            t.join(timeout=5)
        assert not any(t.is_alive() for t in stuck)
        t0 = time.monotonic()
        with pytest.raises(WeightSyncError, match="weight-update group clawr1_weights-1 was abandoned"):
            sync.push(NAMED, 10)  # the first engine is updated again; the second's group is gone
        assert time.monotonic() - t0 < 10
        first, second = (httpx.get(f"{u}/state", timeout=10).json() for u in urls)
        gloo_engines.stop()  # gloo keeps the abandoned broadcast until its peer goes (or its timeout)
    assert first["weights"] == {n: [dtype_name(t.dtype), t.float().flatten().tolist()] for n, t in NAMED}
    assert first["calls"].count("/continue_generation") == 2
    assert second["weights"] == {} and second["calls"][-1] == "/update_weights_from_distributed"
    assert "/continue_generation" not in second["calls"]  # left paused: its weights are in doubt


# ================================================================ SGLangServer with a stand-in server

# Stands in for `python -m sglang.launch_server`: serves GET /health_generate on --port (503 for the
# first --unhealthy-for seconds), starts a worker in its own process group as SGLang does, and records
# its pid, the worker's pid and its argv in --pid-file. Unknown flags are ignored.
FAKE_SERVER = r'''
import argparse, json, os, signal, subprocess, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ap = argparse.ArgumentParser()
ap.add_argument("--port", type=int, required=True)
ap.add_argument("--pid-file", required=True)
ap.add_argument("--unhealthy-for", type=float, default=0.0)
ap.add_argument("--ignore-term", action="store_true")
args, _ = ap.parse_known_args()
ignore = "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); " if args.ignore_term else ""
if args.ignore_term:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
worker = subprocess.Popen([sys.executable, "-c", ignore + "import time; time.sleep(600)"])
tmp = args.pid_file + ".tmp"
with open(tmp, "w") as f:
    json.dump({"pid": os.getpid(), "worker": worker.pid, "argv": sys.argv[1:]}, f)
os.replace(tmp, args.pid_file)
started = time.monotonic()

class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        ok = self.path == "/health_generate" and time.monotonic() - started >= args.unhealthy_for
        self.send_response(200 if ok else 503)
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *a):
        pass

print("fake sglang listening on", args.port, flush=True)
ThreadingHTTPServer(("127.0.0.1", args.port), Handler).serve_forever()
'''


@pytest.fixture
def fake_server(tmp_path):
    """fake_server(*flags) -> (SGLangServer, pid_file); every server is stopped afterwards."""
    script = tmp_path / "fake_sglang.py"
    script.write_text(FAKE_SERVER)
    made: list[SGLangServer] = []

    def make(*flags: str, log_name: str = "server.log"):
        port = free_port()
        pid_file = tmp_path / f"pids-{port}.json"
        cmd = [PY, str(script), "--port", str(port), "--pid-file", str(pid_file), *flags]
        server = SGLangServer(Config(), "unused", port, tmp_path / log_name, command=cmd)
        made.append(server)
        return server, pid_file

    yield make
    for s in made:
        s.stop(timeout_s=2)


def _pids(pid_file: Path) -> tuple[int, int]:
    deadline = time.monotonic() + 30
    while not pid_file.exists():
        assert time.monotonic() < deadline, "the fake server never wrote its pids"
        time.sleep(0.05)
    info = json.loads(pid_file.read_text())
    return info["pid"], info["worker"]


def test_server_waits_healthy_then_stops_its_whole_group(fake_server):
    server, pid_file = fake_server("--unhealthy-for", "1.0")
    with server:
        t0 = time.monotonic()
        server.wait_healthy(timeout_s=30, poll_s=0.1)
        assert time.monotonic() - t0 >= 0.9  # it polled through the 503s
        leader, worker = _pids(pid_file)
        assert server.pid == leader and os.getpgid(worker) == leader
    assert server.returncode == -signal.SIGTERM
    assert not pid_alive(leader) and not pid_alive(worker)
    assert "fake sglang listening" in server.log_path.read_text()


def test_stop_escalates_to_sigkill(fake_server):
    server, pid_file = fake_server("--ignore-term")
    server.start()
    server.wait_healthy(timeout_s=30, poll_s=0.1)
    leader, worker = _pids(pid_file)
    t0 = time.monotonic()
    assert server.stop(timeout_s=0.5) == -signal.SIGKILL
    assert time.monotonic() - t0 < 5
    assert not pid_alive(leader) and not pid_alive(worker)


def test_early_exit_names_the_log(tmp_path):
    log_path = tmp_path / "logs" / "sglang.log"
    cmd = [PY, "-c", "import sys; print('RuntimeError: CUDA out of memory'); sys.exit(3)"]
    with SGLangServer(Config(), "unused", free_port(), log_path, command=cmd) as server:
        with pytest.raises(SGLangStartError) as err:
            server.wait_healthy(timeout_s=30)
    msg = str(err.value)
    assert "exited with code 3" in msg and str(log_path) in msg and "CUDA out of memory" in msg


def test_timeout_names_the_log(fake_server):
    server, _ = fake_server("--unhealthy-for", "600", log_name="slow.log")
    with server:
        with pytest.raises(SGLangStartError, match=r"not healthy after 1s; see .*slow\.log"):
            server.wait_healthy(timeout_s=1, poll_s=0.1)


def test_serve_sglang_without_sglang_says_how_to_install(tmp_path):
    """SGLang lives in its own environment (serve.sglang.python); one where it does not import is named."""
    cfg = load_config(None, ["serve.backend=sglang", "serve.port=30000", f"run.dir={tmp_path}",
                             f"serve.sglang.python={sys.executable}"])
    with pytest.raises(SystemExit, match=r"SGLang does not import with .*python.*set serve\.sglang\.python"):
        serve_sglang(cfg, "m")
    assert launch_command(cfg, "m", 30000)[0] == sys.executable


def test_serve_sglang_runs_launch_server_and_stops_on_sigterm(tmp_path):
    """`serve_sglang` with a fake `sglang` package: exact argv, health, SIGTERM stops the server's group."""
    package = tmp_path / "fake" / "sglang"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "launch_server.py").write_text(FAKE_SERVER)
    port, pid_file = free_port(), tmp_path / "pids.json"
    overrides = ["serve.backend=sglang", f"serve.port={port}", f"run.dir={tmp_path / 'run'}",
                 f"serve.sglang.extra_args=[--pid-file, '{pid_file}']"]
    code = ("import sys; from clawr1.config import ConfigError, load_config; from clawr1.serving.sglang import serve_sglang; "
            "sys.exit(serve_sglang(load_config(None, sys.argv[1:]), 'org/model'))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "fake"), str(REPO)])}
    proc = subprocess.Popen([PY, "-c", code, *overrides], cwd=REPO, env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        leader, worker = _pids(pid_file)
        deadline = time.monotonic() + 30
        while not _healthy(f"http://127.0.0.1:{port}/health_generate"):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        time.sleep(0.5)  # let serve_sglang's own health check pass and block on the server
        argv = json.loads(pid_file.read_text())["argv"]
        assert argv == launch_command(load_config(None, overrides), "org/model", port)[3:]
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM, proc.stdout.read().decode()
        assert not pid_alive(leader) and not pid_alive(worker)
        assert "fake sglang listening" in (tmp_path / "run" / "logs" / f"sglang-{port}.log").read_text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if pid_file.exists():
            for pid in _pids(pid_file):
                if pid_alive(pid):
                    os.kill(pid, signal.SIGKILL)


def _healthy(url: str) -> bool:
    """The fake server writes its pid file before it listens: refused connections mean not yet."""
    try:
        return httpx.get(url, timeout=5).status_code == 200
    except httpx.ConnectError:
        return False
