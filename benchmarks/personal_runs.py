"""One run of the personalization benchmark (its sweep, benchmarks/personalization.py, and its fair protocol,
benchmarks/fair.py): the settings for a judge accuracy and a setting, and where the run lives.

A judge of accuracy a errs with probability 1 - a: in the realistic setting it flips scores (judge.score_noise)
and spoils hints (judge.hint_noise, judge.hint_drop: half each) while users word their wishes freely
(rollout.env_args.phrasing=free); in the oracle setting users say the warm start's directives and only scores err.
"""
from __future__ import annotations

from pathlib import Path

from benchmarks.runs import REPO, Run

SETTINGS = ("realistic", "oracle")


def judge_settings(accuracy: float, setting: str) -> list[str]:
    """realistic: users word their wishes freely, and the judge errs at rate 1 - accuracy in its scores and in its
    hints (half of the hint errors a wrong hint, half a lost one); oracle (the setting before issue 33): users
    say the warm start's directives word for word, and only the scores err."""
    error = 1 - accuracy
    if setting == "oracle":
        return ["rollout.env_args.phrasing=canonical", f"judge.score_noise={error:g}"]
    return ["rollout.env_args.phrasing=free", f"judge.score_noise={error:g}", f"judge.hint_noise={error / 2:g}",
            f"judge.hint_drop={error / 2:g}"]


def run_settings(accuracy: float, profile: int, seed: int, steps: int, extra: list[str],
                 setting: str = "realistic") -> list[str]:
    return [f"run.seed={seed}", f"run.max_steps={steps}", f"rollout.env_args.profile_seed={profile}",
            *judge_settings(accuracy, setting), *extra]


def personal_run(out: Path, recipe: str, accuracy: float, profile: int, seed: int, steps: int, extra: list[str],
                 recipe_file: str = "cpu.yaml", setting: str = "realistic") -> Run:
    """recipes/<recipe>/<recipe_file> for user `profile`, in out/<setting>/acc<accuracy>/p<profile>/<recipe>-s<seed>-<hash>."""
    return Run(out / setting / f"acc{accuracy:g}" / f"p{profile}", f"{recipe}-s{seed}",
               REPO / "recipes" / recipe / recipe_file,
               tuple(run_settings(accuracy, profile, seed, steps, extra, setting)))
