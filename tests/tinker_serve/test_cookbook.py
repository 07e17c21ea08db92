"""tinker-cookbook 0.5.8's own recipes, unchanged, train against `clawr1 tinker-serve` for 2 steps each, run as a
user runs them: `python -m tinker_cookbook.recipes.<recipe>.train` with command-line settings only, from the
cookbook's environment (scripts/setup_cookbook.sh), with no Hub but the server's /hub.

The server serves the tiny model under a name the cookbook's model tables know (tinker.model_name), so the
cookbook picks its renderer by that name. Without the cookbook's environment these tests skip and say why; CI sets
CLAWR1_REQUIRE_COOKBOOK=1, which turns the skip into a failure. CLAWR1_COOKBOOK_PYTHON names another environment's
Python."""
from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.tinker_serve_process import tinker_serve

pytestmark = pytest.mark.slow
KEY = "tml-clawr1-cookbook-key-71c2"
SERVED_NAME = "Qwen/Qwen3-4B-Instruct-2507"  # in the cookbook's tables, rendered by its qwen3_instruct renderer
RECIPE_TIMEOUT_S = 600  # about 15 s each on 2 idle cores, most of it importing the cookbook


def cookbook_python() -> Path:
    return Path(os.environ.get("CLAWR1_COOKBOOK_PYTHON") or REPO / ".venv-cookbook" / "bin" / "python")


@pytest.fixture(scope="module")
def cookbook() -> str:
    """The Python of the cookbook's environment; skips (fails under CLAWR1_REQUIRE_COOKBOOK=1) where it is missing."""
    python = cookbook_python()
    probe = subprocess.run([str(python), "-c", "import importlib.metadata as m; print(m.version('tinker-cookbook'))"],
                           capture_output=True, text=True) if python.exists() else None
    if probe is None or probe.returncode != 0:
        why = (f"tinker-cookbook's environment is missing ({python}; run scripts/setup_cookbook.sh)" if probe is None
               else f"tinker-cookbook does not import with {python}: {(probe.stderr.strip().splitlines() or ['?'])[-1]}")
        if os.environ.get("CLAWR1_REQUIRE_COOKBOOK") == "1":
            pytest.fail(why)
        pytest.skip(why)
    assert probe.stdout.strip() == "0.5.8", f"these tests are written for tinker-cookbook 0.5.8, found {probe.stdout}"
    return str(python)


@pytest.fixture(scope="module")
def served(cookbook, tiny_model, tmp_path_factory):
    """The URL of a tinker-serve of the tiny model named SERVED_NAME."""
    run_dir = tmp_path_factory.mktemp("cookbook") / "run"
    with tinker_serve(run_dir, tiny_model, KEY, 2, f"tinker.model_name={SERVED_NAME}") as url:
        yield url


def run_recipe(python: str, url: str, recipe: str, log_path: Path, *settings: str) -> list[dict]:
    """Runs `python -m tinker_cookbook.recipes.<recipe>.train` on a machine that has nothing of the model: no Hub
    access but the server's (HF_ENDPOINT), an empty Hub cache of its own. Returns its metrics.jsonl lines."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "WANDB_", "TINKER_"))}
    env.update(TINKER_API_KEY=KEY, TINKER_TELEMETRY="0", HF_ENDPOINT=f"{url}/hub", HF_TOKEN=KEY,
               HF_HOME=str(log_path.parent / f"{recipe}-hf"), HF_HUB_DISABLE_TELEMETRY="1")
    out = subprocess.run([python, "-m", f"tinker_cookbook.recipes.{recipe}.train", f"base_url={url}",
                          f"model_name={SERVED_NAME}", "max_steps=2", f"log_path={log_path}",
                          "behavior_if_log_dir_exists=delete", *settings],
                         cwd=log_path.parent, env=env, capture_output=True, text=True, timeout=RECIPE_TIMEOUT_S)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    assert "Training completed successfully" in out.stdout + out.stderr
    return [json.loads(line) for line in (log_path / "metrics.jsonl").read_text().splitlines()]


def final_checkpoint(log_path: Path) -> dict:
    rows = [json.loads(line) for line in (log_path / "checkpoints.jsonl").read_text().splitlines()]
    assert rows and rows[-1]["name"] == "final", rows
    return rows[-1]


def assert_saved_on_the_server(url: str, checkpoint: dict) -> None:
    """The server lists the recipe's final state and sampler weights under the paths the cookbook logged, as the
    base model it served, through the SDK's RestClient."""
    tinker = pytest.importorskip("tinker")
    state, sampler = checkpoint["state_path"], checkpoint["sampler_path"]
    run_id = state.removeprefix("tinker://").split("/")[0]
    os.environ["TINKER_TELEMETRY"] = "0"
    service = tinker.ServiceClient(base_url=url, api_key=KEY)
    try:
        rest = service.create_rest_client()
        assert rest.get_training_run(run_id).result().base_model == SERVED_NAME
        listed = {c.tinker_path for c in rest.list_checkpoints(run_id).result().checkpoints}
        assert {state, sampler} <= listed, listed
    finally:
        service.close("success").result(timeout=30)


def test_the_cookbooks_math_rl_recipe_trains_two_steps_unchanged(cookbook, served, tmp_path):
    url = served
    log_path = tmp_path / "math_rl"
    metrics = run_recipe(cookbook, url, "math_rl", log_path, "env=arithmetic", "group_size=4", "groups_per_batch=2")
    assert [row["progress/batch"] for row in metrics] == [0, 1]
    for row in metrics:  # every step sampled 2 groups of 4 episodes through the server's engine, and trained
        assert row["env/all/total_episodes"] == 8 and row["env/all/total_ac_tokens"] > 0
        assert math.isfinite(row["grad_norm:mean"]) and row["optim/lr"] > 0
    assert_saved_on_the_server(url, final_checkpoint(log_path))


def test_the_cookbooks_chat_sl_recipe_trains_two_steps_on_its_bundled_conversations(cookbook, served, tmp_path):
    url = served
    conversations = subprocess.run(
        [cookbook, "-c", "import importlib.resources as r; "
                         "print(r.files('tinker_cookbook') / 'example_data' / 'conversations.jsonl')"],
        capture_output=True, text=True, check=True).stdout.strip()
    log_path = tmp_path / "chat_sl"
    metrics = run_recipe(cookbook, url, "chat_sl", log_path, f"dataset={conversations}", "batch_size=4",
                         "max_length=512")
    assert [row["step"] for row in metrics] == [0, 1]
    for row in metrics:  # the server's cross_entropy log-probs came back, and its gradient reached the adapter
        assert row["num_sequences"] == 4 and 0 < row["train_mean_nll"] < math.inf
        assert row["grad_norm:mean"] > 0
    assert_saved_on_the_server(url, final_checkpoint(log_path))
