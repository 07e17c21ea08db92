"""trainer.backend=tinker end to end on CPU: `clawr1 run recipes/combined/tinker.yaml` (and the live recipe,
driven by an external OpenAI client) trains the tiny model through a local `clawr1 tinker-serve`, the unchanged
Tinker SDK being the client of both. Every loop runs for real (gateway, judge with a base-model teacher in
Tinker, pool, rollout, engines in front of Tinker's sampling clients); the served weights change with each step,
the run resumes from a save_state checkpoint, and the API key is written nowhere."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from clawr1.pool.store import read_samples
from tests.conftest import REPO
from tests.e2e.test_live import LiveRun, client
from tests.e2e.test_lora_users import teacher_against_base_with_hint
from tests.e2e.test_run import trainer_records
from tests.tinker_serve_process import tinker_serve

tinker = pytest.importorskip("tinker", reason="needs the Tinker SDK (the `tinker` extra: scripts/setup.sh installs it)")
from tinker import types  # noqa: E402

pytestmark = pytest.mark.slow
KEY = "tml-clawr1-e2e-key-51d7"
ENV = {**os.environ, "TINKER_API_KEY": KEY, "TINKER_TELEMETRY": "0"}
PROBE = [11, 12, 13, 40, 42, 44]


def run(run_dir: Path, url: str, model: str, *extra: str) -> str:
    out = subprocess.run([sys.executable, "-m", "clawr1.cli", "run", "recipes/combined/tinker.yaml", f"run.dir={run_dir}",
                          f"tinker.base_url={url}", f"model.path={model}", f"tinker.base_model={Path(model).name}",
                          "tinker.lora_rank=8", "rollout.eval_every=0", "tracking.wandb_mode=disabled",
                          "trainer.checkpoint_every=1", *extra], cwd=REPO, env=ENV, capture_output=True, text=True,
                         timeout=900)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-3000:]
    return out.stdout


def sampler_paths(run_dir: Path) -> dict[int, str]:
    """{version: tinker:// path} of every sampler save the trainer published (its log names them)."""
    text = (run_dir / "logs" / "trainer.log").read_text()
    return {int(v): p for v, p in re.findall(r"sampler weights v(\d+): (tinker://\S+)", text)}


@pytest.fixture(scope="module")
def served(tiny_model, tmp_path_factory):
    """One local tinker-serve (LoRA rank 8, a training slot for each of the three runs here) for the tests here;
    its log is checked for the key when it stops."""
    with tinker_serve(tmp_path_factory.mktemp("tinker") / "serve", tiny_model, KEY, 4, "lora.rank=8") as url:
        yield url


def test_the_combined_recipe_trains_through_tinker_serve_and_resumes(served, tiny_model, tmp_path):
    run_dir = tmp_path / "run"
    url = served
    run(run_dir, url, tiny_model, "run.max_steps=2")
    records = trainer_records(run_dir)
    assert [r["step"] for r in records] == [1, 2]
    assert all(r["samples_trained"] > 0 and r["adv_trained_abs_sum"] > 0 for r in records)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["engine_weight_version"] == 2
    samples = list(read_samples(run_dir / "pool"))
    assert samples and all(set(s.versions) <= {0, 1, 2} for s in samples)
    assert_the_teacher_is_the_base_model_with_the_hint(tiny_model, samples)

    # the served weights change after each step: a fixed sequence scores differently under each sampler
    paths = sampler_paths(run_dir)
    assert sorted(paths) == [0, 1, 2] and len(set(paths.values())) == 3
    service = tinker.ServiceClient(base_url=url, api_key=KEY)
    try:
        probe = [service.create_sampling_client(model_path=paths[v]).compute_logprobs(
            types.ModelInput.from_ints(PROBE)).result()[1:] for v in (0, 1, 2)]
    finally:
        service.close("success").result(timeout=30)  # else its heartbeats outlive the server
    assert probe[0] != probe[1] != probe[2]

    checkpoints = json.loads((run_dir / "checkpoints" / "tinker.json").read_text())["checkpoints"]
    assert [c["step"] for c in checkpoints] == [1, 2] and all(c["state"].startswith("tinker://") for c in checkpoints)
    run(run_dir, url, tiny_model, "run.max_steps=3", "--resume")
    assert [r["step"] for r in trainer_records(run_dir)][-1] == 3
    log = (run_dir / "logs" / "trainer.log").read_text()
    assert f"resumed from {checkpoints[-1]['state']}: step 2" in log
    assert_the_key_is_in_no_file(tmp_path)


def test_the_live_recipe_trains_on_an_openai_clients_traffic_through_tinker(served, tiny_model, tmp_path, monkeypatch):
    """Deploy = train through Tinker: the personal env's black-box client talks to the gateway; the run trains 2
    steps on that traffic in Tinker, the engines switching samplers under it, and ends by itself."""
    monkeypatch.setenv("TINKER_API_KEY", KEY)
    monkeypatch.setenv("TINKER_TELEMETRY", "0")
    run_dir = tmp_path / "live"
    live = LiveRun(run_dir, f"tinker.base_url={served}", f"model.path={tiny_model}",
                   f"tinker.base_model={Path(tiny_model).name}", "tinker.lora_rank=8", "run.max_steps=2",
                   "tracking.wandb_mode=disabled", recipe="recipes/live/tinker.yaml")
    users = None
    try:
        users = client(live.wait_ready(), "--users", "4", "--duration", "600")
        live.proc.wait(timeout=600)  # a live run with run.max_steps ends by itself
        assert live.proc.returncode == 0, "".join(live.lines)[-3000:]
        records = trainer_records(run_dir)
        assert [r["step"] for r in records] == [1, 2] and all(r["samples_trained"] > 0 for r in records)
        assert json.loads((run_dir / "summary.json").read_text())["engine_weight_version"] == 2
        assert sorted(sampler_paths(run_dir)) == [0, 1, 2]
    finally:
        if users is not None:
            users.send_signal(signal.SIGTERM)
            users.communicate(timeout=60)
        live.kill()
    assert "Traceback" not in "".join(live.lines)
    assert_the_key_is_in_no_file(tmp_path)


def assert_the_key_is_in_no_file(root: Path) -> None:
    written = [p for p in root.rglob("*") if p.is_file() and KEY.encode() in p.read_bytes()]
    assert written == []  # no log, metric, config or sample holds the key



def assert_the_teacher_is_the_base_model_with_the_hint(tiny_model: str, samples: list) -> None:
    """judge.teacher=frozen through Tinker is a sampling client of the base model: its log-probs of a hinted
    sample's response are the base model's with the hint in the prompt, as exact as fp32 allows."""
    hinted = [s for s in samples if s.hint and s.teacher_logprobs]
    assert hinted, "no sample earned a hint"
    teacher_against_base_with_hint(tiny_model, hinted[:3])
