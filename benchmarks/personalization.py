"""The personalization benchmark: recipes x seeds x users x judge accuracies, with the spread.

    python benchmarks/personalization.py --recipes binary_rl,opd,combined --seeds 3 --profiles 0,1 \\
        --judge-accuracy 1.0,0.8,0.7 [--setting realistic|oracle] [--out runs/personalization] [--steps 150] \\
        [--only-finished] [--recipe-file cpu.yaml] [override ...]
    python benchmarks/personalization.py --protocol fair --judge-accuracy 1.0,0.7 [...]   (benchmarks/fair.py)

Runs `clawr1 run recipes/<recipe>/<recipe-file>` once per configuration, one after another, through
benchmarks/runs.py (a finished run, one with a summary.json, is kept and not run again, so the command can be
resumed; a run directory's name ends in a hash of its settings, so other overrides never reuse it). A judge of
accuracy a errs with probability 1 - a: in the realistic setting (the default) it flips scores and spoils
hints while users word their wishes freely; in the oracle setting users say the warm start's directives and
only scores err (benchmarks/personal_runs.py). Per recipe x accuracy x user it reports the mean and standard
deviation over seeds of the final held-out score and of the area under the score curve (the mean score over
the evaluated versions: sample efficiency), prints one JSON line, and writes a markdown table, and curves per
user and accuracy through `clawr1 report`.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks import fair  # noqa: E402
from benchmarks.personal_runs import SETTINGS, personal_run  # noqa: E402
from benchmarks.runs import scores  # noqa: E402
from benchmarks.stats import mean_std  # noqa: E402
from clawr1.report import load_run  # noqa: E402


def collapsed(path: Path) -> bool:
    """The score rose well above the base and then fell back to it."""
    values = [v for _, v in load_run(path).series["score"]]
    return max(values) >= values[0] + 0.25 and values[-1] <= values[0] + 0.05


def teacher_rows(label: str, probes: list[dict[str, float]]) -> list[str]:
    """Markdown rows: per kind, the mean over runs of satisfied-with-the-hint, uptake and AUC (n/a where unmeasured)."""
    kinds = sorted({k.removeprefix("uptake_") for p in probes for k in p if k.startswith("uptake_")})

    def avg(key: str) -> str:
        values = [p[key] for p in probes if p.get(key) is not None]
        if not values:
            return "n/a"
        return f"{statistics.fmean(values):{'+' if key.startswith('uptake_') else ''}.2f}"

    return [f"| {label} | {kind} | {avg(f'hinted_{kind}')} | {avg(f'uptake_{kind}')} | {avg(f'auc_{kind}')} |"
            for kind in kinds]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipes", default="binary_rl,opd,combined")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--profiles", default="0,1")
    p.add_argument("--judge-accuracy", default="1.0,0.8,0.7")
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--out", default="runs/personalization")
    p.add_argument("--recipe-file", default="cpu.yaml", help="e.g. cpu_smollm2.yaml: the real model's recipes")
    p.add_argument("--only-finished", action="store_true",
                   help="run nothing: summarize the configurations whose runs have all finished")
    p.add_argument("--setting", choices=SETTINGS, default="realistic",
                   help="realistic: free wording, a judge that errs in scores and hints; oracle: canonical "
                        "directives, only the scores err")
    p.add_argument("--protocol", choices=("sweep", "fair"), default="sweep",
                   help="sweep: every recipe as its recipe file says; fair: tune, then evaluate on new users")
    p.add_argument("overrides", nargs="*", help="for every run, e.g. algo.opd_center=sample")
    fair.add_arguments(p)
    args = p.parse_args()
    if args.protocol == "fair":
        return fair.main(args)
    out = Path(args.out)
    recipes = args.recipes.split(",")
    profiles = [int(x) for x in args.profiles.split(",")]
    accuracies = [float(x) for x in args.judge_accuracy.split(",")]
    results, lines = {}, ["| judge accuracy | user | recipe | final score (mean ± std) | area under curve | seeds | collapsed |",
                          "|---|---|---|---|---|---|---|"]
    teacher = ["| policy | kind | satisfied with the hint | hint uptake | teacher AUC |", "|---|---|---|---|---|"]
    for accuracy in accuracies:
        for profile in profiles:
            dirs = []
            for recipe in recipes:
                finals, areas = [], []
                seed_runs = [personal_run(out, recipe, accuracy, profile, seed, args.steps, args.overrides,
                                          args.recipe_file, args.setting)
                             for seed in range(1, args.seeds + 1)]
                if args.only_finished and not all(run.finished for run in seed_runs):
                    continue
                for seed, run in zip(range(1, args.seeds + 1), seed_runs):
                    took = run.start()
                    final, area = scores(run.path)
                    finals.append(final)
                    areas.append(area)
                    dirs.append(run.path)
                    print(f"[bench] acc {accuracy:g} user {profile} {recipe} seed {seed}: final {final:.3f} "
                          f"area {area:.3f} ({took:.1f} min)", file=sys.stderr, flush=True)
                key = f"{recipe}/acc{accuracy:g}/p{profile}"
                falls = sum(collapsed(d) for d in dirs[-args.seeds:])
                results[key] = {"final": mean_std(finals), "area": mean_std(areas), "collapsed": falls}
                lines.append(f"| {accuracy:g} | {profile} | {recipe} | {results[key]['final']['mean']:.3f} ± "
                             f"{results[key]['final']['std']:.3f} | {results[key]['area']['mean']:.3f} ± "
                             f"{results[key]['area']['std']:.3f} | {', '.join(f'{v:.3f}' for v in finals)} | "
                             f"{falls}/{args.seeds} |")
            if not dirs:
                continue
            runs = [load_run(d) for d in dirs]
            teacher += teacher_rows(f"base, user {profile}", [r.teacher[min(r.teacher)] for r in runs if r.teacher])
            for recipe in recipes:
                finals = [r.teacher[max(r.teacher)] for r, d in zip(runs, dirs) if r.teacher and d.name.startswith(f"{recipe}-s")]
                teacher += teacher_rows(f"{recipe} after, acc {accuracy:g}, user {profile}", finals)
            report = out / f"curves-acc{accuracy:g}-p{profile}"
            subprocess.run([sys.executable, "-m", "clawr1.cli", "report", *map(str, dirs), "--out", str(report)],
                           cwd=REPO, stdout=subprocess.DEVNULL, check=True)
    (out / "summary.md").write_text("\n".join(lines) + "\n\n" + "\n".join(teacher) + "\n")
    print("\n".join(lines + [""] + teacher), file=sys.stderr)
    print(json.dumps({"benchmark": "personalization", "steps": args.steps, "seeds": args.seeds, "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
