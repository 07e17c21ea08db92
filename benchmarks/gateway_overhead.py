"""Latency the gateway adds: the same requests through the gateway and straight to the engine, interleaved.

Gateway requests are real main turns (new session each, rendered, proxied, recorded);
direct requests send the same prompt ids to the engine's /generate. The two alternate
which goes first in each pair. Prints one JSON
line with p50/p99 of each and the added p50/p99 (goal: p50 added < 2 ms, non-streaming),
and the gateway's own work per request as the gateway measures it (request time minus
time awaiting the engine), which separates its CPU cost from the extra loopback hop and
process scheduling on a small machine.
Usage: python benchmarks/gateway_overhead.py [--requests 400] [--max-tokens 4]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from clawr1.devtools import LoopProcess, local_config, stop_all  # noqa: E402
from clawr1.gateway.chat_template import ChatRenderer  # noqa: E402


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--max-tokens", type=int, default=4)
    args = ap.parse_args()
    from transformers import AutoTokenizer

    from clawr1.tinymodel.build import ensure_tiny_model

    messages = [{"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "What is 3 km plus 4 km?"}]
    with tempfile.TemporaryDirectory() as d:
        cfg = local_config(Path(d))
        prompt = ChatRenderer(AutoTokenizer.from_pretrained(ensure_tiny_model(cfg.model))).encode_messages(messages)
        procs = [LoopProcess(cfg, "serve"), LoopProcess(cfg, "gateway")]
        try:
            procs[0].wait_http(f"{cfg.engine_url}/health")
            procs[1].wait_http(f"{cfg.gateway_url}/health")
            direct_body = {"input_ids": prompt, "sampling_params": {"max_new_tokens": args.max_tokens, "temperature": 0},
                           "return_logprob": True}
            chat_body = {"model": "m", "messages": messages, "max_tokens": args.max_tokens, "temperature": 0}
            gw, direct = [], []
            with httpx.Client(timeout=60) as client:
                def own_seconds() -> tuple[float, float]:
                    values = dict(line.split()[:2] for line in client.get(f"{cfg.gateway_url}/metrics").text.splitlines()
                                  if line.startswith("clawr1_gateway_overhead_"))
                    return (float(values.get("clawr1_gateway_overhead_seconds_total", 0)),
                            float(values.get("clawr1_gateway_overhead_requests_total", 0)))

                def timed(send) -> float:
                    t0 = time.perf_counter()
                    reply = send()
                    elapsed = (time.perf_counter() - t0) * 1000
                    assert reply.status_code == 200, reply.text
                    return elapsed

                for i in range(args.requests + 20):  # the first 20 of each warm up
                    via_gateway = lambda: client.post(f"{cfg.gateway_url}/v1/chat/completions", json=chat_body,  # noqa: E731
                                                      headers={"X-Session-Id": f"bench-{i}"})
                    to_engine = lambda: client.post(f"{cfg.engine_url}/generate", json=direct_body)  # noqa: E731
                    if i % 2:  # alternate which goes first, so neither always follows the other
                        g, e = timed(via_gateway), timed(to_engine)
                    else:
                        e, g = timed(to_engine), timed(via_gateway)
                    if i == 19:
                        own_before = own_seconds()
                    if i >= 20:
                        gw.append(g)
                        direct.append(e)
                own_after = own_seconds()
        finally:
            stop_all(procs)
    own_ms = (own_after[0] - own_before[0]) / max(own_after[1] - own_before[1], 1) * 1000
    added = [g - d for g, d in zip(gw, direct)]
    print(json.dumps({
        "benchmark": "gateway_overhead", "requests": args.requests, "max_tokens": args.max_tokens,
        "gateway_p50_ms": round(percentile(gw, 0.5), 2), "gateway_p99_ms": round(percentile(gw, 0.99), 2),
        "direct_p50_ms": round(percentile(direct, 0.5), 2), "direct_p99_ms": round(percentile(direct, 0.99), 2),
        "added_p50_ms": round(percentile(gw, 0.5) - percentile(direct, 0.5), 2),
        "added_p99_ms": round(percentile(gw, 0.99) - percentile(direct, 0.99), 2),
        "added_median_of_pairs_ms": round(statistics.median(added), 2),
        "gateway_own_work_mean_ms": round(own_ms, 2),  # measured inside the gateway: time not awaiting the engine
    }))


if __name__ == "__main__":
    main()
