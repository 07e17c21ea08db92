"""`clawr1 report`: curves and table from the runs' metrics.jsonl."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from clawr1.report import load_run, markdown_table, report, score_table, teacher_table
from tests.conftest import REPO


def fake_run(root: Path, name: str, w_rl: float, w_opd: float, scores: list[float]) -> Path:
    """A run directory as the loops leave it: config.yaml and metrics.jsonl."""
    run = root / name
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump({"algo": {"w_rl": w_rl, "w_opd": w_opd, "w_topk": 0.0},
                                                          "trainer": {"lr": 2e-4}}))
    rows = []
    for step in range(1, 5):
        rows.append({"loop": "trainer", "time": 100.0 + 30 * step, "step": step, "pg_loss": 0.1, "reward_mean": -1 + 0.5 * step,
                     "entropy": 1.0 - 0.1 * step, "hint_rate": 0.5, "staleness_mean": 1.0, "kl_ref": 0.0,
                     "kl_rollout": 0.01 * step})
    for version, score in zip((0, 2, 4), scores):
        rows.append({"loop": "rollout", "time": 100.0 + 30 * version, "step": version, "eval_version": version,
                     "eval_metric": "personalization_score", "personalization_score": score})
    rows.append({"loop": "judge", "time": 100.0, "step": 0, "inflight": 0})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def test_table_holds_scores_before_and_after(tmp_path):
    runs = [load_run(fake_run(tmp_path, "binary_rl", 1.0, 0.0, [0.0, 0.25, 0.5])),
            load_run(fake_run(tmp_path, "opd", 0.0, 1.0, [0.0, 0.75, 0.625]))]
    assert runs[0].series["kl"] == [(1, 0.01), (2, 0.02), (3, 0.03), (4, 0.04)]
    lines = markdown_table(runs).splitlines()
    assert lines[2] == "| binary_rl | w_rl=1.0, lr=0.0002 | 4 | 0.000 | 0.500 | 0.500 | 1.000 | 2.0 min |"
    assert lines[3] == "| opd | w_opd=1.0, lr=0.0002 | 4 | 0.000 | 0.625 | 0.750 | 1.000 | 2.0 min |"
    assert score_table(runs).splitlines() == ["| run | v0 (base) | v2 | v4 |", "|---|---|---|---|",
                                              "| binary_rl | 0.000 | 0.250 | 0.500 |", "| opd | 0.000 | 0.750 | 0.625 |"]


def test_report_writes_png_and_markdown_from_the_command_line(tmp_path):
    a, b = fake_run(tmp_path, "a", 1.0, 1.0, [0.0, 0.5, 0.9]), fake_run(tmp_path, "b", 1.0, 0.0, [0.0, 0.1, 0.2])
    out = subprocess.run([sys.executable, "-m", "clawr1.cli", "report", str(a), str(b), "--out", str(tmp_path / "cmp")],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "cmp.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (tmp_path / "cmp.md").read_text()
    assert "| a | w_rl=1.0, w_opd=1.0, lr=0.0002 | 4 | 0.000 | 0.900 |" in md and "![curves](cmp.png)" in md


def test_a_directory_without_metrics_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no metrics.jsonl"):
        report([tmp_path], tmp_path / "out")


def test_teacher_table_shows_uptake_and_auc_at_the_first_and_last_evaluation(tmp_path):
    run = fake_run(tmp_path, "combined", 1.0, 1.0, [0.0, 0.5, 0.9])
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    probes = {0: {"uptake_tone": 0.5, "auc_tone": 0.9, "uptake_units": -0.25, "auc_units": None},
              2: {"uptake_tone": 0.25, "auc_tone": 0.8, "uptake_units": 0.0, "auc_units": 0.55},
              4: {"uptake_tone": 0.0, "auc_tone": 0.75, "uptake_units": 0.125, "auc_units": 0.6}}
    for r in rows:
        if "eval_version" in r:
            r.update(probes[r["eval_version"]])
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert teacher_table([load_run(run)]).splitlines()[2:] == [
        "| combined | tone | +0.50 → +0.00 | 0.90 → 0.75 |",
        "| combined | units | -0.25 → +0.12 | - → 0.60 |"]
    assert teacher_table([load_run(fake_run(tmp_path, "plain", 1.0, 0.0, [0.0, 0.1, 0.2]))]) == ""


def test_a_prefix_with_a_dot_keeps_it(tmp_path):
    run = fake_run(tmp_path, "a", 1.0, 1.0, [0.0, 0.5, 0.9])
    png, md = report([run], tmp_path / "curves-acc0.7-p0")
    assert (png.name, md.name) == ("curves-acc0.7-p0.png", "curves-acc0.7-p0.md") and png.exists() and md.exists()
