"""The personalization benchmark's fair protocol (`benchmarks/personalization.py --protocol fair`).

1. Tuning: each recipe picks its lr, and OPD also its teacher, from a small grid, by the mean area under the
   held-out curve on the tuning users and seeds, in the realistic setting at the tuning judge accuracy.
2. Evaluation: only the chosen settings run, on users never used for tuning or in tests, with new seeds, at
   every judge accuracy, in the realistic setting and in the oracle one (the setting before issue 33).
3. Report: per accuracy and setting, each recipe's final score and area (mean, sample std), and a paired
   bootstrap 95% interval for combined minus the best of the others, over (user, seed) pairs; a PNG of the
   curves with a band over runs per accuracy and setting.

Every run is cached by its settings (benchmarks/runs.py), so the protocol resumes where it stopped, and
`--report-only` summarizes what has finished without running anything.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from benchmarks.bands import plot_bands
from benchmarks.personal_runs import SETTINGS, personal_run
from benchmarks.runs import scores
from benchmarks.stats import paired_bootstrap, sample_std
from clawr1.report import load_run
from envs.personal.env import make_profile
from envs.personal.preferences import KINDS


@dataclass(frozen=True)
class Choice:
    """A recipe with the settings of one grid point."""

    recipe: str
    overrides: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        short = (f"{key.rsplit('.', 1)[-1]}={value}" for key, value in (o.split("=", 1) for o in self.overrides))
        return " ".join([self.recipe, *dict.fromkeys(short)])


@dataclass
class Outcome:
    final: float
    area: float
    curve: list[tuple[int, float]]
    uptake: Optional[float] = None  # the teacher probe's hint uptake on the base model, mean over kinds


# the fixes issue 33 names besides the uptake weight (which is measured: see `compare_fixes`)
FIXES = (("OPD gate", ("algo.opd_gate=signal",)), ("balance std", ("algo.balance=std",)))


def grid(recipe: str, lrs: list[str], teachers: list[str]) -> list[Choice]:
    teacher_options = [f"judge.teacher={t}" for t in teachers] if recipe == "opd" else [None]
    return [Choice(recipe, tuple(o for o in (f"trainer.lr={lr}", teacher) if o))
            for lr in lrs for teacher in teacher_options]


class Runner:
    """Runs (or, with report_only, only reads) one configuration at a time, cached by its settings."""

    def __init__(self, args: argparse.Namespace):
        self.args, self.out = args, Path(args.out)

    def outcome(self, choice: Choice, accuracy: float, setting: str, user: int, seed: int) -> Optional[Outcome]:
        a = self.args
        extra = [*choice.overrides, *a.overrides]
        run = personal_run(self.out, choice.recipe, accuracy, user, seed, a.steps, extra, a.recipe_file, setting)
        ran = not run.finished
        if ran and a.report_only:
            return None
        took = run.start()
        final, area = scores(run.path)
        if ran:
            print(f"[fair] {setting} acc {accuracy:g} user {user} seed {seed} {choice.label}: final {final:.3f} "
                  f"area {area:.3f} ({took:.1f} min)", file=sys.stderr, flush=True)
        curves = load_run(run.path)
        first_probe = curves.teacher.get(min(curves.teacher)) if curves.teacher else {}
        uptakes = [v for k, v in first_probe.items() if k.startswith("uptake_")]
        return Outcome(final, area, curves.series["score"], statistics.fmean(uptakes) if uptakes else None)


def tune(runner: Runner, recipes: list[str], lrs: list[str], teachers: list[str], accuracy: float,
         users: list[int], seeds: list[int]) -> tuple[dict[str, Choice], list[str]]:
    """The choice with the best mean area per recipe, and the tuning table's markdown rows."""
    chosen, rows = {}, ["| recipe | candidate | mean final | mean area | runs |", "|---|---|---|---|---|"]
    for recipe in recipes:
        best = None
        for choice in grid(recipe, lrs, teachers):
            got = [runner.outcome(choice, accuracy, "realistic", u, s) for u in users for s in seeds]
            done = [o for o in got if o is not None]
            if not done:
                continue
            area = statistics.fmean(o.area for o in done)
            rows.append(f"| {recipe} | {choice.label} | {statistics.fmean(o.final for o in done):.3f} | {area:.3f} | "
                        f"{len(done)}/{len(got)} |")
            if len(done) == len(got) and (best is None or area > best[0]):
                best = (area, choice)
        if best is not None:
            chosen[recipe] = best[1]
    return chosen, rows


def compare(outcomes: dict[str, list[Outcome]], metric: str) -> Optional[str]:
    """'combined - <best other>: mean [lo, hi]' over the pairs, the best other by its mean of `metric`."""
    others = [r for r in outcomes if r != "combined"]
    if "combined" not in outcomes or not others:
        return None
    values = {r: [getattr(o, metric) for o in runs] for r, runs in outcomes.items()}
    best = max(others, key=lambda r: statistics.fmean(values[r]))
    mean, lo, hi = paired_bootstrap(values["combined"], values[best])
    return f"combined - {best}: {mean:+.3f} [{lo:+.3f}, {hi:+.3f}]"


