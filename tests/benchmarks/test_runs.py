"""The benchmark runner (benchmarks/runs.py): a finished run is the cache, a failed one ends the benchmark."""
from __future__ import annotations

import json
import subprocess

import pytest

import benchmarks.runs
from benchmarks.runs import Run, last_evaluation, scores
from clawr1.config import load_config, save_config
from tests.conftest import REPO

RECIPE = REPO / "recipes/combined/cpu.yaml"


def write_evaluations(path, rows: list[dict]) -> None:
    path.mkdir(parents=True)
    (path / "metrics.jsonl").write_text("".join(json.dumps({"loop": "rollout", "time": float(i), **r}) + "\n"
                                                for i, r in enumerate(rows)))


def _ended(run: Run, evaluated: list[int]) -> None:
    """What a run that trained to its last step leaves: its config, summary and held-out evaluations."""
    write_evaluations(run.path, [{"eval_metric": "personalization_score", "eval_version": v,
                                  "personalization_score": 0.5} for v in evaluated])
    save_config(load_config(RECIPE, list(run.overrides)), run.path / "config.yaml")
    (run.path / "summary.json").write_text("{}")


def test_a_finished_run_is_not_started_again(tmp_path):
    run = Run(tmp_path, "combined-s1", RECIPE, ("run.max_steps=3", "rollout.eval_every=2"))
    assert run.path.parent == tmp_path and run.path.name.startswith("combined-s1-") and not run.finished
    _ended(run, [0, 2, 3])
    assert run.finished and run.start() == 0.0
    assert sorted(tmp_path.iterdir()) == [run.path]  # no log: nothing ran


def test_a_run_stopped_before_its_final_evaluation_is_not_finished(tmp_path):
    run = Run(tmp_path, "combined-s1", RECIPE, ("run.max_steps=3", "rollout.eval_every=2"))
    _ended(run, [0, 2])  # trained to step 3, stopped while version 3 was evaluated
    assert not run.finished
    never = Run(tmp_path, "combined-s2", RECIPE, ("run.max_steps=3", "rollout.eval_every=0"))
    _ended(never, [])
    assert never.finished  # a run that does not evaluate is finished when it trained


def test_a_run_that_fails_ends_the_benchmark_and_names_its_log(tmp_path):
    run = Run(tmp_path / "sweep", "combined-s1", RECIPE, ("run.max_steps=3",))
    run.path.parent.mkdir()
    run.path.write_text("a file where the run directory should be")  # `clawr1 run` cannot use it: exits non-zero
    with pytest.raises(SystemExit, match=f"run.dir={run.path} run.max_steps=3 --overwrite exited 1; see "
                                         f"{run.path.parent / (run.path.name + '.out')}"):
        run.start()
    assert str(run.path) in (run.path.parent / f"{run.path.name}.out").read_text()  # the CLI's own error


def test_scores_are_the_last_and_the_mean_of_the_held_out_curve_in_version_order(tmp_path):
    rows = [{"eval_metric": "personalization_score", "eval_version": v, "personalization_score": s,
             "personalization_score_u0": s / 2} for v, s in ((50, 0.5), (0, 0.25), (25, 0.75))]
    write_evaluations(tmp_path / "run", rows)
    final, area = scores(tmp_path / "run")
    assert (final, area) == (0.5, 0.5)  # exact binary fractions: their sum and mean round nowhere
    assert last_evaluation(tmp_path / "run")["personalization_score_u0"] == 0.25


def test_a_run_stopped_part_way_continues_from_its_checkpoint_and_keeps_its_log(tmp_path, monkeypatch):
    # the runner's choice of flags only: `clawr1 run --resume` itself is tested end to end (tests/e2e)
    run = Run(tmp_path, "combined-s1", RECIPE, ("run.max_steps=3",))
    (run.path / "pool").mkdir(parents=True)  # what a run that was stopped leaves
    log = tmp_path / f"{run.path.name}.out"
    log.write_text("the first sitting's output\n")
    started = []

    def fake_run(cmd, cwd, stdout, stderr):
        started.append(cmd)
        stdout.write("the second sitting's output\n")
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(benchmarks.runs.subprocess, "run", fake_run)
    run.start()
    assert started[0][-2:] == ["run.max_steps=3", "--resume"]
    assert log.read_text() == "the first sitting's output\nthe second sitting's output\n"
    (run.path / "pool").rmdir()
    run.start()  # a fresh one replaces whatever is there
    assert started[1][-1] == "--overwrite" and log.read_text() == "the second sitting's output\n"
