"""`clawr1 ingest FILE.jsonl`: pre-collected conversations into a run (black-box offline training).

    clawr1 ingest logs.jsonl --gateway http://127.0.0.1:8000       # into a live run
    clawr1 ingest logs.jsonl --config recipes/live/cpu.yaml run.dir=runs/from-logs   # a run of its own

One conversation per line, in OpenAI chat format:

    {"messages": [...], "tools": [...], "session_id": "...",
     "feedback": [{"turn": 0, "score": -1, "text": "use tags"}], "reward": 1.0}

Only `messages` is required. Every assistant turn goes to the judge with what
followed it (the gateway's /v1/ingest does the work, see clawr1/gateway/ingest.py).
A malformed line is reported with its line number and never stops the rest.
Re-running the same file adds nothing. The last line printed is a JSON summary.

With --config, the recipe's stack runs as a live run (no rollout loop); once the
file is in and the judge and pool have nothing left to hand on, the run stops
(or at run.max_steps, if set).
"""
from __future__ import annotations

import asyncio
import json
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional

import httpx
from pydantic import ValidationError

from clawr1.config import Config
from clawr1.runtime import resolve_api_key

CONCURRENCY = 4  # conversations in flight at once
REQUEST_TIMEOUT_S = 300.0


@dataclass
class Summary:
    lines: int = 0
    conversations: int = 0  # lines that were conversations
    turns: int = 0  # assistant turns in them
    ingested: int = 0
    duplicates: int = 0  # ingested before (same content): not added again
    skipped: Counter = field(default_factory=Counter)  # reason -> turns
    malformed_lines: list[dict] = field(default_factory=list)  # {"line": n, "error": ...}

    def add(self, reply: dict) -> None:
        self.conversations += 1
        self.turns += reply["turns"]
        self.ingested += reply["ingested"]
        self.duplicates += reply["duplicates"]
        self.skipped.update(s["reason"] for s in reply["skipped"])

    def as_dict(self) -> dict:
        return {"lines": self.lines, "conversations": self.conversations, "turns": self.turns,
                "ingested": self.ingested, "duplicates": self.duplicates, "skipped": dict(self.skipped),
                "malformed_lines": self.malformed_lines}


def read_conversations(path: Path) -> Iterator[tuple[int, Optional[dict], str]]:
    """(line number, conversation or None, why it is not one) for every non-blank line."""
    from clawr1.gateway.openai_types import IngestRequest  # the same model the gateway validates with

    with open(path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                IngestRequest.model_validate(obj)
            except json.JSONDecodeError as e:
                yield number, None, f"not JSON: {e}"
            except ValidationError as e:
                first = e.errors()[0]
                yield number, None, f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']}"
            else:
                yield number, obj, ""


async def ingest_file(path: Path, gateway_url: str, api_key: Optional[str] = None,
                      concurrency: int = CONCURRENCY, echo=print) -> Summary:
    """Send every conversation of `path` to the gateway; a summary of what happened to each turn."""
    summary = Summary()
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    slots = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=gateway_url.rstrip("/"), headers=headers, timeout=REQUEST_TIMEOUT_S) as http:

        async def send(number: int, conversation: dict) -> None:
            async with slots:
                reply = await _post(http, conversation)
            if "error" in reply:
                summary.malformed_lines.append({"line": number, "error": reply["error"]})
            else:
                summary.add(reply)

        tasks = []
        for number, conversation, error in read_conversations(path):
            summary.lines += 1
            if conversation is None:
                summary.malformed_lines.append({"line": number, "error": error})
                continue
            tasks.append(asyncio.create_task(send(number, conversation)))
            if len(tasks) % 200 == 0:
                echo(f"[ingest] {len(tasks)} conversations read ...")
        await asyncio.gather(*tasks)
    summary.malformed_lines.sort(key=lambda m: m["line"])
    return summary


