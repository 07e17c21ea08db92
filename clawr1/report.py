"""`clawr1 report RUN_DIR [RUN_DIR ...]`: the runs' curves in one PNG and a short markdown table.

Curves (x: trainer step / weight version): mean reward, the environment's held-out
score (the headline metric each evaluation record names in `eval_metric`, e.g. the
personalization score), KL (to the reference if kept, else from the sampling policy to
the trained one: the off-policy gap), entropy, hint rate, staleness. Table: per run,
the objective, the score before and after training, and the wall time; the score
of every run at every evaluated version; and, where the environment measures its
teacher (`uptake_<kind>`, `auc_<kind>`: envs/personal/teacher_probe.py), the hint
uptake and teacher signal quality per kind at the first and the last evaluation.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import yaml

from clawr1.tracking import read_metrics

PANELS = [("reward_mean", "mean reward"), ("score", "held-out score"),
          ("kl", "KL (to reference if kept, else behaviour || trained)"), ("entropy", "entropy"), ("hint_rate", "hint rate"),
          ("staleness_mean", "staleness (versions)")]


@dataclass
class RunCurves:
    name: str
    objective: str
    series: dict[str, list[tuple[int, float]]]
    wall_s: float
    score_name: str = "score"  # the environment's headline metric
    # teacher measurements per evaluated version: {version: {"hinted_tone": ..., "uptake_tone": ..., "auc_tone": ...}}
    teacher: dict[int, dict[str, float]] = field(default_factory=dict)
    # runs with one adapter per user: {"score" | "reward_mean": {user: series}} (users: u0.. in evaluations,
    # slot0.. in the trainer's records)
    per_user: dict[str, dict[str, list[tuple[int, float]]]] = field(default_factory=dict)

    def last(self, key: str) -> Optional[float]:
        return self.series[key][-1][1] if self.series.get(key) else None

    def first(self, key: str) -> Optional[float]:
        return self.series[key][0][1] if self.series.get(key) else None


def _objective(run_dir: Path) -> str:
    path = run_dir / "config.yaml"
    if not path.exists():
        return "?"
    cfg = yaml.safe_load(path.read_text()) or {}
    algo, lr = cfg.get("algo", {}), cfg.get("trainer", {}).get("lr")
    parts = [f"{k}={algo.get(k)}" for k in ("w_rl", "w_opd", "w_topk", "kl_coef") if algo.get(k)]
    judge = cfg.get("judge", {})
    if judge.get("teacher") in ("frozen", "lagged"):
        parts.append(f"{judge['teacher']} teacher")
    if judge.get("score_noise"):
        parts.append(f"judge accuracy {1 - judge['score_noise']:g}")
    lora = cfg.get("lora", {})
    if lora.get("enabled"):
        parts.append(f"LoRA r={lora.get('rank')}" + (f", one per user ({lora.get('slots')} slots)" if lora.get("per_user")
                                                     else ""))
    return ", ".join(parts + ([f"lr={lr:g}"] if lr else [])) or "no objective"


def load_run(run_dir: Path) -> RunCurves:
    rows = read_metrics(run_dir)
    if not rows:
        raise FileNotFoundError(f"{run_dir} has no metrics.jsonl (is it a clawr1 run directory?)")
    series: dict[str, list[tuple[int, float]]] = {k: [] for k, _ in PANELS}
    score_name = "score"
    teacher: dict[int, dict[str, float]] = {}
    per_user: dict[str, dict[str, list[tuple[int, float]]]] = {"score": {}, "reward_mean": {}}
    for r in rows:
        if r.get("loop") == "trainer" and "pg_loss" in r:
            for key in ("reward_mean", "entropy", "hint_rate", "staleness_mean"):
                series[key].append((r["step"], r[key]))
            series["kl"].append((r["step"], r["kl_ref"] if r.get("kl_ref") else r.get("kl_rollout", 0.0)))
            for k, v in r.items():
                if k.startswith("reward_mean_slot"):
                    per_user["reward_mean"].setdefault(k.removeprefix("reward_mean_"), []).append((r["step"], v))
        elif r.get("loop") == "rollout" and "eval_metric" in r:
            score_name = r["eval_metric"]
            series["score"].append((r["eval_version"], r[score_name]))
            for k, v in r.items():
                user = k.removeprefix(f"{score_name}_")
                if k.startswith(f"{score_name}_") and user.startswith("u"):
                    per_user["score"].setdefault(user, []).append((r["eval_version"], v))
            probe = {k: v for k, v in r.items() if k.startswith(("hinted_", "uptake_", "auc_")) and v is not None}
            if probe:
                teacher[r["eval_version"]] = probe
    series["score"].sort()
    for user_series in per_user["score"].values():
        user_series.sort()
    times = [r["time"] for r in rows]
    return RunCurves(run_dir.name, _objective(run_dir), series, max(times) - min(times), score_name, teacher,
                     {k: v for k, v in per_user.items() if v})


def _score_title(runs: list[RunCurves]) -> str:
    names = sorted({r.score_name for r in runs if r.series["score"]})
    return " / ".join(n.replace("_", " ") for n in names) or "held-out score"


def markdown_table(runs: list[RunCurves]) -> str:
    def fmt(x: Optional[float]) -> str:
        return "n/a" if x is None else f"{x:.3f}"

    title = _score_title(runs)
    lines = [f"| run | objective | steps | {title} before | after | best | final reward | wall time |",
             "|---|---|---|---|---|---|---|---|"]
    for r in runs:
        scores = [v for _, v in r.series["score"]]
        steps = r.series["reward_mean"][-1][0] if r.series["reward_mean"] else 0
        lines.append(f"| {r.name} | {r.objective} | {steps} | {fmt(r.first('score'))} | "
                     f"{fmt(r.last('score'))} | {fmt(max(scores) if scores else None)} | "
                     f"{fmt(r.last('reward_mean'))} | {r.wall_s / 60:.1f} min |")
    return "\n".join(lines) + "\n"


def score_table(runs: list[RunCurves]) -> str:
    """The held-out score of each run at each evaluated weight version (version 0: the untrained policy)."""
    versions = sorted({v for r in runs for v, _ in r.series["score"]})
    if not versions:
        return ""
    lines = ["| run | " + " | ".join(f"v{v}" + (" (base)" if v == 0 else "") for v in versions) + " |",
             "|---|" + "---|" * len(versions)]
    for r in runs:
        by_version = dict(r.series["score"])
        lines.append(f"| {r.name} | " + " | ".join(f"{by_version[v]:.3f}" if v in by_version else "" for v in versions) + " |")
    return "\n".join(lines) + "\n"


def user_table(runs: list[RunCurves]) -> str:
    """Each user's held-out score, first and last evaluation, in runs with one adapter per user."""
    lines = [f"| {r.name} | {user} | {s[0][1]:.3f} | {s[-1][1]:.3f} |"
             for r in runs for user, s in sorted(r.per_user.get("score", {}).items())]
    if not lines:
        return ""
    return "| run | user | score before | after |\n|---|---|---|---|\n" + "\n".join(lines) + "\n"


