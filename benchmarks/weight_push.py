"""Weights to an engine on another node: raw safetensors bytes streamed over HTTP vs base64 inside JSON.

One embedded engine serves the tiny model; the tiny model's full state is pushed into its
/update_weights_from_tensor `--pushes` times by each path, alternating, each time from the state
dict in the trainer's memory to the engine's answer (serialize, encode, send, decode, load):

- raw: `Content-Type: application/octet-stream`, the safetensors file as the body in 1 MiB chunks,
  the version in the query string (trainer.weight_sync=http);
- json: SGLang's shape, `serialized_named_tensors: [base64 of the safetensors file]`.

Prints one JSON line: payload sizes, median and p90 seconds per push of each path, and raw's
speed-up over json (at least 1.0 is the goal). Also the median of the trainer's whole update
(pause, flush, push, continue) through SyncEngineClient.

Usage: python benchmarks/weight_push.py [--pushes 20]
"""
from __future__ import annotations

import argparse
import base64
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from clawr1.config import ModelConfig  # noqa: E402
from clawr1.devtools import LoopProcess, local_config  # noqa: E402
from clawr1.engine_api.client import SyncEngineClient  # noqa: E402
from clawr1.model_path import resolve_model_path  # noqa: E402
from clawr1.trainer.hf_io import load_hf_state  # noqa: E402

CHUNK = 1 << 20


def chunks(payload: bytes) -> Iterator[bytes]:
    view = memoryview(payload)
    for start in range(0, len(view), CHUNK):
        yield bytes(view[start:start + CHUNK])


def push_raw(http: httpx.Client, state: dict, version: int) -> int:
    from safetensors.torch import save

    payload = save(state, metadata={"format": "pt"})
    reply = http.post("/update_weights_from_tensor", content=chunks(payload), params={"weight_version": str(version)},
                      headers={"Content-Type": "application/octet-stream"})
    assert reply.status_code == 200 and reply.json()["success"], reply.text
    return len(payload)


def push_json(http: httpx.Client, state: dict, version: int) -> int:
    from safetensors.torch import save

    body = json.dumps({"serialized_named_tensors": [base64.b64encode(save(state, metadata={"format": "pt"})).decode()],
                       "load_format": "safetensors", "weight_version": str(version)}).encode()
    reply = http.post("/update_weights_from_tensor", content=body, headers={"Content-Type": "application/json"})
    assert reply.status_code == 200 and reply.json()["success"], reply.text
    return len(body)


def timed(push: Callable[[], int]) -> tuple[float, int]:
    t0 = time.perf_counter()
    size = push()
    return time.perf_counter() - t0, size


def summary(times: list[float]) -> dict:
    ordered = sorted(times)
    return {"median_s": round(statistics.median(ordered), 4), "p90_s": round(ordered[int(0.9 * (len(ordered) - 1))], 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pushes", type=int, default=20)
    args = parser.parse_args()
    state = load_hf_state(resolve_model_path(ModelConfig()))
    with tempfile.TemporaryDirectory() as tmp:
        cfg = local_config(Path(tmp))
        engine = LoopProcess(cfg, "serve")
        try:
            engine.wait_http(f"{cfg.engine_url}/health")
            http = httpx.Client(base_url=cfg.engine_url, timeout=120)
            raw, js, sizes, version = [], [], {}, 0
            for _ in range(2):  # warm-up, both paths
                version += 2
                push_raw(http, state, version - 1), push_json(http, state, version)
            for _ in range(args.pushes):
                version += 2
                t, sizes["raw_bytes"] = timed(lambda: push_raw(http, state, version - 1))
                raw.append(t)
                t, sizes["json_bytes"] = timed(lambda: push_json(http, state, version))
                js.append(t)
            client = SyncEngineClient(cfg.engine_url)
            whole = []
            from safetensors.torch import save

            for _ in range(args.pushes):
                version += 1
                t0 = time.perf_counter()
                client.update_weights_from_tensor_bytes(save(state, metadata={"format": "pt"}), version)
                whole.append(time.perf_counter() - t0)
            assert client.weight_version() == version
            client.close()
            http.close()
        finally:
            engine.stop()
    result = {"benchmark": "weight_push", "tensors": len(state), "pushes": args.pushes, **sizes,
              "raw": summary(raw), "json_base64": summary(js),
              "raw_speedup": round(statistics.median(js) / statistics.median(raw), 2),
              "raw_with_pause_flush_continue": summary(whole)}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
