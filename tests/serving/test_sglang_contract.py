"""Contract tests for the SGLang backend: the exact flags, JSON and call order we use with SGLang.

SGLang cannot run here (no GPU), so the other side is played by stand-ins that answer as
docs/sglang_api_notes.md says SGLang does: HTTP servers on loopback, a fake broadcast that
completes only once an engine posted the matching receive (as an NCCL broadcast would), a
subprocess that joins weight-update groups the way an engine does (torch's own group helper,
over gloo), and a fake `sglang.launch_server`.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
import torch

from clawr1.config import Config, free_port, load_config
from clawr1.serving.client import Generation, parse_generation
from clawr1.serving.sglang import SGLangServer, SGLangStartError, launch_command, serve_sglang
from clawr1.serving.weight_sync import (
    DistributedWeightSync, WeightSyncError, begin_weight_update_payload, buckets, continue_payload,
    destroy_group_payload, dtype_name, end_weight_update_payload, init_group_payload, pause_payload, rank_offsets,
    update_from_distributed_payload, update_from_tensor_payload,
)
from tests.conftest import REPO, pid_alive

PY = sys.executable


# ================================================================ launch_command


def test_launch_command_with_every_option():
    cfg = load_config(None, [
        "serve.host=0.0.0.0", "serve.sglang.tp_size=2", "serve.sglang.mem_fraction_static=0.85",
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
    assert launch_command(Config(), "Qwen/Qwen2.5-0.5B-Instruct", 30000) == [
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


def test_launch_command_without_tool_parser():
    cmd = launch_command(load_config(None, ["serve.sglang.tool_call_parser="]), "m", 30000)
    assert "--tool-call-parser" not in cmd


@pytest.mark.parametrize("override, args, match", [
    ("serve.sglang.tp_size=0", {}, r"serve\.sglang\.tp_size must be >= 1, got 0"),
    ("serve.sglang.mem_fraction_static=1.0", {}, r"mem_fraction_static must be 0 .* or in \(0, 1\), got 1\.0"),
    ("serve.sglang.mem_fraction_static=-0.5", {}, r"mem_fraction_static .* got -0\.5"),
    ("serve.sglang.context_length=-1", {}, r"context_length must be >= 0"),
    ("serve.sglang.dtype=fp8", {}, r"dtype must be one of auto, half, float16, bfloat16, float, float32, got 'fp8'"),
    ("serve.sglang.extra_args=[--port, '1']", {}, r"extra_args sets --port"),
    ("serve.sglang.extra_args=[--tp-size=4]", {}, r"extra_args sets --tp-size"),
    ("run.seed=0", {"port": 0}, r"port must be in 1\.\.65535, got 0"),
    ("run.seed=0", {"model_path": ""}, r"model_path is empty"),
    ("run.seed=0", {"weight_version": -1}, r"weight_version must be >= 0"),
])
def test_launch_command_rejects_bad_values(override, args, match):
    call = {"model_path": "m", "port": 30000, **args}
    with pytest.raises(ValueError, match=match):
        launch_command(load_config(None, [override]), **call)


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
    assert pause_payload() == {"mode": "in_place"}
    assert pause_payload("abort") == {"mode": "abort"}
    assert pause_payload("retract") == {"mode": "retract"}
    with pytest.raises(ValueError, match="pause mode must be one of abort, retract, in_place"):
        pause_payload("soft")
    assert continue_payload() == {}
    assert destroy_group_payload("clawr1_weights-1") == {"group_name": "clawr1_weights-1"}
    assert begin_weight_update_payload() == {"selector": "all"}
    assert end_weight_update_payload() == {}


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
    and answer only after every tensor arrived. A refusal makes the pending broadcast fail, as
    an NCCL collective with a missing peer eventually does.
    """

    def __init__(self, log: Log, group_size: int = 1):
        self.log, self.group_size = log, group_size
        self.pending: dict[str, list[str]] = {}
        self.refused = False

    def receive(self, engine: str, names: list[str], timeout: float = 10.0) -> bool:
        with self.log.cond:
            self.pending[engine] = list(names)
            self.log.cond.notify_all()
            return self.log.cond.wait_for(lambda: not self.pending[engine], timeout)

    def refuse(self) -> None:
        with self.log.cond:
            self.refused = True
            self.log.cond.notify_all()

    def broadcast(self, tensor: torch.Tensor) -> None:
        with self.log.cond:
            ready = lambda: self.refused or sum(1 for v in self.pending.values() if v) >= self.group_size  # noqa: E731
            if not self.log.cond.wait_for(ready, 10.0):
                raise TimeoutError("no engine posted a receive")
            if self.refused:
                raise RuntimeError("broadcast failed: a peer left the group")
            for engine in sorted(e for e, names in self.pending.items() if names):
                self.log.events.append(("broadcast", engine, self.pending[engine].pop(0), tensor.flatten()[0].item()))
            self.log.cond.notify_all()


