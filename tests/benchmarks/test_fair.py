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
           curve: list[float], probe: dict | None = None, every: int = 25) -> None:
    """A finished run of this configuration, where the protocol looks for it: held-out scores every `every` versions."""
    a = runner.args
    path = personal_run(runner.out, choice.recipe, accuracy, user, seed, a.steps, [*choice.overrides, *a.overrides],
                        choice.recipe_file or a.recipe_file, setting).path
    path.mkdir(parents=True)
    rows = [{"loop": "rollout", "time": float(i), "eval_metric": "personalization_score", "eval_version": every * i,
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


def test_a_grid_of_one_candidate_is_chosen_without_a_tuning_run(tmp_path):
    runner = fair.Runner(args(tmp_path, report_only=False))  # would train if it ran anything
    chosen, rows = fair.tune(runner, ["binary_rl", "opd"], ["2e-4"], ["frozen"], 1.0, [0], [0])
    assert chosen == {"binary_rl": fair.Choice("binary_rl", ("trainer.lr=2e-4",)),
                      "opd": fair.Choice("opd", ("trainer.lr=2e-4", "judge.teacher=frozen"))}
    assert sum("not run" in r for r in rows) == 2 and not any(tmp_path.iterdir())


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


def test_one_grid_for_every_recipe_and_the_same_teachers_for_opd_and_combined():
    assert [c.label for c in fair.grid("combined", ["1e-4"], ["frozen", "lagged"])] == \
        ["combined lr=1e-4 teacher=frozen", "combined lr=1e-4 teacher=lagged"]
    assert [c.label for c in fair.grid("binary_rl", ["1e-4", "2e-4"], ["frozen"])] == ["binary_rl lr=1e-4", "binary_rl lr=2e-4"]
    [openclaw] = fair.grid("openclaw", ["2e-4"], ["frozen", "lagged"])  # its teacher is the recipe's: frozen
    assert (openclaw.recipe, openclaw.recipe_file, openclaw.label) == \
        ("combined", "cpu_openclaw.yaml", "openclaw probe_hint=directive lr=2e-4")
    assert openclaw.is_combined
    ns = argparse.Namespace(eval_users="1001,1002,1004", eval_seeds="10,11,12", pairs="zip")
    assert fair.evaluation_pairs(ns) == [(1001, 10), (1002, 11), (1004, 12)]
    with pytest.raises(SystemExit, match="as many seeds as users"):
        fair.evaluation_pairs(argparse.Namespace(eval_users="1,2", eval_seeds="10", pairs="zip"))


def test_every_combined_row_is_compared_with_the_best_row_that_is_not_combined_at_both_horizons(tmp_path):
    runner = fair.Runner(args(tmp_path, early=16))
    chosen = {r: fair.Choice(r, ("trainer.lr=2e-4",)) for r in ("binary_rl", "opd", "combined")}
    rows = fair.with_variants(chosen, ["opd directive", "combined directive + teacher baseline"])
    assert rows["combined directive + teacher baseline"].overrides == (
        "trainer.lr=2e-4", "judge.rules_hint=directive", "rollout.env_args.probe_hint=directive",
        "algo.opd_baseline=teacher")
    pairs = [(1001, 10), (1002, 11), (1004, 12)]
    curves = {"binary_rl": [0.0, 0.0, 0.1, 0.5], "opd": [0.0, 0.2, 0.3, 0.3], "combined": [0.0, 0.1, 0.2, 0.4],
              "opd directive": [0.0, 0.3, 0.4, 0.4], "combined directive + teacher baseline": [0.0, 0.4, 0.5, 0.6]}
    for name, curve in curves.items():
        for user, seed in pairs:  # evaluations at versions 0, 8, 16, 24: the first horizon holds three
            finish(runner, rows[name], 1.0, "realistic", user, seed, curve, every=8)
    table, results = fair.evaluate(runner, rows, [1.0], ["realistic"], [], [], pairs)
    best = results["realistic/acc1/combined directive + teacher baseline"]
    assert best["early_final_mean"] == 0.5 and best["early_area_mean"] == 0.3  # (0 + 0.4 + 0.5) / 3
    # against the best row that is not combined: binary RL by the final score, OPD directive by the areas
    assert best["vs_best_other_final"].startswith("combined directive + teacher baseline - binary_rl: +0.100")
    assert best["vs_best_other_early_area"].startswith(
        "combined directive + teacher baseline - opd directive: +0.067")
    assert "vs_best_other_final" not in results["realistic/acc1/opd directive"]
    # the recipe's own row against the best that is not combined, never against a combined variant
    assert results["realistic/acc1/interval_final"].startswith("combined - binary_rl: -0.100")
    assert len([r for r in table if r.startswith("| 1 |")]) == 5


def test_contradicting_hint_rows_and_the_probe_table(tmp_path):
    runner = fair.Runner(args(tmp_path))
    chosen = {r: fair.Choice(r, ("trainer.lr=2e-4",)) for r in ("binary_rl", "opd", "combined")}
    pairs = [(1001, 10), (1002, 11)]
    for user, seed in pairs:
        finish(runner, chosen["binary_rl"], 1.0, "realistic", user, seed, [0.0, 0.5])
        for recipe, final in (("opd", 0.2), ("combined", 0.6)):
            noisy = chosen[recipe].but(f"{recipe} directive", *fair.DIRECTIVE, "judge.hint_noise_kind=contradict",
                                       "judge.hint_noise=0.6")
            finish(runner, noisy, 1.0, "realistic", user, seed, [0.0, final])
        finish(runner, chosen["opd"], 1.0, "realistic", user, seed, [0.0, 0.1], {"uptake_tone": -0.5, "auc_tone": 0.25})
        finish(runner, chosen["opd"].but("opd directive", *fair.DIRECTIVE), 1.0, "realistic", user, seed, [0.0, 0.1],
               {"uptake_tone": 0.5 + 0.25 * (user == 1002), "auc_tone": 0.75})
    rows = fair.hint_noise_rows(runner, chosen, [0.6, 0.3], pairs)
    assert rows[2:] == ["| 0.6 | 0.500 ± 0.000, 0.250 ± 0.000 | 0.200 ± 0.000, 0.100 ± 0.000 | 0.600 ± 0.000, "
                        "0.300 ± 0.000 | 2 | combined - binary_rl: +0.100 "
                        "[+0.100, +0.100] | combined - binary_rl: +0.050 [+0.050, +0.050] |"]  # 0.3 never ran
    probe = fair.probe_rows(runner, {"user words": chosen["opd"],
                                     "directive": chosen["opd"].but("opd directive", *fair.DIRECTIVE)}, 1.0,
                            "realistic", pairs)
    assert probe[2] == "| tone | -0.50 | 0.25 | +0.62 | 0.75 |"
