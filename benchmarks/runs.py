"""The one runner for the benchmarks that train runs to the end (benchmarks/personalization.py, its fair
protocol in benchmarks/fair.py, benchmarks/lora_users.py): a run's directory, named by its settings; the cache;
the start; the held-out scores read back.

A run directory's name ends in a hash of the run's resolved config (benchmarks/run_cache.py: a run cached
before keeps its name while its settings hold), so other overrides, or an edited recipe, never reuse it.
The cache is the run directory itself: a finished run, one with a summary.json, is kept and never run again,
so a benchmark resumes where it stopped.
"""
from __future__ import annotations

import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.run_cache import run_path  # noqa: E402
from clawr1.config import load_config  # noqa: E402
from clawr1.report import load_run  # noqa: E402
from clawr1.tracking import read_metrics  # noqa: E402
from clawr1.tracking import read_metrics  # noqa: E402


@dataclass(frozen=True)
class Run:
    """One run of `recipe` (a file under the repository) with `overrides`, in parent/<name>-<settings hash>.

    The overrides name the directory and start the run, so a cached run always has the settings asked for."""

    parent: Path
    name: str
    recipe: Path
    overrides: tuple[str, ...]

    @cached_property
    def path(self) -> Path:
        return run_path(self.parent, self.name, self.recipe, list(self.overrides))

    @property
    def finished(self) -> bool:
        """It trained to its last step and, where it evaluates, evaluated its last version (a run stopped during
        its final evaluation is resumed for it)."""
        if not (self.path / "summary.json").exists():
            return False
        if not (self.path / "config.yaml").exists():
            return True  # not a run `clawr1 run` made (a hand-built one): its summary says it ended
        cfg = load_config(self.path / "config.yaml")
        return not cfg.rollout.eval_every or any(r.get("eval_version") == cfg.run.max_steps
                                                 for r in read_metrics(self.path, "rollout"))

    def start(self) -> float:
        """Run it to the end unless it finished before: the minutes it took (0: cached). A run stopped part way
        (its directory holds a pool) continues from its newest checkpoint. Its output goes to <path>.out beside
        the run directory; a run that fails ends the benchmark."""
        if self.finished:
            return 0.0
        path = self.path
        path.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        resume = (path / "pool").is_dir()  # stopped part way, or before its final evaluation
        cmd = [sys.executable, "-m", "clawr1.cli", "run", str(self.recipe.relative_to(REPO)), f"run.dir={path}",
               *self.overrides, "--resume" if resume else "--overwrite"]
        log_path = path.parent / f"{path.name}.out"
        with open(log_path, "a" if resume else "w") as log:
            code = subprocess.run(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT).returncode
        if code != 0:
            raise SystemExit(f"{' '.join(cmd)} exited {code}; see {log_path}")
        return (time.monotonic() - t0) / 60


def final_and_area(curve: list[tuple[int, float]]) -> tuple[float, float]:
    """(final held-out score, area under the score curve: the mean over evaluated versions)."""
    return curve[-1][1], statistics.fmean(v for _, v in curve)


def scores(path: Path) -> tuple[float, float]:
    """The run's final held-out score and area (`final_and_area` of its mean score curve)."""
    return final_and_area(load_run(path).series["score"])


def last_evaluation(path: Path) -> dict:
    """The metrics row of the run's held-out evaluation of its latest version."""
    evals = [r for r in read_metrics(path) if r.get("loop") == "rollout" and "eval_metric" in r]
    return max(evals, key=lambda r: r["eval_version"])