async def _post(http: httpx.AsyncClient, conversation: dict, attempts: int = 5) -> dict:
    """One conversation; a gateway that is busy (503) or unreachable is retried, a refused line is reported."""
    delay = 1.0
    for attempt in range(attempts):
        try:
            resp = await http.post("/v1/ingest", json=conversation)
        except httpx.HTTPError as e:
            if attempt == attempts - 1:
                raise RuntimeError(f"the gateway at {http.base_url} is unreachable: {e}") from None
        else:
            if resp.status_code == 200:
                return resp.json()
            if resp.status_code != 503:
                return {"error": _error_text(resp)}
        await asyncio.sleep(delay)
        delay = min(delay * 2, 10.0)
    raise RuntimeError(f"the gateway stayed busy (503) for conversation {conversation.get('session_id', '')!r}")


def _error_text(resp: httpx.Response) -> str:
    try:
        return f"HTTP {resp.status_code}: {resp.json()['error']['message']}"
    except (ValueError, KeyError, TypeError):
        return f"HTTP {resp.status_code}: {resp.text[:300]}"


# ---------------------------------------------------------------- a run of its own
def run_with_own_stack(path: Path, cfg: Config, echo=print) -> tuple[int, Optional[Summary]]:
    """Start the recipe as a live run, ingest the file into it, let it train on what came in, stop it."""
    from clawr1.supervisor import Supervisor

    result: dict = {}

    def drive() -> Drained:
        result["summary"] = asyncio.run(ingest_file(path, cfg.gateway_url, resolve_api_key(cfg.gateway), echo=echo))
        echo(f"[ingest] {json.dumps(result['summary'].as_dict())}")
        return Drained(cfg, result["summary"].ingested)

    code = Supervisor(cfg, echo=echo, driver=drive).run()
    return code, result.get("summary")


class Drained:
    """Whether the run has handed on everything ingested: the judge took all `sent` turns, the pool holds
    less than a batch, and both stayed so for `quiet_s` (their records come every few seconds)."""

    def __init__(self, cfg: Config, sent: int, quiet_s: float = 6.0):
        from clawr1.tracking import RunStatus

        self.cfg, self.sent, self.quiet_s = cfg, sent, quiet_s
        self.status = RunStatus(cfg.run_dir)
        self.calm_since: Optional[float] = None

    def __call__(self) -> bool:
        s = self.status.refresh()
        judged_all = (s.get("judge", "received_ingested") or 0) >= self.sent and not s.get("judge", "inflight")
        pool_empty = (s.get("pool", "pending") or 0) < self.cfg.pool.batch_size
        if not (judged_all and pool_empty):
            self.calm_since = None
            return False
        self.calm_since = self.calm_since or time.monotonic()
        return time.monotonic() - self.calm_since >= self.quiet_s


def main(args) -> int:
    """`clawr1 ingest` (args from clawr1/cli.py)."""
    from clawr1.config import load_config
    from clawr1.supervisor import prepare

    path = Path(args.file)
    if not path.is_file():
        print(f"clawr1 ingest: no such file: {path}", flush=True)
        return 2
    if args.config:
        cfg = load_config(args.config, [*args.overrides, "run.mode=live"])
        if cfg.cluster.backend == "ray":
            print("clawr1 ingest: --config runs its own stack on this machine (cluster.backend=local); to ingest into "
                  "a run on a Ray cluster, give that run's --gateway URL", flush=True)
            return 2
        cfg = prepare(cfg, Path(args.config), args.overwrite, args.resume)
        code, summary = run_with_own_stack(path, cfg, echo=lambda line: print(line, flush=True))
        if summary is not None:
            print(json.dumps(summary.as_dict()), flush=True)
        return code
    if not args.gateway:
        print("clawr1 ingest: give --gateway URL (a running gateway) or --config RECIPE (a run of its own)", flush=True)
        return 2
    summary = asyncio.run(ingest_file(path, args.gateway, os.environ.get(args.api_key_env) or None))
    print(json.dumps(summary.as_dict()), flush=True)
    return 0
