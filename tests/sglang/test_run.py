"""Whole runs served by real SGLang on CPU: the combined recipe with an OpenAI client streaming throughout, and the
per-user LoRA recipe, each for at least 5 trainer steps."""
from __future__ import annotations

import threading
from collections import defaultdict

import openai
import pytest

from clawr1.pool.store import read_samples
from tests.e2e.test_live import LiveRun, steps
from tests.e2e.test_lora_users import run as lora_users_run
from tests.sglang.conftest import SGLANG_STARTUP_S, sglang_overrides

pytestmark = pytest.mark.slow
STEPS = 5


class Streamer:
    """An OpenAI client streaming chat completions from the gateway, one after another, until stopped."""

    def __init__(self, url: str):
        self.client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=300)
        self.done, self.failed = 0, []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self.stopping.is_set():
            try:
                chunks = list(self.client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": f"What is {self.done} plus 2?"}],
                    max_tokens=24, stream=True))
                assert chunks and chunks[-1].choices[0].finish_reason in ("stop", "length")
                self.done += 1
            except Exception as e:  # noqa: BLE001 (every failure is the test's finding)
                self.failed.append(repr(e))

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=300)


def test_the_combined_recipe_trains_through_sglang_while_a_client_streams(sglang, tiny_model, tmp_path):
    run_dir = tmp_path / "run"
    run = LiveRun(run_dir, *sglang_overrides(sglang), "run.max_steps=1000", "rollout.eval_every=0",
                  recipe="recipes/combined/cpu.yaml")
    try:
        streamer = Streamer(run.wait_ready(timeout=2 * SGLANG_STARTUP_S))
        try:
            while steps(run_dir) < STEPS:
                assert run.proc.poll() is None, "".join(run.lines)[-3000:]
                streamer.thread.join(timeout=1)
        finally:
            streamer.stop()
        code, out = run.interrupt()
    finally:
        run.kill()
    assert code == 130, out[-3000:]  # stopped by Ctrl-C, as asked
    assert streamer.failed == [] and streamer.done >= 1
    assert "(balanced)" in out.split("[run] ledger:")[1].splitlines()[0], out[-2000:]
    samples = list(read_samples(run_dir / "pool"))
    versions = {v for s in samples for v in s.versions}
    # the engine's own weight_version on every token: the base's 0, then the trainer's publishes as SGLang took them
    assert 0 in versions and max(versions) >= STEPS - 1
    assert all(s.versions == sorted(s.versions) for s in samples)  # a turn never goes back to older weights
    assert (run_dir / "logs").glob("sglang-*.log")


def test_per_user_adapters_are_served_by_sglang_and_a_user_never_gets_an_older_one(sglang, tiny_model, tmp_path):
    run_dir = tmp_path / "run"
    out = lora_users_run(run_dir, *sglang_overrides(sglang), f"run.max_steps={STEPS}")
    assert "(balanced)" in out.split("[run] ledger:")[1].splitlines()[0], out[-2000:]
    samples = list(read_samples(run_dir / "pool"))
    sessions = defaultdict(list)
    for s in samples:
        assert s.adapter == "" or s.adapter.startswith(f"slot{s.adapter_slot}@v")  # the user's own adapter
        if s.adapter:
            assert set(s.versions) == {int(s.adapter.split("@v")[1])}  # tokens carry the adapter's version
        sessions[s.session_id].append(s)
    trained_with_adapters = [s for s in samples if s.adapter]
    assert len({s.adapter for s in trained_with_adapters}) >= 2 * 2  # two users, at least two versions each
    for turns in sessions.values():  # each turn starts after the one before: never an older adapter than it had
        served = [int(s.adapter.split("@v")[1]) if s.adapter else 0 for s in sorted(turns, key=lambda s: s.turn_index)]
        assert served == sorted(served), served