class FakeEngine:
    """An HTTP server answering SGLang's control endpoints as docs/sglang_api_notes.md §6 describes."""

    def __init__(self, name: str, log: Log, wire: Wire, *, require_session: bool = True,
                 fail_update: bool = False, fail_init: bool = False):
        self.name, self.log, self.wire = name, log, wire
        self.require_session, self.fail_update, self.fail_init = require_session, fail_update, fail_init
        self.in_session = False
        engine = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                status, reply = engine.answer(self.path, body)
                data = json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def answer(self, path: str, body: dict) -> tuple[int, dict]:
        self.log.add("http", self.name, path, body)
        ok = {"success": True, "message": "Succeeded."}
        if path == "/pause_generation":
            return 200, {"message": "Generation paused successfully.", "status": "ok"}
        if path == "/continue_generation":
            return 200, {"message": "Generation continued successfully.", "status": "ok"}
        if path == "/init_weights_update_group":
            if self.fail_init:
                return 400, {"success": False, "message": "Failed to initialize custom process group: timed out."}
            return 200, ok
        if path == "/begin_weight_update":
            self.in_session = True
            return 200, ok
        if path == "/end_weight_update":
            self.in_session = False
            return 200, ok
        if path == "/update_weights_from_distributed":
            return self._update(body)
        if path == "/destroy_weights_update_group":
            return 200, ok
        return 404, {"detail": "Not Found"}

    def _update(self, body: dict) -> tuple[int, dict]:
        if self.require_session and not self.in_session:
            self.wire.refuse()
            return 400, {"success": False, "message": "update_weights_from_distributed must run between "
                                                      "begin_weight_update() and end_weight_update()"}
        if self.fail_update:
            self.wire.refuse()
            return 400, {"success": False, "message": "Failed to update parameter online: shape mismatch."}
        if not self.wire.receive(self.name, body["names"]):
            return 400, {"success": False, "message": "broadcast timed out"}
        return 200, {"success": True, "message": "Succeeded to update parameter online. "
                                                 f"Weight version updated to {body['weight_version']}."}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fleet():
    """fleet(n, group_size=1, **engine_kw) -> (log, wire, engines); all servers closed afterwards."""
    made: list[FakeEngine] = []

    def make(n: int, group_size: int = 1, **kw):
        log = Log()
        wire = Wire(log, group_size)
        engines = [FakeEngine(chr(ord("A") + i), log, wire, **kw.get(chr(ord("A") + i), {})) for i in range(n)]
        made.extend(engines)
        return log, wire, engines

    yield make
    for e in made:
        e.close()


def _tensors():
    """w0 + w1 fill a 16-byte bucket, w2 gets the next one, w3 (32 B) is too big for any; values identify them."""
    return [("w0", torch.full((2,), 0.0)), ("w1", torch.full((4,), 1.0, dtype=torch.bfloat16)),
            ("w2", torch.full((3,), 2.0)), ("w3", torch.full((8,), 3.0))]


def _engine_script(name: str, group: str, version: str, session: bool) -> list[tuple]:
    """The exact calls and broadcasts one engine must see for _tensors() in buckets of 16 bytes."""
    def update(names, dtypes, shapes):
        return ("http", name, "/update_weights_from_distributed",
                {"names": names, "dtypes": dtypes, "shapes": shapes, "group_name": group,
                 "weight_version": version, "flush_cache": False})

    def bcast(w):
        return ("broadcast", name, w, float(w[1]))

    return [
        ("http", name, "/pause_generation", {"mode": "in_place"}),
        *([("http", name, "/begin_weight_update", {"selector": "all"})] if session else []),
        update(["w0", "w1"], ["float32", "bfloat16"], [[2], [4]]), bcast("w0"), bcast("w1"),
        update(["w2"], ["float32"], [[3]]), bcast("w2"),
        update(["w3"], ["float32"], [[8]]), bcast("w3"),
        *([("http", name, "/end_weight_update", {})] if session else []),
        ("http", name, "/continue_generation", {}),
    ]


