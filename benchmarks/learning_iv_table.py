"""Learning IV's tables, recomputed from the committed JSON in docs/benchmarks/learning-iv/ and nothing else:

    python benchmarks/learning_iv.py table      # writes docs/benchmarks/learning-iv/table.md and prints it

- the probe of every drawn user (probe.json), and who the rule chose with which kinds (users.json);
- per row (runs/<row>.json): each recipe's final held-out score and area (mean over evaluations) as the mean and
  the sample std over users, and its mean curve;
- each combined run minus binary RL and minus the OPD of its teacher baseline (PAIRS), paired by user: the mean difference, a t-interval and a bootstrap interval,
  both at the Bonferroni level over every comparison reported, the t-test's p and Holm's adjusted p over every
  comparison reported. A difference is a win or a loss only where Holm's p < ALPHA; otherwise it is a tie.
"""
from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.bands import plot_bands  # noqa: E402
from benchmarks.learning_iv_rows import DATA, ROWS, counted_kinds, read_json  # noqa: E402
from benchmarks.stats import holm, paired_bootstrap, paired_t, sample_std, t_quantile  # noqa: E402

ALPHA = 0.05
METRICS = ("final", "area")
# (combined variant, the recipe it is compared with): each combined against binary RL and the OPD of its baseline
PAIRS = (("combined", "binary_rl"), ("combined", "opd"), ("combined contrastive", "binary_rl"),
         ("combined contrastive", "opd contrastive"))
EVAL_SIZE = 16  # held-out questions per user and evaluation (benchmarks/learning_iv_rows.py's runs)


def resolvable(n_users: int, comparisons: int, noise: float = math.sqrt(2 * 0.25 / EVAL_SIZE)) -> float:
    """The smallest mean difference in final score the design finds at 80% power with Holm's first threshold
    (ALPHA / comparisons): per-user differences of sample std `noise` (default: two independent scores of
    EVAL_SIZE questions each at their most variable, p = 0.5), n_users pairs."""
    t_crit = t_quantile(1 - ALPHA / comparisons / 2, n_users - 1)
    return (t_crit + t_quantile(0.8, n_users - 1)) * noise / math.sqrt(n_users)


def probe_table(probe: dict, chosen: dict[str, list[str]]) -> list[str]:
    """Every drawn user's probe, kind by kind: what counts under the rule, and who runs."""
    lines = ["| user | kind: wish | without the hint | with it | uptake | counts | runs |",
             "|---|---|---|---|---|---|---|"]
    for user, result in sorted(probe.get("users", {}).items(), key=lambda kv: int(kv[0])):
        counted = counted_kinds(result)
        wishes = {k: result["profile"][k] for k in counted}
        twin = next((u for u, kinds in chosen.items()
                     if {k: probe["users"][u]["profile"][k] for k in kinds} == wishes), None)
        runs = ("yes" if user in chosen else "no: no kind counts" if not counted
                else f"no: {twin}'s wishes" if twin else f"no: {len(chosen)} users before it")
        for kind, option in result["profile"].items():
            hinted, up = result[f"hinted_{kind}"], result[f"uptake_{kind}"]
            lines.append(f"| {user} | {kind}: {option} | {hinted - up:.2f} | {hinted:.2f} | {up:+.2f} | "
                         f"{'yes' if kind in counted else ''} | {runs} |")
    return lines


def paired_users(row: dict) -> list[str]:
    """The users every recipe of the row has a result for."""
    per_recipe = [set(r["users"]) for r in row["recipes"].values()]
    return sorted(set.intersection(*per_recipe), key=int) if per_recipe else []


def comparisons(rows: dict[str, dict]) -> list[dict]:
    """Every combined-minus-other comparison the committed rows allow, with raw and Holm-adjusted p."""
    found = []
    for name, row in rows.items():
        users = paired_users(row)
        for combined, other in PAIRS:
            if combined not in row["recipes"] or other not in row["recipes"] or len(users) < 2:
                continue
            for metric in METRICS:
                a = [row["recipes"][combined]["users"][u][metric] for u in users]
                b = [row["recipes"][other]["users"][u][metric] for u in users]
                found.append({"row": name, "combined": combined, "other": other, "metric": metric, "a": a, "b": b})
    level = 1 - ALPHA / max(len(found), 1)  # Bonferroni: the intervals hold together over every comparison
    for c in found:
        c["mean"], c["t_lo"], c["t_hi"], c["p"] = paired_t(c["a"], c["b"], level)
        _, c["boot_lo"], c["boot_hi"] = paired_bootstrap(c["a"], c["b"], level=level)
    for c, adjusted in zip(found, holm([c["p"] for c in found])):
        c["holm_p"] = adjusted
        c["verdict"] = "tie" if adjusted >= ALPHA else (f"{c['combined']} wins" if c["mean"] > 0 else f"{c['other']} wins")
    return found


