"""Metrics: every loop appends JSON lines to `metrics.jsonl`; one forwarder copies them to wandb.

Each line is one record: {"loop": ..., "time": ..., "step": ..., metrics...}.
`step` is the trainer step the record belongs to (for loops other than the
trainer: the newest weight version they have seen). wandb runs offline unless
the config says `online`; the API key comes from WANDB_API_KEY in the
environment, never from the command line.
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, Optional

from clawr1.config import Config, to_dict

log = logging.getLogger("clawr1.tracking")


class MetricsWriter:
    """Appends one JSON line per record; a single write per line keeps lines whole across processes."""

    def __init__(self, run_dir: Path, loop: str):
        self.loop = loop
        self.path = Path(run_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def log(self, metrics: dict[str, Any], step: Optional[int] = None) -> None:
        record = {"loop": self.loop, "time": round(time.time(), 3), "step": step, **metrics}
        os.write(self._fd, (json.dumps(record, default=float) + "\n").encode())

    def close(self) -> None:
        os.close(self._fd)


class MetricsTail:
    """Reads metrics.jsonl incrementally: each `poll` returns the records appended since the last one."""

    def __init__(self, run_dir: Path, from_start: bool = False):
        self.path = Path(run_dir) / "metrics.jsonl"
        self.offset = 0 if from_start or not self.path.exists() else self.path.stat().st_size

    def poll(self) -> list[dict]:
        if not self.path.exists():
            return []
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            chunk = f.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]  # a line still being written waits for the next poll
        self.offset += len(complete)
        return [json.loads(line) for line in complete.splitlines() if line.strip()]


class RunStatus:
    """The run's latest figures, from every loop's records in metrics.jsonl (for progress lines and /v1/status)."""

    def __init__(self, run_dir: Path):
        self.tail = MetricsTail(run_dir, from_start=True)
        self.latest: dict[str, dict] = {}  # loop -> its newest record (the trainer's: its newest step)

    def refresh(self) -> "RunStatus":
        for record in self.tail.poll():
            loop = record.get("loop", "")
            if loop == "trainer" and "pg_loss" not in record:
                continue  # the trainer's other records (final versions) are not steps
            self.latest[loop] = record
        return self

    def get(self, loop: str, key: str) -> Any:
        return self.latest.get(loop, {}).get(key)


def read_metrics(run_dir: Path, loop: Optional[str] = None) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if loop is None or r.get("loop") == loop]


class WandbForwarder:
    """Tails metrics.jsonl in a thread and logs each record to one wandb run."""

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.path = cfg.run_dir / "metrics.jsonl"
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.run = None

    def start(self) -> None:
        mode = self.cfg.tracking.wandb_mode
        if mode == "disabled":
            return
        import wandb

        os.environ.setdefault("WANDB_SILENT", "true")
        self.run = wandb.init(
            mode=mode, dir=str(self.cfg.run_dir), project=self.cfg.tracking.project,
            entity=self.cfg.tracking.entity or None, name=self.cfg.tracking.name or self.cfg.run_dir.name,
            config=to_dict(self.cfg), settings=wandb.Settings(console="off"),
        )
        self.run.define_metric("trainer_step")
        self.run.define_metric("*", step_metric="trainer_step")
        self._thread = threading.Thread(target=self._follow, name="wandb-forwarder", daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        offset = 0
        while True:
            stopping = self._stop.is_set()
            offset = self._forward_new(offset)
            if stopping:
                return
            self._stop.wait(1.0)

    def _forward_new(self, offset: int) -> int:
        if not self.path.exists():
            return offset
        with open(self.path, "rb") as f:
            f.seek(offset)
            chunk = f.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]
        for line in complete.splitlines():
            record = json.loads(line)
            loop = record.pop("loop", "run")
            step = record.pop("step", None)
            record.pop("time", None)
            data = {f"{loop}/{k}": v for k, v in record.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
            if step is not None:
                data["trainer_step"] = step
            if data:
                self.run.log(data)
        return offset + len(complete)

    def finish(self) -> None:
        if self.run is None:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.run.finish()
        self.run = None
