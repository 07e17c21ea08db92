"""The fair protocol's selection and report, on finished runs written by hand (nothing is trained here)."""
from __future__ import annotations

import argparse
import json

import pytest

from benchmarks import fair
from benchmarks.personal_runs import personal_run


def args(tmp_path, **kw) -> argparse.Namespace:
    base = dict(out=str(tmp_path), steps=100, recipe_file="cpu.yaml", overrides=[], report_only=True)
    return argparse.Namespace(**{**base, **kw})


def finish(runner: fair.Runner, choice: fair.Choice, accuracy: float, setting: str, user: int, seed: int,
           curve: list[float], probe: dict | None = None) -> None:
    """A finished run of this configuration, where the protocol looks for it: held-out scores every 25 versions."""
    a = runner.args
    path = personal_run(runner.out, choice.recipe, accuracy, user, seed, a.steps, [*choice.overrides], a.recipe_file,
                        setting).path
    path.mkdir(parents=True)
    rows = [{"loop": "rollout", "time": float(i), "eval_metric": "personalization_score", "eval_version": 25 * i,
             "personalization_score": v} for i, v in enumerate(curve)]
    rows[0].update(probe or {})  # the teacher probe runs at the first evaluation
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (path / "summary.json").write_text("{}")


def test_tuning_picks_the_best_mean_area_among_fully_run_candidates(tmp_path):
    runner = fair.Runner(args(tmp_path))
    low, high, unfinished = (fair.grid("opd", ["1e-4", "2e-4"], ["frozen", "lagged"])[i] for i in (0, 1, 3))
    assert low.overrides == ("trainer.lr=1e-4", "judge.teacher=frozen") and low.label == "opd lr=1e-4 teacher=frozen"
    assert fair.Choice("combined", ("trainer.lr=1e-4", "algo.w_opd=0.44")).label == "combined lr=1e-4 w_opd=0.44"
    for user in (0, 1):
        finish(runner, low, 0.7, "realistic", user, 0, [0.0, 0.6, 0.6])  # the better final, area 0.4
        finish(runner, high, 0.7, "realistic", user, 0, [0.5, 0.5, 0.5])  # the larger area: chosen
    finish(runner, unfinished, 0.7, "realistic", 0, 0, [0.9, 0.9, 0.9])  # best, but only one of two runs
    chosen, rows = fair.tune(runner, ["opd"], ["1e-4", "2e-4"], ["frozen", "lagged"], 0.7, [0, 1], [0])
    assert chosen == {"opd": high}
    assert any("| 1/2 |" in r for r in rows) and sum("| 2/2 |" in r for r in rows) == 2


def test_evaluation_reports_sample_std_and_the_paired_interval_against_the_best_other(tmp_path):
    runner = fair.Runner(args(tmp_path))
    chosen = {r: fair.Choice(r, (f"trainer.lr={lr}",)) for r, lr in (("binary_rl", "2e-4"), ("opd", "1e-4"),
                                                                       ("combined", "2e-4"))}
    finals = {"binary_rl": [0.2, 0.4, 0.3, 0.5], "opd": [0.1, 0.2, 0.1, 0.2], "combined": [0.3, 0.5, 0.4, 0.6]}
    for r, values in finals.items():
        for (user, seed), final in zip([(1001, 10), (1001, 11), (1002, 10), (1002, 11)], values):
            finish(runner, chosen[r], 0.7, "realistic", user, seed, [0.0, final])
    rows, results = fair.evaluate(runner, chosen, [0.7, 1.0], ["realistic"], [1001, 1002], [10, 11])
    combined = results["realistic/acc0.7/combined"]
    # the report rounds to 4 decimals: float64 rounding (1e-16) cannot move a value this far from a rounding boundary
    assert combined["final_mean"] == 0.45 and combined["final_std"] == round((0.05 / 3) ** 0.5, 4)  # 0.1291
    assert combined["pairs"] == 4 and combined["area_mean"] == 0.225
    # combined leads binary RL (the best other) by 0.1 on every pair
    assert results["realistic/acc0.7/interval_final"] == "combined - binary_rl: +0.100 [+0.100, +0.100]"
    assert "realistic/acc1/combined" not in results  # nothing ran at accuracy 1.0
    assert [r.split(" | ")[2] for r in rows if "combined - binary_rl" in r] == ["combined lr=2e-4"]  # on its row
    assert (tmp_path / "fair-bands-realistic-acc0.7.png").stat().st_size > 1000


