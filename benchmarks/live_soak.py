"""Soak: a live run (`clawr1 run recipes/live/cpu.yaml`) under 16 concurrent external sessions for a long time.

The sessions are `envs/personal`'s simulated users through the official `openai` client (as
`python -m envs.personal.client` drives them), each request timed. Every 10 s the benchmark samples the RSS
of every loop process (from /proc) and the size of the pool directory. The run is split into thirds by wall
time; it reports per loop the RSS of the first, middle and last third (median of the samples) and the growth
from the middle to the last, the pool directory's size per third, request latency p50/p99 per third, the
restarts `clawr1 run` made, and the outbox ledger (served main turns = samples + dropped + in flight) from the
gateway's durable log after the run stopped.

Goals (issue 28): each loop's RSS grows < 10% from the middle to the last third; the pool directory stays flat
once warm; p99 latency in the last third within 1.5x the first third's.

Usage: python benchmarks/live_soak.py [--minutes 30] [--users 16] [--out RUN_DIR]    (prints one JSON line)
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from clawr1.ports import free_port  # noqa: E402
from clawr1.gateway.outbox import Outbox  # noqa: E402
from envs.personal.client import OpenAIChat  # noqa: E402
from envs.personal.env import PersonalEnv  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SAMPLE_EVERY_S = 10.0
LOOPS = ("serve", "gateway", "judge", "pool", "train")


class TimedChat(OpenAIChat):
    """The simulated users' client, recording (when, seconds) of every chat request."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.latencies: list[tuple[float, float]] = []
        self.errors = 0

    async def chat(self, *args, **kwargs):
        t0 = time.monotonic()
        turn = await super().chat(*args, **kwargs)
        self.latencies.append((t0, time.monotonic() - t0))
        return turn


async def drive(url: str, users: int, seconds: float) -> TimedChat:
    chat = TimedChat(url, "unused-on-loopback", "clawr1-policy", 48, 1.0, 120.0)
    env = PersonalEnv({"profile_seed": 0}, seed=0)
    deadline = time.monotonic() + seconds

    async def user(index: int) -> None:
        rng, k = random.Random(f"soak-{index}"), 0
        while time.monotonic() < deadline:
            k += 1
            try:
                await env.episode(chat, f"soak{index}-{k}", rng)
            except Exception as e:  # counted; the soak goes on (a restarting gateway refuses connections)
                chat.errors += 1
                print(f"[soak] user {index}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
                await asyncio.sleep(1.0)

    await asyncio.gather(*(user(i) for i in range(users)))
    await chat.close()
    return chat


def loop_pids(run_dir: Path) -> dict[str, int]:
    """{loop: pid} of this run's `clawr1 <loop> --config RUN_DIR/config.yaml` processes."""
    out, config = {}, str(run_dir / "config.yaml").encode()
    for status in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = status.read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[1:3] == [b"-m", b"clawr1.cli"] and len(argv) > 5 and argv[3].decode() in LOOPS and argv[5] == config:
            out[argv[3].decode()] = int(status.parent.name)
    return out


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def thirds(rows: list[tuple[float, float]], start: float, end: float) -> list[list[float]]:
    cut = (end - start) / 3
    return [[v for t, v in rows if start + i * cut <= t < start + (i + 1) * cut] for i in range(3)]


def percentile(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))] * 1000 if values else float("nan")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--users", type=int, default=16)
    p.add_argument("--out", default="", help="run directory (default: a temporary one)")
    args = p.parse_args()
    run_dir = Path(args.out or tempfile.mkdtemp(prefix="clawr1-soak-")) / "run"
    port = free_port()
    run = subprocess.Popen([sys.executable, "-m", "clawr1.cli", "run", "recipes/live/cpu.yaml", f"run.dir={run_dir}",
                            f"gateway.port={port}", "run.progress_every_s=60"], cwd=REPO, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines: list[str] = []
    for line in run.stdout:
        lines.append(line)
        print(line, end="", file=sys.stderr, flush=True)
        if line.startswith("[run] ready"):
            break
    reader = threading.Thread(target=lambda: [lines.append(l) or print(l, end="", file=sys.stderr) for l in run.stdout],
                              daemon=True)
    reader.start()
    rss: dict[str, list[tuple[float, float]]] = {loop: [] for loop in LOOPS}
    disk: list[tuple[float, float]] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(SAMPLE_EVERY_S):
            now = time.monotonic()
            for loop, pid in loop_pids(run_dir).items():
                rss[loop].append((now, rss_mb(pid)))
            disk.append((now, dir_bytes(run_dir / "pool") / 2**20))

    sampler = threading.Thread(target=sample, daemon=True)
    start = time.monotonic()
    sampler.start()
    try:
        chat = asyncio.run(drive(f"http://127.0.0.1:{port}/v1", args.users, args.minutes * 60))
    finally:
        end = time.monotonic()
        stop.set()
        run.send_signal(signal.SIGINT)
        run.wait(timeout=180)
        reader.join(timeout=30)
    box = Outbox(run_dir / "gateway" / "outbox.log").counts()
    acked = sum(v for k, v in box.items() if k.startswith("outbox_acked_"))
    result = {"benchmark": "live_soak", "minutes": args.minutes, "users": args.users, "requests": len(chat.latencies),
              "client_errors": chat.errors, "rss_mb_by_third": {}, "rss_growth_middle_to_last": {}}
    for loop, rows in rss.items():
        medians = [statistics.median(t) if t else float("nan") for t in thirds(rows, start, end)]
        result["rss_mb_by_third"][loop] = [round(m, 1) for m in medians]
        result["rss_growth_middle_to_last"][loop] = round(medians[2] / medians[1] - 1, 3) if medians[1] else None
    result["pool_dir_mb_by_third"] = [round(statistics.median(t), 2) if t else None for t in thirds(disk, start, end)]
    lat = thirds(chat.latencies, start, end)
    result["latency_ms_p50_by_third"] = [round(percentile(t, 0.5), 1) for t in lat]
    result["latency_ms_p99_by_third"] = [round(percentile(t, 0.99), 1) for t in lat]
    result["p99_last_over_first"] = round(result["latency_ms_p99_by_third"][2] / result["latency_ms_p99_by_third"][0], 2)
    result["restarts"] = sum(l.startswith("[run] restarted") for l in lines)
    result["ledger"] = {**box, "balanced": box["outbox_served"] == acked + box["outbox_open"]}
    result["run_exit_code"] = run.returncode
    print(json.dumps(result))


if __name__ == "__main__":
    main()
