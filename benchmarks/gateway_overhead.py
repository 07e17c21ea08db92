"""Latency the gateway adds: the same requests through the gateway and straight to the engine, in one run.

Gateway requests are real main turns (a new session each: rendered, proxied, recorded);
direct requests send the same prompt ids to the engine's /generate. Requests go in
pairs, alternating which of the two goes first. The run is split into rounds; each
round gives p50(gateway) - p50(direct), and the headline `added_p50_ms` is the median
over rounds, so one burst of noise on a small shared machine does not decide it
(goal: < 2 ms, non-streaming). Also printed: p50/p99 of each side over all rounds, the
median of the per-pair differences, the gateway's own work per request as it measures
it (request time minus time awaiting the engine), and the gateway process's CPU time
per request (from /proc, Linux).

Usage: python benchmarks/gateway_overhead.py [--requests 500] [--rounds 5] [--max-tokens 4] [--model DIR]

--model: an HF model directory (default: the tiny model), e.g. a tiny Qwen3 from
`python -m clawr1.tinymodel.family qwen3 DIR`, to time the renderer on a real model's template.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Optional

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from clawr1.devtools import LoopProcess, local_config, stop_all  # noqa: E402
from clawr1.chat import ChatRenderer  # noqa: E402

MESSAGES = [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "What is 3 km plus 4 km?"}]
WARMUP = 20


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def cpu_seconds(pid: int) -> Optional[float]:
    """User + system CPU time of a process, or None off Linux."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed(send: Callable[[], httpx.Response]) -> float:
    t0 = time.perf_counter()
    reply = send()
    elapsed = (time.perf_counter() - t0) * 1000
    assert reply.status_code == 200, reply.text
    return elapsed


def gateway_own_seconds(client: httpx.Client, gateway_url: str) -> tuple[float, float]:
    """(seconds of own work, requests counted) from the gateway's /metrics."""
    values = dict(line.split()[:2] for line in client.get(f"{gateway_url}/metrics").text.splitlines()
                  if line.startswith("clawr1_gateway_overhead_"))
    return (float(values.get("clawr1_gateway_overhead_seconds_total", 0)),
            float(values.get("clawr1_gateway_overhead_requests_total", 0)))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=500, help="measured pairs in all")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=4)
    ap.add_argument("--model", default="", help="an HF model directory; default: the tiny model")
    args = ap.parse_args()
    from transformers import AutoTokenizer

    from clawr1.model_path import resolve_model_path

    with tempfile.TemporaryDirectory() as d:
        cfg = local_config(Path(d), *([f"model.path={args.model}"] if args.model else []))
        prompt = ChatRenderer(AutoTokenizer.from_pretrained(resolve_model_path(cfg.model))).encode_messages(MESSAGES)
        procs = [LoopProcess(cfg, "serve"), LoopProcess(cfg, "gateway")]
        try:
            procs[0].wait_http(f"{cfg.engine_url}/health")
            procs[1].wait_http(f"{cfg.gateway_url}/health")
            direct_body = {"input_ids": prompt, "sampling_params": {"max_new_tokens": args.max_tokens, "temperature": 0},
                           "return_logprob": True}
            chat_body = {"model": "m", "messages": MESSAGES, "max_tokens": args.max_tokens, "temperature": 0}
            gateway_pid = procs[1].proc.pid
            rounds: list[tuple[list[float], list[float]]] = []
            with httpx.Client(timeout=60) as client:
                pair = 0

                def one_pair() -> tuple[float, float]:
                    nonlocal pair
                    pair += 1
                    via_gateway = lambda: client.post(f"{cfg.gateway_url}/v1/chat/completions",  # noqa: E731
                                                      json=chat_body, headers={"X-Session-Id": f"bench-{pair}"})
                    to_engine = lambda: client.post(f"{cfg.engine_url}/generate", json=direct_body)  # noqa: E731
                    if pair % 2:
                        return timed(via_gateway), timed(to_engine)
                    direct = timed(to_engine)
                    return timed(via_gateway), direct

                for _ in range(WARMUP):
                    one_pair()
                own_before, cpu_before = gateway_own_seconds(client, cfg.gateway_url), cpu_seconds(gateway_pid)
                per_round = max(1, args.requests // args.rounds)
                for _ in range(args.rounds):
                    pairs = [one_pair() for _ in range(per_round)]
                    rounds.append(([g for g, _ in pairs], [e for _, e in pairs]))
                cpu_after = cpu_seconds(gateway_pid)
                own_after = gateway_own_seconds(client, cfg.gateway_url)
        finally:
            stop_all(procs)
    measured = per_round * args.rounds
    own_ms = (own_after[0] - own_before[0]) / max(own_after[1] - own_before[1], 1) * 1000
    gw = [x for g, _ in rounds for x in g]
    direct = [x for _, e in rounds for x in e]
    added_by_round = [percentile(g, 0.5) - percentile(e, 0.5) for g, e in rounds]
    print(json.dumps({
        "benchmark": "gateway_overhead", "model": args.model or "tiny", "requests": measured, "rounds": args.rounds, "max_tokens": args.max_tokens,
        "gateway_p50_ms": round(percentile(gw, 0.5), 2), "gateway_p99_ms": round(percentile(gw, 0.99), 2),
        "direct_p50_ms": round(percentile(direct, 0.5), 2), "direct_p99_ms": round(percentile(direct, 0.99), 2),
        "added_p50_ms": round(statistics.median(added_by_round), 2),
        "added_p50_by_round_ms": [round(a, 2) for a in added_by_round],
        "added_p99_ms": round(percentile(gw, 0.99) - percentile(direct, 0.99), 2),
        "added_median_of_pairs_ms": round(statistics.median(g - e for g, e in zip(gw, direct)), 2),
        "gateway_own_work_mean_ms": round(own_ms, 2),  # measured inside the gateway: time not awaiting the engine
        "gateway_cpu_ms_per_request": (None if cpu_before is None or cpu_after is None
                                       else round((cpu_after - cpu_before) / measured * 1000, 2)),
    }))


if __name__ == "__main__":
    main()
