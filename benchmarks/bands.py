"""Held-out score against weight version, one line per recipe with a band over its runs (mean ± sample std)."""
from __future__ import annotations

import statistics
from pathlib import Path

from benchmarks.stats import sample_std

Curve = list[tuple[int, float]]  # (weight version, held-out score)


def band(curves: list[Curve]) -> tuple[list[int], list[float], list[float]]:
    """(versions every run evaluated, mean score at each, sample std at each)."""
    versions = sorted(set.intersection(*(set(v for v, _ in c) for c in curves)))
    at = [[dict(c)[v] for c in curves] for v in versions]
    return versions, [statistics.fmean(s) for s in at], [sample_std(s) for s in at]


def plot_bands(curves_by_recipe: dict[str, list[Curve]], title: str, out_png: Path, unit: str = "runs") -> Path:
    """One line per recipe, its band over the recipe's curves (each a run, or with `unit` "users" a user's)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for recipe, curves in curves_by_recipe.items():
        versions, mean, std = band(curves)
        line, = ax.plot(versions, mean, marker="o", markersize=3, label=f"{recipe} ({len(curves)} {unit})")
        ax.fill_between(versions, [max(m - s, 0.0) for m, s in zip(mean, std)],
                        [min(m + s, 1.0) for m, s in zip(mean, std)], color=line.get_color(), alpha=0.2)
    ax.set_title(title)
    ax.set_xlabel("weight version")
    ax.set_ylabel("held-out personalization score")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=90)
    plt.close(fig)
    return out_png
