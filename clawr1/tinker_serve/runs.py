"""The training runs and checkpoints `clawr1 tinker-serve` has seen, as Tinker's RestClient lists them.

A training run is a training client (its model_id); it stays listed after its session ends, with the
checkpoints it saved (`save_state`: "training", `save_weights_for_sampler`: "sampler"), until deleted. A run is
named by its model_id or by the first part of its checkpoints' tinker:// paths (the SDK parses those).
Written from the training thread and read from the event loop, so every access holds the lock.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Optional

from clawr1.tinker_serve.backend import TinkerRequestError

KINDS = {"weights": "training", "sampler_weights": "sampler"}  # a tinker:// path's segment -> checkpoint_type


class NotListed(LookupError):
    """No such training run, or no such checkpoint of it (answered 404 with this message)."""


def _now() -> str:
    return datetime.now(timezone.utc).isoformat()


@dataclass
class Run:
    model_id: str
    base_model: str
    rank: int
    last_request_time: str = field(default_factory=_now)
    checkpoints: dict[str, dict] = field(default_factory=dict)  # checkpoint_id -> Tinker's Checkpoint, as JSON


class RunBook:
    """Training runs by model_id, each with its checkpoints."""

    def __init__(self) -> None:
        self._runs: dict[str, Run] = {}
        self._lock = threading.Lock()

    def opened(self, model_id: str, base_model: str, rank: int) -> None:
        with self._lock:
            self._runs.setdefault(model_id, Run(model_id, base_model, rank))

    def touched(self, model_id: str) -> None:
        with self._lock:
            if model_id in self._runs:
                self._runs[model_id].last_request_time = _now()

    def saved(self, model_id: str, path: str) -> None:
        """A checkpoint at `path` (tinker://RUN/weights|sampler_weights/NAME), listed under its run."""
        checkpoint_id = "/".join(path.removeprefix("tinker://").split("/")[1:])
        kind = KINDS.get(checkpoint_id.split("/")[0], "training")
        with self._lock:
            if model_id in self._runs:
                self._runs[model_id].checkpoints[checkpoint_id] = {
                    "checkpoint_id": checkpoint_id, "checkpoint_type": kind, "time": _now(), "tinker_path": path}

    def removed(self, run_id: str, checkpoint_id: str) -> str:
        """Forget a checkpoint; its tinker:// path, for the backend to delete."""
        with self._lock:
            run = self._find(run_id)
            if checkpoint_id not in run.checkpoints:
                raise NotListed(f"training run {run_id!r} has no checkpoint {checkpoint_id!r}")
            return run.checkpoints.pop(checkpoint_id)["tinker_path"]

    def run(self, run_id: str) -> dict[str, Any]:
        """Tinker's TrainingRun, as JSON."""
        with self._lock:
            return _as_json(self._find(run_id))

    def runs(self, offset: int, limit: int) -> dict[str, Any]:
        """Tinker's TrainingRunsResponse: the runs in the order they were created, a page of them."""
        if offset < 0 or limit < 1:
            raise TinkerRequestError(f"offset must be >= 0 and limit >= 1, got offset={offset}, limit={limit}")
        with self._lock:
            every = [_as_json(r) for r in self._runs.values()]
        return {"training_runs": every[offset:offset + limit],
                "cursor": {"offset": offset, "limit": limit, "total_count": len(every)}}

    def checkpoints(self, run_id: str) -> dict[str, Any]:
        """Tinker's CheckpointsListResponse."""
        with self._lock:
            found = list(self._find(run_id).checkpoints.values())
        return {"checkpoints": found, "cursor": {"offset": 0, "limit": len(found), "total_count": len(found)}}

    def _find(self, run_id: str) -> Run:
        for run in self._runs.values():
            if run_id in (run.model_id, run.model_id.replace(":", "_")):
                return run
        raise NotListed(f"no training run {run_id!r} on this server")


def _as_json(run: Run) -> dict[str, Any]:
    by_kind: dict[str, Optional[dict]] = {"training": None, "sampler": None}
    for checkpoint in run.checkpoints.values():
        by_kind[checkpoint["checkpoint_type"]] = checkpoint  # the newest of each kind (insertion order)
    return {"training_run_id": run.model_id, "base_model": run.base_model, "model_owner": "local",
            "is_lora": True, "lora_rank": run.rank, "last_request_time": run.last_request_time,
            "last_checkpoint": by_kind["training"], "last_sampler_checkpoint": by_kind["sampler"]}