def test_evaluation_users_must_be_new_people():
    fair.check_users([0, 1, 2, 3], [1001, 1002, 1004, 1005])
    with pytest.raises(SystemExit, match="user 1000 has the profile of user 3"):
        fair.check_users([0, 1, 2, 3], [1001, 1000])


def test_groups_are_compared_pair_by_pair_with_the_same_settings_without(tmp_path):
    runner = fair.Runner(args(tmp_path))
    chosen = {"combined": fair.Choice("combined", ("trainer.lr=2e-4",))}
    grouped = fair.Choice("combined", ("trainer.lr=2e-4", "rollout.env_args.group_size=4", "pool.group_size=4"))
    for user, plain_final in ((1001, 0.2), (1002, 0.6)):
        finish(runner, chosen["combined"], 0.7, "realistic", user, 10, [0.0, plain_final])
        finish(runner, grouped, 0.7, "realistic", user, 10, [0.0, plain_final + 0.1])
    rows = fair.compare_groups(runner, chosen, 4, 0.7, [1001, 1002], [10])
    assert rows[2] == ("| combined lr=2e-4 | 2 | 0.400, 0.200 | 0.500, 0.250 | +0.100 [+0.100, +0.100] "
                       "| +0.050 [+0.050, +0.050] |")


def test_fixes_are_compared_with_the_same_settings_and_the_uptake_weight_is_the_measured_uptake(tmp_path):
    runner = fair.Runner(args(tmp_path))
    combined = fair.Choice("combined", ("trainer.lr=1e-4",))
    uptakes = {"oracle": ({"uptake_format": 0.5, "uptake_units": 0.3}, {"uptake_format": 0.6, "uptake_units": 0.2}),
               "realistic": ({"uptake_format": -0.2, "uptake_units": 0.1}, {"uptake_format": -0.4, "uptake_units": 0.0})}
    for setting, weight in (("oracle", "0.40"), ("realistic", "0.00")):  # mean uptake 0.4; -0.125 clamped to 0
        for user, probe in zip((0, 1), uptakes[setting]):
            finish(runner, combined, 0.7, setting, user, 0, [0.0, 0.2 * (user + 1)], probe)
            finish(runner, fair.Choice("combined", ("trainer.lr=1e-4", "algo.balance=std")), 0.7, setting, user, 0,
                   [0.0, 0.2 * (user + 1) - 0.1])
            finish(runner, fair.Choice("combined", ("trainer.lr=1e-4", f"algo.w_opd={weight}")), 0.7, setting, user, 0,
                   [0.1, 0.2 * (user + 1) + 0.2])
    rows = fair.compare_fixes(runner, combined, 0.7, ["oracle", "realistic"], [0, 1], [0])
    assert rows[2:] == [  # the gate's runs are missing: no row
        "| oracle | balance std | 2 | 0.300, 0.150 | 0.200, 0.100 | -0.100 [-0.100, -0.100] | -0.050 [-0.050, -0.050] |",
        "| oracle | w_opd = uptake 0.40 | 2 | 0.300, 0.150 | 0.500, 0.300 | +0.200 [+0.200, +0.200] "
        "| +0.150 [+0.150, +0.150] |",
        "| realistic | balance std | 2 | 0.300, 0.150 | 0.200, 0.100 | -0.100 [-0.100, -0.100] "
        "| -0.050 [-0.050, -0.050] |",
        "| realistic | w_opd = uptake 0.00 | 2 | 0.300, 0.150 | 0.500, 0.300 | +0.200 [+0.200, +0.200] "
        "| +0.150 [+0.150, +0.150] |"]