def recipe_table(row: dict) -> list[str]:
    users = paired_users(row)
    lines = [f"Users: {len(users)}; mean ± sample std over users.", "",
             "| recipe | final score | area | judge agreed with the truth | its hints' uptake | minutes |",
             "|---|---|---|---|---|---|"]
    for recipe, r in row["recipes"].items():
        cells = [f"{statistics.fmean(v):.3f} ± {sample_std(v):.3f}"
                 for v in ([r["users"][u][m] for u in users] for m in METRICS)]
        judge = r.get("judge", {})
        agreed = f"{judge['agreement']:.2f} of {judge['scored']} scored turns" if judge.get("scored") else "-"
        hints = r.get("hints", {})
        uptake = (f"{hints['uptake']:+.2f} over {hints['hinted_turns']} hinted turns" if hints.get("hinted_turns")
                  else "-")
        lines.append(f"| {recipe} | {' | '.join(cells)} | {agreed} | {uptake} | {r['minutes']} |")
    versions = sorted({v for r in row["recipes"].values() for c in r["users"].values() for v, _ in c["curve"]})
    lines += ["", "Mean held-out score over users at each evaluated version (the curve):", "",
              "| recipe | " + " | ".join(f"v{v}" for v in versions) + " |", "|---|" + "---|" * len(versions)]
    for recipe, r in row["recipes"].items():
        at = [[s for c in (r["users"][u]["curve"] for u in users) for v2, s in c if v2 == v] for v in versions]
        lines.append(f"| {recipe} | " + " | ".join(f"{statistics.fmean(s):.3f}" if s else "-" for s in at) + " |")
    return lines


def comparison_table(found: list[dict]) -> list[str]:
    level = 1 - ALPHA / max(len(found), 1)
    lines = [f"Each combined run minus the recipe it is compared with, paired by user; intervals at {level:.2%} (Bonferroni over the "
             f"{len(found)} comparisons), p two-sided, Holm's p over the same {len(found)}.", "",
             "| row | recipe | minus | metric | mean difference | t-interval | bootstrap interval | p | Holm's p | verdict |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for c in found:
        lines.append(f"| {c['row']} | {c['combined']} | {c['other']} | {c['metric']} | {c['mean']:+.3f} | [{c['t_lo']:+.3f}, "
                     f"{c['t_hi']:+.3f}] | [{c['boot_lo']:+.3f}, {c['boot_hi']:+.3f}] | {c['p']:.3f} | "
                     f"{c['holm_p']:.3f} | {c['verdict']} |")
    return lines


def load_rows(data: Path) -> dict[str, dict]:
    files = {p.stem: p for p in (data / "runs").glob("*.json")}
    return {name: read_json(files[name]) for name in ROWS if name in files}


def render_tables(data: Path = DATA) -> str:
    """The tables' markdown from the JSON in `data` alone."""
    probe, users = read_json(data / "probe.json"), read_json(data / "users.json")
    chosen = users.get("evaluation", {})
    rows = load_rows(data)
    found = comparisons(rows)
    named = ", ".join(f"{u} ({' + '.join(k)})" for u, k in chosen.items())
    lines = ["# Learning IV: the tables (generated by `python benchmarks/learning_iv.py table`; do not edit)", "",
             "## The users", "", f"Rule: {users.get('rule', '(not chosen yet)')}.", "",
             f"Chosen for evaluation: {named or 'none yet'}.",
             "", *probe_table(probe, chosen), ""]
    if chosen:
        n = len(chosen)
        m = len(METRICS) * sum(a in runs and b in runs for _, _, runs in ROWS.values() for a, b in PAIRS)
        lines += [f"With {n} users and the {m} comparisons of the four rows, the design resolves a difference in "
                  f"final score of about {resolvable(n, m):.2f} (80% power, Holm's first threshold, each user's "
                  f"score over {EVAL_SIZE} questions); smaller true differences read as ties.", ""]
    for name, row in rows.items():
        lines += [f"## {name}", "", *recipe_table(row), "", f"![{name}: mean ± sample std over users]({name}.png)", ""]
    if found:
        lines += ["## Combined against the others", "", *comparison_table(found), ""]
    return "\n".join(lines) + "\n"


def write_tables(data: Path = DATA) -> str:
    """data/table.md from the JSON beside it, and each row's curves as data/<row>.png; the table's text."""
    text = render_tables(data)
    data.mkdir(parents=True, exist_ok=True)
    (data / "table.md").write_text(text)
    for name, row in load_rows(data).items():
        users = paired_users(row)
        curves = {recipe: [r["users"][u]["curve"] for u in users] for recipe, r in row["recipes"].items()}
        plot_bands(curves, f"learning IV, {name}: held-out score, {len(users)} users", data / f"{name}.png", "users")
    return text
