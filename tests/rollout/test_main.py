"""`clawr1 rollout` as a process: an environment whose episode raises stops the loop, naming the error."""
from __future__ import annotations

import random
from typing import Any

from tests.conftest import make_config


class BrokenEnv:
    """An environment with a bug: every episode raises before it talks to the policy."""

    eval_metrics = ("score",)

    def __init__(self, args: dict[str, Any], seed: int = 0):
        pass

    def describe(self) -> dict[str, Any]:
        return {}

    async def episode(self, client: Any, session_id: str, rng: random.Random) -> dict[str, float]:
        raise KeyError("the task table has no row 'x-7'")

    async def evaluate(self, client: Any, n: int, session_prefix: str) -> dict[str, float]:
        return {"score": 0.0}

    def report(self) -> dict[str, float]:
        return {}


def test_an_episode_that_raises_stops_the_loop_and_names_the_error(tmp_path, loops):
    cfg = make_config(tmp_path, "rollout.env=tests.rollout.test_main:BrokenEnv", "rollout.concurrency=2")
    rollout = loops(cfg, "rollout")
    code = rollout.proc.wait(timeout=60)  # not a loop that runs on with dead workers and never says why
    log = rollout.log_path.read_text()
    assert code != 0, log
    assert "an episode raised KeyError: \"the task table has no row 'x-7'\"; stopping" in log