def test_connect_posts_one_group_per_engine(fleet):
    log, wire, (a, b) = fleet(2)
    with DistributedWeightSync([a.url, b.url], broadcast=wire.broadcast) as sync:
        sync.connect("10.0.0.1", 29500, [2, 1])
    assert sorted(log.events, key=lambda e: e[1]) == [
        ("http", "A", "/init_weights_update_group", {"master_address": "10.0.0.1", "master_port": 29500,
         "rank_offset": 1, "world_size": 3, "group_name": "clawr1_weights-0", "backend": "nccl"}),
        ("http", "B", "/init_weights_update_group", {"master_address": "10.0.0.1", "master_port": 29500,
         "rank_offset": 1, "world_size": 2, "group_name": "clawr1_weights-1", "backend": "nccl"}),
    ]


def test_connect_shared_group_uses_slime_rank_layout(fleet):
    log, wire, engines = fleet(3)
    with DistributedWeightSync([e.url for e in engines], rolling=False, group_name="g", broadcast=wire.broadcast) as s:
        s.connect("trainer-0", 29501, [2, 4, 1])
    got = {e[1]: (e[3]["rank_offset"], e[3]["world_size"], e[3]["group_name"]) for e in log.events}
    assert got == {"A": (1, 8, "g"), "B": (3, 8, "g"), "C": (7, 8, "g")}


def test_push_updates_engines_one_at_a_time_in_exact_order(fleet):
    log, wire, (a, b) = fleet(2)
    with DistributedWeightSync([a.url, b.url], bucket_bytes=16, weight_update_session=True,
                               broadcast=wire.broadcast) as sync:
        sync.connect("127.0.0.1", 29500, [1, 1])
        log.events.clear()
        sync.push(_tensors(), 7)
    # the whole sequence of engine A, then the whole sequence of engine B: B is untouched until A continues
    assert log.events == _engine_script("A", "clawr1_weights-0", "7", True) + \
        _engine_script("B", "clawr1_weights-1", "7", True)


def test_push_without_session_for_sglang_0_5_15(fleet):
    log, wire, (a,) = fleet(1, A={"require_session": False})
    with DistributedWeightSync([a.url], bucket_bytes=16, broadcast=wire.broadcast) as sync:
        sync.connect("127.0.0.1", 29500, [1])
        log.events.clear()
        sync.push(_tensors(), 2)
    assert log.events == _engine_script("A", "clawr1_weights-0", "2", False)


def test_push_shared_group_updates_all_engines_together(fleet):
    log, wire, (a, b) = fleet(2, group_size=2)
    with DistributedWeightSync([a.url, b.url], bucket_bytes=16, weight_update_session=True, rolling=False,
                               broadcast=wire.broadcast) as sync:
        sync.connect("127.0.0.1", 29500, [1, 1])
        log.events.clear()
        sync.push(_tensors(), 3)
    for name in "AB":
        assert [e for e in log.events if e[1] == name] == _engine_script(name, "clawr1_weights", "3", True)
    paths = [e[2] if e[0] == "http" else "broadcast" for e in log.events]
    first_bcast, last_bcast = paths.index("broadcast"), len(paths) - 1 - paths[::-1].index("broadcast")
    assert paths[:first_bcast].count("/pause_generation") == 2  # both paused before any weight moves
    assert paths[last_bcast:].count("/continue_generation") == 2


def test_refusal_names_the_engine_and_leaves_it_paused(fleet):
    log, wire, (a, b) = fleet(2, B={"fail_update": True})
    with DistributedWeightSync([a.url, b.url], bucket_bytes=16, weight_update_session=True,
                               broadcast=wire.broadcast) as sync:
        sync.connect("127.0.0.1", 29500, [1, 1])
        log.events.clear()
        with pytest.raises(WeightSyncError) as err:
            sync.push(_tensors(), 4)
    msg = str(err.value)
    assert b.url in msg and "/update_weights_from_distributed" in msg and "HTTP 400" in msg
    assert "Failed to update parameter online: shape mismatch." in msg
    assert [e for e in log.events if e[1] == "A"] == _engine_script("A", "clawr1_weights-0", "4", True)
    assert [e[2] for e in log.events if e[1] == "B"] == [
        "/pause_generation", "/begin_weight_update", "/update_weights_from_distributed"]  # no continue


def test_missing_session_on_sglang_0_5_23_is_a_clear_error(fleet):
    log, wire, (a,) = fleet(1)
    with DistributedWeightSync([a.url], broadcast=wire.broadcast) as sync:
        sync.connect("127.0.0.1", 29500, [1])
        with pytest.raises(WeightSyncError, match="must run between begin_weight_update"):
            sync.push(_tensors(), 1)


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


