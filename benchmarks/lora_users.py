"""Two users in one run, one LoRA adapter each, against each user alone and against one full-parameter policy
for both (issue 29's acceptance), over seeds, with the spread.

Per seed, the combined recipe (recipes/combined/cpu.yaml) with a judge of accuracy `--judge-accuracy`:
- per_user: users 0 and 1 (envs/personal profiles 0 and 1) at once, half the episodes each, one adapter per
  user (lora.per_user, 2 slots), `--steps` steps;
- single_u0, single_u1: that user alone, one adapter, half the steps: the same number of that user's samples;
- full_mixed: both users' traffic, one full-parameter policy (the recipe's own lr), `--steps` steps.
Each user's score is their held-out personalization score at the run's last evaluation.

Usage: python benchmarks/lora_users.py [--seeds 3] [--steps 150] [--lora-lr 3e-3] [--judge-accuracy 0.7]
                                       [--out runs/lora_users] [override ...]
A finished run (one with a summary.json) is kept, so the command can be resumed; a run directory's name ends
in a hash of its settings, so other overrides never reuse it (benchmarks/runs.py). Prints one JSON line and
writes OUT/results.md.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.runs import Run, last_evaluation  # noqa: E402
from benchmarks.stats import mean_std  # noqa: E402

USERS = (0, 1)
RECIPE = REPO / "recipes/combined/cpu.yaml"


def configs(steps: int, lora_lr: float) -> dict[str, list[str]]:
    lora = ["lora.enabled=true", f"trainer.lr={lora_lr:g}"]
    both = ["rollout.env_args.users=[0,1]"]
    return {
        "per_user": [*lora, "lora.per_user=true", "lora.slots=2", *both, f"run.max_steps={steps}"],
        "single_u0": [*lora, "rollout.env_args.profile_seed=0", f"run.max_steps={steps // 2}"],
        "single_u1": [*lora, "rollout.env_args.profile_seed=1", f"run.max_steps={steps // 2}"],
        "full_mixed": [*both, f"run.max_steps={steps}"],
    }


def settings(seed: int, accuracy: float, overrides: list[str], extra: list[str]) -> list[str]:
    return [f"run.seed={seed}", f"judge.score_noise={1 - accuracy:g}", *overrides, *extra]


def finished_run(out: Path, name: str, seed: int, accuracy: float, overrides: list[str], extra: list[str]) -> Path:
    """The run directory of configuration `name` for this seed, run to the end unless it finished before."""
    run = Run(out, f"{name}-s{seed}", RECIPE, tuple(settings(seed, accuracy, overrides, extra)))
    if not run.finished:
        print(f"[lora_users] {run.path.name}: {' '.join(overrides)}", flush=True)
    run.start()
    return run.path


def final_scores(path: Path) -> dict[int, float]:
    """Each user's held-out score at the run's last evaluation (a one-user run: its own user only)."""
    last = last_evaluation(path)
    per_user = {u: last[f"personalization_score_u{u}"] for u in USERS if f"personalization_score_u{u}" in last}
    if per_user:
        return per_user
    return {int(path.name.split("single_u")[1].split("-")[0]): last["personalization_score"]}  # single_u<user>-s..


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--lora-lr", type=float, default=3e-3)
    p.add_argument("--judge-accuracy", type=float, default=0.7)
    p.add_argument("--out", default="runs/lora_users")
    p.add_argument("overrides", nargs="*", help="more config overrides for every run")
    args = p.parse_args()
    out = REPO / args.out
    scores: dict[str, dict[int, list[float]]] = {}
    for seed in range(args.seeds):
        for name, overrides in configs(args.steps, args.lora_lr).items():
            path = finished_run(out, name, seed, args.judge_accuracy, overrides, args.overrides)
            for user, score in final_scores(path).items():
                scores.setdefault(name, {}).setdefault(user, []).append(score)
    single = {u: scores[f"single_u{u}"][u] for u in USERS}
    result = {name: {f"u{u}": mean_std(v) for u, v in by_user.items()} for name, by_user in scores.items()}
    gaps = {f"u{u}": mean_std([a - b for a, b in zip(scores["per_user"][u], single[u])]) for u in USERS}
    full_gaps = {f"u{u}": mean_std([a - b for a, b in zip(scores["full_mixed"][u], scores["per_user"][u])])
                 for u in USERS}
    summary = {"steps": args.steps, "lora_lr": args.lora_lr, "judge_accuracy": args.judge_accuracy,
               "seeds": args.seeds, "scores": result, "per_user_minus_single": gaps,
               "full_mixed_minus_per_user": full_gaps}
    (out / "results.md").write_text(markdown(summary))
    print(json.dumps(summary))
    return 0


def markdown(s: dict) -> str:
    def cell(d: dict) -> str:
        return f"{d['mean']:.3f} ± {d['std']:.3f} ({', '.join(f'{v:.3f}' for v in d['runs'])})"

    lines = [f"{s['seeds']} seeds, {s['steps']} steps (single-user runs: {s['steps'] // 2}), judge accuracy "
             f"{s['judge_accuracy']:g}, LoRA lr {s['lora_lr']:g}\n", "| run | user 0 | user 1 |", "|---|---|---|"]
    for name, by_user in s["scores"].items():
        lines.append(f"| {name} | " + " | ".join(cell(by_user[f"u{u}"]) if f"u{u}" in by_user else "" for u in USERS) + " |")
    lines.append("| per_user − single | " + " | ".join(cell(s["per_user_minus_single"][f"u{u}"]) for u in USERS) + " |")
    lines.append("| full_mixed − per_user | " + " | ".join(cell(s["full_mixed_minus_per_user"][f"u{u}"]) for u in USERS)
                 + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
