"""Learning IV's tables: recomputed from the committed JSON they must equal the committed table; on made-up
per-user values, a clear difference is a win, a small one a tie, and the rule picks users as it says."""
from __future__ import annotations

import json
import subprocess
import sys

import benchmarks.learning_iv_rows as rows_module
from benchmarks.learning_iv_rows import choose, row_runs, run_row, shared_settings
from benchmarks.runs import Run
from benchmarks.learning_iv_table import DATA, render_tables, write_tables
from tests.conftest import REPO


def test_the_committed_table_is_what_the_committed_json_gives():
    assert (DATA / "table.md").exists(), "docs/benchmarks/learning-iv/table.md is missing"
    assert render_tables(DATA) == (DATA / "table.md").read_text(), \
        "table.md differs from its JSON: run `python benchmarks/learning_iv.py table` and commit both"


def test_the_recompute_command_runs_on_the_committed_data():
    out = subprocess.run([sys.executable, "benchmarks/learning_iv.py", "table"], cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("# Learning IV")


def probe_result(profile: dict, without: dict, hinted: dict) -> dict:
    return {"profile": profile, **{f"hinted_{k}": hinted[k] for k in profile},
            **{f"uptake_{k}": hinted[k] - without[k] for k in profile}}


def test_the_rule_keeps_kinds_taken_up_that_the_base_does_not_already_do():
    profile = {"format": "plain", "tone": "sure", "closing": "none", "length": "short"}
    probed = {
        7: probe_result(profile, {"format": 0.0, "tone": 0.0, "closing": 0.4, "length": 0.5},
                        {"format": 0.25, "tone": 0.81, "closing": 0.75, "length": 0.9}),
        3: probe_result(profile, {"format": 0.0, "tone": 0.0, "closing": 0.0, "length": 0.0},
                        {"format": 0.0, "tone": 0.1, "closing": 0.2, "length": 0.0}),
    }
    probed[9] = probed[7]  # another seed drew the same wishes: the same user again
    # 7: tone (+0.81 from 0), closing (+0.35 from 0.4); not format (+0.25), not length (the base did it half
    # the time); 3: nothing counts, so 3 is not chosen; 9 holds what 7 holds
    assert choose(probed) == {"7": ["tone", "closing"]}
    many = {u: probe_result({"tone": "sure", "format": ["plain", "tags", "sentence"][u % 3], "closing": "none"},
                            {"tone": 0.0, "format": 0.0, "closing": 0.0}, {"tone": 0.9, "format": 0.5, "closing": 0.0})
            for u in range(20)}
    assert list(choose(many)) == ["0", "1", "2"]  # three different users only, though all 20 take hints
    settings = shared_settings({"7": ["tone", "closing"], "12": ["format"]}, 16)
    assert "rollout.env_args.user_kinds={7: [tone, closing], 12: [format]}" in settings
    assert {"lora.per_user=true", "lora.slots=2", "pool.batch_size=8", "rollout.env_args.users=[7, 12]"} <= set(settings)


def write_row(data, row: str, values: dict[str, list[float]]) -> None:
    recipes = {r: {"run": r, "overrides": [], "minutes": 1.0,
                   "users": {str(u): {"final": v, "area": v / 2, "curve": [[0, 0.0], [16, v]]}
                             for u, v in enumerate(vs)}} for r, vs in values.items()}
    (data / "runs").mkdir(parents=True, exist_ok=True)
    (data / "runs" / f"{row}.json").write_text(json.dumps({"row": row, "recipes": recipes}))


def test_a_clear_difference_wins_and_a_small_one_ties(tmp_path):
    users = 10
    base = [0.1 * (u % 5) for u in range(users)]  # users differ; pairing cancels it
    write_row(tmp_path, "directive-16", {
        "binary_rl": base,
        "opd": [b + 0.4 for b in base],
        "combined": [b + 0.4 + (0.02 if u % 2 else -0.02) for u, b in enumerate(base)],
    })
    text = render_tables(tmp_path)
    rows = {tuple(cell.strip() for cell in line.split("|")[3:5]): line for line in text.splitlines()
            if line.startswith("| directive-16 | combined |")}
    assert len(rows) == 4  # two others x two metrics, Holm over the four
    assert rows[("binary_rl", "final")].rstrip(" |").endswith("combined wins")
    assert rows[("opd", "final")].rstrip(" |").endswith("tie")  # +-0.02 by turns: no difference
    assert "| combined | 0.600 ± 0.151 |" in text  # mean and sample std over the 10 users
    assert write_tables(tmp_path) == text and (tmp_path / "table.md").read_text() == text
    assert (tmp_path / "directive-16.png").read_bytes().startswith(b"\x89PNG")  # the curves the table links


def test_the_runner_skips_a_run_whose_results_are_committed_and_starts_the_others(tmp_path, monkeypatch):
    monkeypatch.setattr(rows_module, "DATA", tmp_path)
    (tmp_path / "users.json").write_text(json.dumps({"evaluation": {"7": ["tone"], "12": ["format"]}}))
    runs = row_runs("directive-16")
    # binary RL's results were committed on another machine: its run directory is not here
    write_row(tmp_path, "directive-16", {"binary_rl": [0.5, 0.25]})
    saved = json.loads((tmp_path / "runs/directive-16.json").read_text())
    saved["recipes"]["binary_rl"]["run"] = runs["binary_rl"].path.name
    (tmp_path / "runs/directive-16.json").write_text(json.dumps(saved))
    started = []

    def start(run: Run) -> float:  # a learning run is an hour of CPU: the test checks which ones would start
        started.append(run.name)
        raise SystemExit("stop after the first run started")

    monkeypatch.setattr(Run, "start", start)
    try:
        run_row("directive-16")
    except SystemExit:
        pass
    assert started == ["opd"]


def test_the_runner_trains_no_more_runs_than_it_is_given(tmp_path, monkeypatch):
    monkeypatch.setattr(rows_module, "DATA", tmp_path)
    (tmp_path / "users.json").write_text(json.dumps({"evaluation": {"7": ["tone"], "12": ["format"]}}))
    started, saved = [], []
    monkeypatch.setattr(Run, "start", lambda run: started.append(run.name) or 1.0)
    monkeypatch.setattr(rows_module, "save_result", lambda row, name, run, minutes: saved.append(name))
    assert run_row("directive-16", limit=2) == 2
    assert started == ["binary_rl", "opd"] and saved == ["binary_rl", "opd"]
    assert run_row("directive-16", limit=0) == 0 and len(started) == 2


def test_every_committed_run_has_the_name_the_runner_gives_it_now():
    """A config change that renames a committed run (a new field not listed in benchmarks/run_cache.py's
    NEUTRAL_DEFAULTS, a renamed one not in RENAMED_FIELDS) would make the runner train it again."""
    for path in sorted((DATA / "runs").glob("*.json")):
        saved = json.loads(path.read_text())
        runs = row_runs(saved["row"])
        for name, result in saved["recipes"].items():
            assert result["run"] == runs[name].path.name, f"{path.name}: {name} is now {runs[name].path.name}"