def evaluate(runner: Runner, chosen: dict[str, Choice], accuracies: list[float], settings: list[str],
             users: list[int], seeds: list[int]) -> tuple[list[str], dict]:
    """The evaluation table's markdown rows and the JSON results; draws the band PNGs."""
    rows = ["| judge accuracy | setting | recipe (chosen settings) | final (mean ± sample std) | area (mean ± sample std) "
            "| pairs | combined − best other, final [95% CI] | combined − best other, area [95% CI] |",
            "|---|---|---|---|---|---|---|---|"]
    results = {}
    for accuracy in accuracies:
        for setting in settings:
            pairs = [(u, s) for u in users for s in seeds]
            got = {r: [runner.outcome(c, accuracy, setting, u, s) for u, s in pairs] for r, c in chosen.items()}
            complete = [i for i in range(len(pairs)) if all(got[r][i] is not None for r in chosen)]
            if not complete:
                continue
            outcomes = {r: [got[r][i] for i in complete] for r in chosen}
            final_cmp, area_cmp = compare(outcomes, "final"), compare(outcomes, "area")
            for r, runs in outcomes.items():
                finals, areas = [o.final for o in runs], [o.area for o in runs]
                key = f"{setting}/acc{accuracy:g}/{r}"
                results[key] = {"choice": chosen[r].label, "final_mean": round(statistics.fmean(finals), 4),
                                "final_std": round(sample_std(finals), 4), "area_mean": round(statistics.fmean(areas), 4),
                                "area_std": round(sample_std(areas), 4), "pairs": len(runs)}
                rows.append(f"| {accuracy:g} | {setting} | {chosen[r].label} | {statistics.fmean(finals):.3f} ± "
                            f"{sample_std(finals):.3f} | {statistics.fmean(areas):.3f} ± {sample_std(areas):.3f} | "
                            f"{len(runs)}/{len(pairs)} | {final_cmp if r == 'combined' else ''} | "
                            f"{area_cmp if r == 'combined' else ''} |")
            results[f"{setting}/acc{accuracy:g}/interval_final"] = final_cmp
            results[f"{setting}/acc{accuracy:g}/interval_area"] = area_cmp
            plot_bands({chosen[r].label: [o.curve for o in runs] for r, runs in outcomes.items()},
                       f"{setting}, judge accuracy {accuracy:g}: users {users}, "
                       f"seeds {sorted({pairs[i][1] for i in complete})}",
                       runner.out / f"fair-bands-{setting}-acc{accuracy:g}.png")
    return rows, results


def compare_groups(runner: Runner, chosen: dict[str, Choice], size: int, accuracy: float, users: list[int],
                   seeds: list[int]) -> list[str]:
    """Markdown rows: each RL recipe's chosen settings with GRPO groups of `size` (rollout.env_args.group_size and
    pool.group_size) against the same without, on the evaluation pairs in the realistic setting."""
    rows = [f"| recipe | pairs | without groups: final, area | groups of {size}: final, area "
            "| groups − none, final [95% CI] | groups − none, area [95% CI] |", "|---|---|---|---|---|---|"]
    grouped_overrides = (f"rollout.env_args.group_size={size}", f"pool.group_size={size}")
    for recipe in (r for r in ("binary_rl", "combined") if r in chosen):
        plain, grouped = chosen[recipe], Choice(recipe, chosen[recipe].overrides + grouped_overrides)
        both = [(runner.outcome(plain, accuracy, "realistic", u, s), runner.outcome(grouped, accuracy, "realistic", u, s))
                for u in users for s in seeds]
        both = [(a, b) for a, b in both if a is not None and b is not None]
        if not both:
            continue
        rows.append(f"| {plain.label} | {paired_cells([b for _, b in both], [a for a, _ in both])} |")
    return rows


def compare_fixes(runner: Runner, combined: Choice, accuracy: float, settings: list[str], users: list[int],
                  seeds: list[int]) -> list[str]:
    """Markdown rows: combined's chosen settings with each fix against the same without, on the tuning pairs.

    The uptake weight sets w_opd to the teacher probe's measured hint uptake on the base model (mean over kinds
    and the pairs' runs without a fix, clamped to [0, 1]): a teacher whose hints do not move it toward the wish
    gets no weight."""
    rows = ["| setting | fix | pairs | without: final, area | with: final, area | with − without, final [95% CI] "
            "| with − without, area [95% CI] |", "|---|---|---|---|---|---|---|"]
    pairs = [(u, s) for u in users for s in seeds]
    for setting in settings:
        plain = [runner.outcome(combined, accuracy, setting, u, s) for u, s in pairs]
        if any(o is None for o in plain):
            continue
        uptakes = [o.uptake for o in plain if o.uptake is not None]
        weight = min(max(statistics.fmean(uptakes), 0.0), 1.0) if uptakes else None
        fixes = [*FIXES] + ([] if weight is None else [(f"w_opd = uptake {weight:.2f}", (f"algo.w_opd={weight:.2f}",))])
        for name, overrides in fixes:
            fixed = [runner.outcome(Choice(combined.recipe, combined.overrides + overrides), accuracy, setting, u, s)
                     for u, s in pairs]
            both = [(a, b) for a, b in zip(plain, fixed) if b is not None]
            if both:
                rows.append(f"| {setting} | {name} | {paired_cells([b for _, b in both], [a for a, _ in both])} |")
    return rows