# ================================================================ real groups over gloo: rank 0 vs an engine's join

# Plays two engines (tp_size 1) in one process. On /init_weights_update_group each joins the group as
# an SGLang engine does: rendezvous at tcp://master, the store scoped by the group name, then torch's
# own group helper; on /update_weights_from_distributed it receives one broadcast per name.
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
    def __init__(self):
        self.groups, self.calls, self.weights = {}, [], {}

    def handle(self, path, body):
        self.calls.append(path)
        if path == "/init_weights_update_group":
            self.groups[body["group_name"]] = join(body)
        elif path == "/update_weights_from_distributed":
            for name, dtype, shape in zip(body["names"], body["dtypes"], body["shapes"]):
                t = torch.empty(shape, dtype=getattr(torch, dtype))
                dist.broadcast(t, src=0, group=self.groups[body["group_name"]])
                self.weights[name] = [dtype, t.float().flatten().tolist()]
        elif path == "/destroy_weights_update_group":
            dist.destroy_process_group(self.groups.pop(body["group_name"]))
        if path in ("/pause_generation", "/continue_generation"):
            return {"message": "ok", "status": "ok"}
        return {"success": True, "message": "ok"}

def serve(engine):
    class Handler(BaseHTTPRequestHandler):
        def reply(self, obj):
            data = json.dumps(obj).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        def do_POST(self):
            self.reply(engine.handle(self.path, json.loads(self.rfile.read(int(self.headers["Content-Length"])))))
        def do_GET(self):
            self.reply({"calls": engine.calls, "weights": engine.weights})
        def log_message(self, *a):
            pass
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server.server_address[1]

print(json.dumps([serve(Engine()), serve(Engine())]), flush=True)
sys.stdin.read()  # until the test closes our stdin
'''


def test_rank_zero_group_interoperates_with_an_engines_join(tmp_path):
    script = tmp_path / "engines.py"
    script.write_text(ENGINES_SCRIPT)
    proc = subprocess.Popen([PY, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        urls = [f"http://127.0.0.1:{p}" for p in json.loads(proc.stdout.readline())]
        named = [("embed", torch.arange(6, dtype=torch.float32).reshape(2, 3)),
                 ("norm", torch.tensor([0.5, -1.25], dtype=torch.bfloat16)),
                 ("head", torch.linspace(-1, 1, 10))]
        with DistributedWeightSync(urls, backend="gloo", bucket_bytes=32, weight_update_session=True,
                                   timeout_s=60) as sync:
            sync.connect("127.0.0.1", 0, [1, 1])
            sync.push(named, 9)
            sync.push([(n, t * 2) for n, t in named], 10)
            sync.disconnect()
        for url in urls:
            state = httpx.get(url, timeout=10).json()
            assert state["weights"] == {n: [dtype_name(t.dtype), (t * 2).float().flatten().tolist()] for n, t in named}
            push = ["/pause_generation", "/begin_weight_update", "/update_weights_from_distributed",
                    "/update_weights_from_distributed", "/end_weight_update", "/continue_generation"]
            assert state["calls"] == ["/init_weights_update_group", *push, *push, "/destroy_weights_update_group"]
    finally:
        proc.stdin.close()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


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


def test_serve_sglang_without_sglang_says_how_to_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "sglang", None)  # makes `import sglang` fail
    cfg = load_config(None, ["serve.backend=sglang", "serve.port=30000", f"run.dir={tmp_path}"])
    with pytest.raises(SystemExit, match=r"SGLang is not installed.*pip install -e \.\[gpu\]"):
        serve_sglang(cfg, "m")


def test_serve_sglang_runs_launch_server_and_stops_on_sigterm(tmp_path):
    """`serve_sglang` with a fake `sglang` package: exact argv, health, SIGTERM stops the server's group."""
    package = tmp_path / "fake" / "sglang"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "launch_server.py").write_text(FAKE_SERVER)
    port, pid_file = free_port(), tmp_path / "pids.json"
    overrides = ["serve.backend=sglang", f"serve.port={port}", f"run.dir={tmp_path / 'run'}",
                 f"serve.sglang.extra_args=[--pid-file, '{pid_file}']"]
    code = ("import sys; from clawr1.config import load_config; from clawr1.serving.sglang import serve_sglang; "
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
        assert "fake sglang listening" in (tmp_path / "run" / "logs" / "sglang-server.log").read_text()
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