def teacher_table(runs: list[RunCurves]) -> str:
    """Hint uptake and teacher AUC per kind, at the run's first and last evaluation (empty if none measured)."""
    lines = []
    for r in runs:
        if not r.teacher:
            continue
        first, last = min(r.teacher), max(r.teacher)
        kinds = [k.removeprefix("uptake_") for k in r.teacher[first] if k.startswith("uptake_")]
        for kind in kinds:
            cells = [r.teacher[v].get(f"{what}_{kind}") for what in ("uptake", "auc") for v in (first, last)]
            shown = ["-" if c is None else f"{c:+.2f}" if i < 2 else f"{c:.2f}" for i, c in enumerate(cells)]
            lines.append(f"| {r.name} | {kind} | {shown[0]} → {shown[1]} | {shown[2]} → {shown[3]} |")
    if not lines:
        return ""
    return ("| run | kind | hint uptake (first → last evaluation) | teacher AUC (first → last) |\n"
            "|---|---|---|---|\n" + "\n".join(lines) + "\n")


def plot(runs: list[RunCurves], out_png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    for ax, (key, title) in zip(axes.flat, PANELS):
        for r in runs:
            if r.series[key]:
                xs, ys = zip(*r.series[key])
                ax.plot(xs, ys, marker="o" if key == "score" else None, markersize=3, label=r.name)
            for user, user_series in sorted(r.per_user.get(key, {}).items()):  # one dashed curve per user
                xs, ys = zip(*user_series)
                ax.plot(xs, ys, linestyle="--", marker="o" if key == "score" else None, markersize=2,
                        label=f"{r.name} {user}")
        ax.set_title(f"{_score_title(runs)} (held-out)" if key == "score" else title)
        ax.set_xlabel("trainer step / weight version")
        ax.grid(alpha=0.3)
    axes.flat[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_png, dpi=80)
    plt.close(fig)


def report(run_dirs: list[Path], out_prefix: Path) -> tuple[Path, Path]:
    runs = [load_run(Path(d)) for d in run_dirs]
    # appended, not with_suffix: a prefix such as curves-acc0.7 has a dot that is not a suffix
    png, md = out_prefix.with_name(out_prefix.name + ".png"), out_prefix.with_name(out_prefix.name + ".md")
    png.parent.mkdir(parents=True, exist_ok=True)
    plot(runs, png)
    teacher, users = teacher_table(runs), user_table(runs)
    md.write_text(markdown_table(runs) + "\n" + score_table(runs) + (f"\n{users}" if users else "")
                  + (f"\n{teacher}" if teacher else "") + f"\n![curves]({png.name})\n")
    return png, md
