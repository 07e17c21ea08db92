"""Zero-downtime weight swaps: streaming clients through the gateway while weight updates land.

32 clients (the official openai client, streaming, one new session per request) run
for 60 s while 20 updates are pushed to the engine through /update_weights_from_disk.
The benchmark holds the judge's end of the gateway's socket, so it sees the
TurnRecords and their per-token weight versions. Prints one JSON line: errors (must
be 0), requests, p50/p99 latency of requests that overlapped a swap and of those that
did not, and the per-token version mix.

Usage: python benchmarks/hot_swap.py [--clients 32 --seconds 60 --updates 20]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx
import openai

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from clawr1 import bus, protocol  # noqa: E402
from clawr1.devtools import LoopProcess, local_config, stop_all  # noqa: E402


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return round(values[min(len(values) - 1, int(q * len(values)))], 1) if values else 0.0


def weight_dirs(model: Path, out: Path) -> list[Path]:
    """Two weight sets to alternate between (the model, and the model with a perturbed final norm)."""
    from clawr1.trainer.hf_io import load_hf_state, write_weights_dir

    state = load_hf_state(model)
    other = dict(state, **{"model.norm.weight": state["model.norm.weight"] * 1.01})
    return [write_weights_dir(state, out / "a"), write_weights_dir(other, out / "b")]


async def client(i: int, c: openai.AsyncOpenAI, http: httpx.AsyncClient, stop_at: float, results: list,
                 errors: list) -> None:
    k = 0
    while time.monotonic() < stop_at:
        sid = f"c{i}-{k}"
        k += 1
        t0 = time.monotonic()
        try:
            stream = await c.chat.completions.create(
                model="m", messages=[{"role": "user", "content": f"Add {i} km and {k} km."}], max_tokens=32,
                stream=True, extra_headers={"X-Session-Id": sid})
            chunks = 0
            async for ch in stream:
                chunks += 1
                if getattr(ch, "error", None):
                    raise RuntimeError(str(ch))
            results.append((t0, time.monotonic(), chunks))
            (await http.post(f"/v1/sessions/{sid}/complete", json={})).raise_for_status()
        except Exception as e:  # every failure counts; the goal is zero
            errors.append(f"{type(e).__name__}: {e}")


async def swapper(cfg, dirs: list[Path], updates: int, seconds: float, t_start: float, swaps: list) -> None:
    async with httpx.AsyncClient(timeout=120) as http:
        for v in range(1, updates + 1):
            await asyncio.sleep(max(0.0, t_start + v * seconds / (updates + 1) - time.monotonic()))
            t0 = time.monotonic()
            r = await http.post(f"{cfg.engine_url}/update_weights_from_disk",
                                json={"model_path": str(dirs[v % 2]), "weight_version": str(v)})
            swaps.append((t0, time.monotonic(), r.status_code == 200 and r.json()["success"]))


async def collect(sock, records: list, stop: asyncio.Event) -> None:
    while not stop.is_set():
        if await sock.poll(200):
            records.append(protocol.decode(await sock.recv_multipart()))


async def warm_up(c: openai.AsyncOpenAI, clients: int) -> None:
    """One round of concurrent side requests, so first-request costs do not land in the measurement."""
    await asyncio.gather(*(c.chat.completions.create(model="m", messages=[{"role": "user", "content": "Add 1 g and 1 g."}],
                                                     max_tokens=8, extra_headers={"X-Turn-Type": "side"})
                           for _ in range(clients)))


async def run(cfg, dirs, args) -> dict:
    # one client and one connection pool for all simulated users: building 32 clients would block this loop
    c = openai.AsyncOpenAI(base_url=f"{cfg.gateway_url}/v1", api_key="unused", max_retries=0, timeout=120,
                           http_client=openai.DefaultAsyncHttpxClient(limits=httpx.Limits(max_connections=args.clients * 2)))
    http = httpx.AsyncClient(base_url=cfg.gateway_url, timeout=60)
    await warm_up(c, args.clients)
    sock = bus.pull_socket(cfg.judge_turns_addr, asyncio=True)
    results, errors, swaps, records = [], [], [], []
    stop = asyncio.Event()
    collector = asyncio.create_task(collect(sock, records, stop))
    t_start = time.monotonic()
    await asyncio.gather(
        swapper(cfg, dirs, args.updates, args.seconds, t_start, swaps),
        *(client(i, c, http, t_start + args.seconds, results, errors) for i in range(args.clients)))
    await c.close()
    await http.aclose()
    await asyncio.sleep(2)
    stop.set()
    await collector
    sock.close(0)
    if args.debug:
        print("swaps at", [round(a - t_start, 2) for a, _, _ in swaps], file=sys.stderr)
        print("first completions at", sorted(round(b - t_start, 2) for _, b, _ in results)[:5], file=sys.stderr)
        per5 = Counter(int((b - t_start) // 5) * 5 for _, b, _ in results)
        print("completions per 5 s:", [per5[k] for k in sorted(per5)], file=sys.stderr)
    return summarize(results, errors, swaps, records, args)


def summarize(results, errors, swaps, records, args) -> dict:
    def overlaps(a, b) -> bool:
        return any(s0 < b and a < s1 for s0, s1, _ in swaps)

    during = [(b - a) * 1000 for a, b, _ in results if overlaps(a, b)]
    outside = [(b - a) * 1000 for a, b, _ in results if not overlaps(a, b)]
    tokens = Counter(v for r in records for v in r.versions)
    spanning = sum(len(set(r.versions)) > 1 for r in records)
    return {
        "benchmark": "hot_swap", "clients": args.clients, "seconds": args.seconds,
        "updates_requested": args.updates, "updates_ok": sum(ok for *_, ok in swaps),
        "errors": len(errors), "error_examples": errors[:3], "requests": len(results),
        "latency_ms_outside_swaps": {"p50": percentile(outside, 0.5), "p99": percentile(outside, 0.99), "n": len(outside)},
        "latency_ms_during_swaps": {"p50": percentile(during, 0.5), "p99": percentile(during, 0.99), "n": len(during)},
        "swap_ms": {"p50": percentile([(b - a) * 1000 for a, b, _ in swaps], 0.5),
                    "max": percentile([(b - a) * 1000 for a, b, _ in swaps], 1.0)},
        "turns_recorded": len(records), "turns_spanning_two_versions": spanning,
        "tokens_per_version": {str(k): v for k, v in sorted(tokens.items())},
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--updates", type=int, default=20)
    ap.add_argument("--debug", action="store_true")
    args = ap.parse_args()
    from clawr1.model_path import resolve_model_path

    with tempfile.TemporaryDirectory() as tmp:
        d = tempfile.mkdtemp() if args.debug else tmp  # --debug keeps the loops' logs
        if args.debug:
            print("run directory:", d, file=sys.stderr)
        cfg = local_config(Path(d), f"serve.max_running_requests={max(32, args.clients)}")
        dirs = weight_dirs(resolve_model_path(cfg.model), Path(d))
        procs = [LoopProcess(cfg, "serve"), LoopProcess(cfg, "gateway")]
        try:
            procs[0].wait_http(f"{cfg.engine_url}/health")
            procs[1].wait_http(f"{cfg.gateway_url}/health")
            result = asyncio.run(run(cfg, dirs, args))
        finally:
            stop_all(procs)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