def paired_cells(treated: list[Outcome], control: list[Outcome]) -> str:
    """'pairs | control means | treated means | treated − control final [CI] | ... area [CI]' (cells of a row)."""
    def means(runs: list[Outcome]) -> str:
        return f"{statistics.fmean(o.final for o in runs):.3f}, {statistics.fmean(o.area for o in runs):.3f}"

    cells = []
    for metric in ("final", "area"):
        mean, lo, hi = paired_bootstrap([getattr(o, metric) for o in treated], [getattr(o, metric) for o in control])
        cells.append(f"{mean:+.3f} [{lo:+.3f}, {hi:+.3f}]")
    return f"{len(treated)} | {means(control)} | {means(treated)} | {cells[0]} | {cells[1]}"


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("fair protocol (--protocol fair)")
    g.add_argument("--lr-grid", default="1e-4,2e-4,4e-4")
    g.add_argument("--opd-teachers", default="frozen,lagged,policy", help="OPD's teacher grid (policy: itself)")
    g.add_argument("--tune-users", default="0,1,2,3")
    g.add_argument("--tune-seeds", default="0,1")
    g.add_argument("--tune-accuracy", type=float, default=0.7)
    # profile seeds no test and no earlier benchmark used, whose profiles differ from the tuning users' (1000 and
    # 1003 hold the profiles of users 3 and 0: refused)
    g.add_argument("--eval-users", default="1001,1002,1004,1005")
    g.add_argument("--eval-seeds", default="10,11")
    g.add_argument("--settings", default=",".join(SETTINGS), help="realistic and/or oracle")
    g.add_argument("--report-only", action="store_true", help="run nothing: summarize the finished runs")
    g.add_argument("--groups", type=int, default=0,
                   help="also compare GRPO groups of this size with none (binary_rl, combined; tuning accuracy)")
    g.add_argument("--fixes", action="store_true",
                   help="also run combined's chosen settings with each fix on the tuning pairs (tuning accuracy)")


def check_users(tuning: list[int], evaluation: list[int]) -> None:
    """Evaluation users must be new people: no profile of a tuning user, no two alike."""
    tuned = {tuple(make_profile(u, list(KINDS)).items()): u for u in tuning}
    seen: dict[tuple, int] = {}
    for u in evaluation:
        profile = tuple(make_profile(u, list(KINDS)).items())
        if profile in tuned or profile in seen:
            twin = tuned.get(profile, seen.get(profile))
            raise SystemExit(f"evaluation user {u} has the profile of user {twin}: pick another (--eval-users)")
        seen[profile] = u


def main(args: argparse.Namespace) -> int:
    check_users(ints(args.tune_users), ints(args.eval_users))
    runner = Runner(args)
    recipes, accuracies = args.recipes.split(","), [float(x) for x in args.judge_accuracy.split(",")]
    chosen, tuning_rows = tune(runner, recipes, args.lr_grid.split(","), args.opd_teachers.split(","),
                               args.tune_accuracy, ints(args.tune_users), ints(args.tune_seeds))
    if set(chosen) != set(recipes):
        print(f"[fair] tuning has not finished for {sorted(set(recipes) - set(chosen))}: no evaluation yet",
              file=sys.stderr)
        eval_rows, results = [], {}
    else:
        eval_rows, results = evaluate(runner, chosen, accuracies, args.settings.split(","),
                                      ints(args.eval_users), ints(args.eval_seeds))
    if args.groups > 1 and eval_rows:
        eval_rows += ["", f"### GRPO groups of {args.groups}", "",
                      *compare_groups(runner, chosen, args.groups, args.tune_accuracy, ints(args.eval_users),
                                      ints(args.eval_seeds))]
    if args.fixes and "combined" in chosen:
        tuning_rows += ["", f"### Fixes for combined, tuning users, judge accuracy {args.tune_accuracy:g}", "",
                        *compare_fixes(runner, chosen["combined"], args.tune_accuracy, args.settings.split(","),
                                       ints(args.tune_users), ints(args.tune_seeds))]
    text = "\n".join(["## Tuning", "", *tuning_rows, "", "## Evaluation", "", *eval_rows]) + "\n"
    runner.out.mkdir(parents=True, exist_ok=True)
    (runner.out / "fair-summary.md").write_text(text)
    print(text, file=sys.stderr)
    print(json.dumps({"benchmark": "personalization", "protocol": "fair", "steps": args.steps,
                      "chosen": {r: c.label for r, c in chosen.items()}, "results": results}))
    return 0
