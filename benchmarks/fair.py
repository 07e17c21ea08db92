"""The personalization benchmark's fair protocol (`benchmarks/personalization.py --protocol fair`).

1. Tuning: every recipe picks its lr from one shared grid, and OPD and combined their teacher from the same
   teacher grid, by the mean area under the held-out curve on the tuning users and seeds, where runs learn
   (by default: judge accuracy 1.0, the oracle setting's canonical hints).
2. Evaluation: only the chosen settings run, on users never used for tuning or in tests, with new seeds, at
   every judge accuracy and setting; with `--variants`, also OPD and combined with the judge's directive hints
   and the contrastive teacher baseline, and the OpenClaw-RL recipe (VARIANTS), on the same pairs; with
   `--hint-noise`, combined and OPD with directive hints that contradict at each rate, at accuracy 1.0.
3. Report: per accuracy and setting, each row's final score and area (mean, sample std) at two horizons (the
   first `--early` steps and the whole run), and a paired bootstrap 95% interval for each combined row minus the
   best row that is not combined, over (user, seed) pairs; a PNG of the curves with a band over runs.

Every run is cached by its settings (benchmarks/runs.py), so the protocol resumes where it stopped, and
`--report-only` summarizes what has finished without running anything.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass, field
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
    """A recipe with the settings of one grid point (`recipe_file`: another file of the recipe's folder than the
    benchmark's --recipe-file; `name`: what the report calls it, the recipe's name by default)."""

    recipe: str
    overrides: tuple[str, ...] = ()
    recipe_file: str = ""
    name: str = ""

    @property
    def label(self) -> str:
        short = (f"{key.rsplit('.', 1)[-1]}={value}" for key, value in (o.split("=", 1) for o in self.overrides))
        return " ".join([self.name or self.recipe, *dict.fromkeys(short)])

    @property
    def is_combined(self) -> bool:
        return self.recipe == "combined"

    def but(self, name: str, *overrides: str) -> "Choice":
        return Choice(self.recipe, self.overrides + overrides, self.recipe_file, name)


@dataclass
class Outcome:
    final: float
    area: float
    curve: list[tuple[int, float]]
    uptake: Optional[float] = None  # the teacher probe's hint uptake on the base model, mean over kinds
    early_final: float = 0.0  # the score and the area over the evaluations of the first `early` steps
    early_area: float = 0.0
    probe: dict = field(default_factory=dict)  # the teacher probe at the first evaluation (the base model)


# the rows the protocol adds to the tuned recipes, from the tuned settings (issue: OpenClaw-RL's method as it is)
DIRECTIVE = ("judge.rules_hint=directive", "rollout.env_args.probe_hint=directive")
TEACHER_BASELINE = ("algo.opd_baseline=teacher",)
VARIANTS = {"opd directive": ("opd", DIRECTIVE), "combined directive": ("combined", DIRECTIVE),
            "opd directive + teacher baseline": ("opd", DIRECTIVE + TEACHER_BASELINE),
            "combined directive + teacher baseline": ("combined", DIRECTIVE + TEACHER_BASELINE)}
OPENCLAW = Choice("combined", ("rollout.env_args.probe_hint=directive",), "cpu_openclaw.yaml", "openclaw")


# the fixes issue 33 names besides the uptake weight (which is measured: see `compare_fixes`)
FIXES = (("OPD gate", ("algo.opd_gate=signal",)), ("balance std", ("algo.balance=std",)))


def grid(recipe: str, lrs: list[str], teachers: list[str]) -> list[Choice]:
    """The candidates of `recipe` ("openclaw": recipes/combined/cpu_openclaw.yaml, whose teacher is fixed): every
    lr of the shared grid, and for OPD and combined every teacher of the shared teacher grid."""
    if recipe == "openclaw":
        return [OPENCLAW.but("openclaw", f"trainer.lr={lr}") for lr in lrs]
    teacher_options = [f"judge.teacher={t}" for t in teachers] if recipe in ("opd", "combined") else [None]
    return [Choice(recipe, tuple(o for o in (f"trainer.lr={lr}", teacher) if o))
            for lr in lrs for teacher in teacher_options]


class Runner:
    """Runs (or, with report_only, only reads) one configuration at a time, cached by its settings."""

    def __init__(self, args: argparse.Namespace):
        self.args, self.out = args, Path(args.out)

    def outcome(self, choice: Choice, accuracy: float, setting: str, user: int, seed: int) -> Optional[Outcome]:
        a = self.args
        extra = [*choice.overrides, *a.overrides]
        run = personal_run(self.out, choice.recipe, accuracy, user, seed, a.steps, extra,
                           choice.recipe_file or a.recipe_file, setting)
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
        curve = curves.series["score"]
        early = [v for version, v in curve if version <= getattr(a, "early", 16)]
        return Outcome(final, area, curve, statistics.fmean(uptakes) if uptakes else None, early[-1],
                       statistics.fmean(early), first_probe)


def tune(runner: Runner, recipes: list[str], lrs: list[str], teachers: list[str], accuracy: float,
         users: list[int], seeds: list[int], setting: str = "realistic") -> tuple[dict[str, Choice], list[str]]:
    """The choice with the best mean area per recipe, and the tuning table's markdown rows. A recipe whose grid
    holds one candidate (one lr, one teacher) gets it without a tuning run."""
    chosen, rows = {}, ["| recipe | candidate | mean final | mean area | runs |", "|---|---|---|---|---|"]
    for recipe in recipes:
        candidates = grid(recipe, lrs, teachers)
        if len(candidates) == 1:  # nothing to choose: no tuning run
            chosen[recipe] = candidates[0]
            rows.append(f"| {recipe} | {candidates[0].label} | the only candidate: not run | | |")
            continue
        best = None
        for choice in candidates:
            got = [runner.outcome(choice, accuracy, setting, u, s) for u in users for s in seeds]
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


def compare(outcomes: dict[str, list[Outcome]], metric: str, row: str = "combined",
            combined_rows: Optional[set[str]] = None) -> Optional[str]:
    """'<row> - <best other>: mean [lo, hi]' over the pairs, the best other by its mean of `metric` among the rows
    that are not combined (`combined_rows`; by default only `row` itself)."""
    combined_rows = combined_rows or {row}
    others = [r for r in outcomes if r not in combined_rows]
    if row not in outcomes or not others:
        return None
    values = {r: [getattr(o, metric) for o in runs] for r, runs in outcomes.items()}
    best = max(others, key=lambda r: statistics.fmean(values[r]))
    mean, lo, hi = paired_bootstrap(values[row], values[best])
    return f"{row} - {best}: {mean:+.3f} [{lo:+.3f}, {hi:+.3f}]"


def evaluate(runner: Runner, chosen: dict[str, Choice], accuracies: list[float], settings: list[str],
             users: list[int], seeds: list[int], pairs: Optional[list[tuple[int, int]]] = None) -> tuple[list[str], dict]:
    """The evaluation table's markdown rows and the JSON results; draws the band PNGs. A row that has not finished
    every pair at an accuracy and setting is left out there (and named), so every row is compared on all pairs."""
    rows = ["| judge accuracy | setting | row (chosen settings) | final (mean ± sample std) | area (mean ± sample std) "
            "| pairs | row − best other, final [95% CI] | row − best other, area [95% CI] "
            "| first steps: final, area | row − best other, first steps' area [95% CI] |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    results = {}
    pairs = pairs or [(u, s) for u in users for s in seeds]
    for accuracy in accuracies:
        for setting in settings:
            got = {r: [runner.outcome(c, accuracy, setting, u, s) for u, s in pairs] for r, c in chosen.items()}
            present = [r for r in chosen if all(o is not None for o in got[r])]
            partial = [r for r in chosen if r not in present and any(o is not None for o in got[r])]
            if partial:
                print(f"[fair] acc {accuracy:g} {setting}: left out, not every pair finished: {partial}", file=sys.stderr)
            if not present:
                continue
            complete = list(range(len(pairs)))
            outcomes = {r: got[r] for r in present}
            combined_rows = {r for r in present if chosen[r].is_combined}
            for r, runs in outcomes.items():
                finals, areas = [o.final for o in runs], [o.area for o in runs]
                early_finals, early_areas = [o.early_final for o in runs], [o.early_area for o in runs]
                cmp = {m: compare(outcomes, m, r, combined_rows) if r in combined_rows else None
                       for m in ("final", "area", "early_area")}
                key = f"{setting}/acc{accuracy:g}/{r}"
                results[key] = {"choice": chosen[r].label, "final_mean": round(statistics.fmean(finals), 4),
                                "final_std": round(sample_std(finals), 4), "area_mean": round(statistics.fmean(areas), 4),
                                "area_std": round(sample_std(areas), 4), "pairs": len(runs),
                                "early_final_mean": round(statistics.fmean(early_finals), 4),
                                "early_area_mean": round(statistics.fmean(early_areas), 4),
                                "early_area_std": round(sample_std(early_areas), 4),
                                **{f"vs_best_other_{m}": c for m, c in cmp.items() if c}}
                rows.append(f"| {accuracy:g} | {setting} | {chosen[r].label} | {statistics.fmean(finals):.3f} ± "
                            f"{sample_std(finals):.3f} | {statistics.fmean(areas):.3f} ± {sample_std(areas):.3f} | "
                            f"{len(runs)}/{len(pairs)} | {cmp['final'] or ''} | {cmp['area'] or ''} | "
                            f"{statistics.fmean(early_finals):.3f}, {statistics.fmean(early_areas):.3f} ± "
                            f"{sample_std(early_areas):.3f} | {cmp['early_area'] or ''} |")
            if "combined" in outcomes:  # the recipe's own row, as reported before the variants
                results[f"{setting}/acc{accuracy:g}/interval_final"] = compare(outcomes, "final", "combined", combined_rows)
                results[f"{setting}/acc{accuracy:g}/interval_area"] = compare(outcomes, "area", "combined", combined_rows)
            plot_bands({r: [o.curve for o in runs] for r, runs in outcomes.items()},  # the table names the settings
                       f"{setting}, judge accuracy {accuracy:g}: pairs {[pairs[i] for i in complete]}",
                       runner.out / f"fair-bands-{setting}-acc{accuracy:g}.png")
    return rows, results


def probe_rows(runner: Runner, wordings: dict[str, Choice], accuracy: float, setting: str,
               pairs: list[tuple[int, int]]) -> list[str]:
    """Markdown rows: per kind, the base model's hint uptake and teacher AUC (the probe at each run's first
    evaluation, mean over the pairs) with the hint as each of `wordings` (a label -> a row whose runs probe it)."""
    probes = {label: [o.probe for o in (runner.outcome(c, accuracy, setting, u, s) for u, s in pairs)
                      if o is not None and o.probe] for label, c in wordings.items()}
    kinds = sorted({k.removeprefix("uptake_") for runs in probes.values() for p in runs for k in p
                    if k.startswith("uptake_")})

    def mean(label: str, key: str) -> str:
        values = [p[key] for p in probes[label] if p.get(key) is not None]
        return f"{statistics.fmean(values):{'+' if key.startswith('uptake_') else ''}.2f}" if values else "n/a"

    rows = ["| kind | " + " | ".join(f"uptake, {label} | AUC, {label}" for label in probes) + " |",
            "|---|" + "---|---|" * len(probes)]
    for kind in kinds:
        rows.append(f"| {kind} | " + " | ".join(f"{mean(label, f'uptake_{kind}')} | {mean(label, f'auc_{kind}')}"
                                                 for label in probes) + " |")
    runs = {label: len(v) for label, v in probes.items()}
    return rows + ["", f"Runs probed per wording: {runs} (judge accuracy {accuracy:g}, {setting} setting)."]


def with_variants(chosen: dict[str, Choice], names: list[str]) -> dict[str, Choice]:
    """The tuned rows and the named VARIANTS of them (and "openclaw", when tuned, as it is)."""
    out = dict(chosen)
    for name in names:
        recipe, overrides = VARIANTS[name]
        if recipe in chosen:
            out[name] = chosen[recipe].but(name, *overrides)
    return out


def hint_noise_rows(runner: Runner, chosen: dict[str, Choice], noises: list[float], pairs: list[tuple[int, int]],
                    setting: str = "realistic") -> list[str]:
    """Markdown rows: at judge accuracy 1.0 (scores right), binary RL and, with directive hints that contradict at
    each rate, OPD and combined; combined − the better of the other two, final and area, per rate."""
    rows = ["| wrong hints (contradict) | binary RL: final, area (mean ± sample std) | OPD directive: final, area | "
            "combined directive: final, area | pairs | combined − best other, final [95% CI] | combined − best other, area [95% CI] |",
            "|---|---|---|---|---|---|---|"]
    for noise in noises:
        extra = ("judge.hint_noise_kind=contradict", f"judge.hint_noise={noise:g}") if noise else ()
        row = {"binary_rl": chosen["binary_rl"],
               "opd": chosen["opd"].but("opd directive", *DIRECTIVE, *extra),
               "combined": chosen["combined"].but("combined directive", *DIRECTIVE, *extra)}
        got = {r: [runner.outcome(c, 1.0, setting, u, s) for u, s in pairs] for r, c in row.items()}
        both = [i for i in range(len(pairs)) if all(got[r][i] is not None for r in row)]
        if not both:
            continue
        outcomes = {r: [got[r][i] for i in both] for r in row}
        means = {r: ", ".join(f"{statistics.fmean(v):.3f} ± {sample_std(v):.3f}"
                              for v in ([o.final for o in runs], [o.area for o in runs])) for r, runs in outcomes.items()}
        rows.append(f"| {noise:g} | {means['binary_rl']} | {means['opd']} | {means['combined']} | {len(both)} | "
                    f"{compare(outcomes, 'final')} | {compare(outcomes, 'area')} |")
    return rows


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
    g.add_argument("--lr-grid", default="1e-4,2e-4,4e-4", help="one lr grid for every recipe")
    g.add_argument("--opd-teachers", default="frozen,lagged,policy",
                   help="the teacher grid of OPD and combined alike (policy: itself)")
    g.add_argument("--tune-users", default="0,1,2,3")
    g.add_argument("--tune-seeds", default="0,1")
    g.add_argument("--tune-accuracy", type=float, default=1.0)
    g.add_argument("--tune-setting", choices=SETTINGS, default="oracle",
                   help="tune where runs learn: by default a perfect judge and the canonical hints")
    # profile seeds no test and no earlier benchmark used, whose profiles differ from the tuning users' (1000 and
    # 1003 hold the profiles of users 3 and 0: refused)
    g.add_argument("--eval-users", default="1001,1002,1004,1005")
    g.add_argument("--eval-seeds", default="10,11")
    g.add_argument("--pairs", choices=("product", "zip"), default="product",
                   help="evaluation (user, seed) pairs: every user with every seed, or the i-th user with the i-th seed")
    g.add_argument("--settings", default=",".join(SETTINGS), help="realistic and/or oracle")
    g.add_argument("--variants", default="", help=f"also evaluate these rows (comma-separated): {', '.join(VARIANTS)}")
    g.add_argument("--hint-noise", default="", help="also the contradicting-hint rows at these rates, e.g. 0,0.3,0.6")
    g.add_argument("--hint-noise-kind", choices=("swap", "contradict"), default="contradict",
                   help="what the realistic judge's wrong hints are (swap: as before this protocol)")
    g.add_argument("--early", type=int, default=16, help="the first horizon: the evaluations of the first steps")
    g.add_argument("--report-only", action="store_true", help="run nothing: summarize the finished runs")
    g.add_argument("--groups", type=int, default=0,
                   help="also compare GRPO groups of this size with none (binary_rl, combined; tuning accuracy)")
    g.add_argument("--fixes", action="store_true",
                   help="also run combined's chosen settings with each fix on the tuning pairs (tuning accuracy)")


def evaluation_pairs(args: argparse.Namespace) -> list[tuple[int, int]]:
    users, seeds = ints(args.eval_users), ints(args.eval_seeds)
    if args.pairs == "zip":
        if len(users) != len(seeds):
            raise SystemExit(f"--pairs zip needs as many seeds as users ({len(users)} users, {len(seeds)} seeds)")
        return list(zip(users, seeds))
    return [(u, s) for u in users for s in seeds]


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
    args.overrides = [*args.overrides, f"judge.hint_noise_kind={args.hint_noise_kind}"]
    runner = Runner(args)
    recipes, accuracies = args.recipes.split(","), [float(x) for x in args.judge_accuracy.split(",") if x]
    chosen, tuning_rows = tune(runner, recipes, args.lr_grid.split(","), args.opd_teachers.split(","),
                               args.tune_accuracy, ints(args.tune_users), ints(args.tune_seeds), args.tune_setting)
    pairs = evaluation_pairs(args)
    eval_rows, results = [], {}
    if set(chosen) != set(recipes):
        print(f"[fair] tuning has not finished for {sorted(set(recipes) - set(chosen))}: no evaluation yet",
              file=sys.stderr)
    else:
        rows = with_variants(chosen, [v for v in args.variants.split(",") if v])
        eval_rows, results = evaluate(runner, rows, accuracies, args.settings.split(","), [], [], pairs)
        if "opd directive" in rows and accuracies:
            eval_rows += ["", "### The teacher probe on the base model: the user's words against the judge's directives",
                          "", *probe_rows(runner, {"user words": rows["opd"], "directive": rows["opd directive"]},
                                          accuracies[0], args.settings.split(",")[0], pairs)]
        if args.hint_noise:
            eval_rows += ["", "### Wrong hints that contradict, judge accuracy 1.0", "",
                          *hint_noise_rows(runner, chosen, [float(x) for x in args.hint_noise.split(",")], pairs)]
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
