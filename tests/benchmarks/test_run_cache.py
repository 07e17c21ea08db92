"""Benchmark run directories are named by their settings: other overrides never reuse a cached run."""
from __future__ import annotations

from benchmarks.personal_runs import personal_run
from benchmarks.run_cache import settings_hash
from tests.conftest import REPO

RECIPE = REPO / "recipes/combined/cpu.yaml"


def run_dir(*args, **kw):
    return personal_run(*args, **kw).path


def test_the_same_settings_name_the_same_run_and_other_settings_another(tmp_path):
    assert settings_hash(RECIPE, ["trainer.lr=1e-3"]) == settings_hash(RECIPE, ["trainer.lr=0.001"])
    assert settings_hash(RECIPE, [f"run.dir={tmp_path}"]) == settings_hash(RECIPE, [])  # where it runs is no setting
    assert settings_hash(RECIPE, ["trainer.lr=1e-3"]) != settings_hash(RECIPE, ["trainer.lr=2e-3"])
    assert settings_hash(RECIPE, []) != settings_hash(REPO / "recipes/combined/cpu_lora_users.yaml", [])
    first = run_dir(tmp_path, "combined", 0.7, 0, 1, 150, [])
    assert first == run_dir(tmp_path, "combined", 0.7, 0, 1, 150, [])
    assert first.name.startswith("combined-s1-") and first.parent == tmp_path / "realistic" / "acc0.7" / "p0"
    oracle = run_dir(tmp_path, "combined", 0.7, 0, 1, 150, [], setting="oracle")
    assert oracle.parent == tmp_path / "oracle" / "acc0.7" / "p0" and oracle.name != first.name
    assert run_dir(tmp_path, "combined", 0.7, 0, 1, 150, ["algo.opd_center=sample"]) != first
    assert run_dir(tmp_path, "combined", 0.7, 0, 1, 100, []) != first


def test_a_field_added_later_at_its_neutral_default_keeps_the_names_of_earlier_runs():
    """algo.balance=none trains as before the field existed, so runs cached then keep their names (checked once
    by hand: the same hash at the commit before the field); balance=std is another run."""
    assert settings_hash(RECIPE, ["trainer.lr=1e-4"]) == settings_hash(RECIPE, ["trainer.lr=1e-4", "algo.balance=none"])
    assert settings_hash(RECIPE, ["trainer.lr=1e-4"]) != settings_hash(RECIPE, ["trainer.lr=1e-4", "algo.balance=std"])
    assert settings_hash(RECIPE, []) != settings_hash(RECIPE, ["serve.sglang.device=cpu"])


def test_a_nested_field_at_its_neutral_default_is_left_out_of_the_hash(monkeypatch):
    """serve.sglang.device=auto: learning IV's first run kept its name (22f67838) across the field's addition."""
    from benchmarks import run_cache

    kept = settings_hash(RECIPE, [])
    monkeypatch.setattr(run_cache, "NEUTRAL_DEFAULTS", {k: v for k, v in run_cache.NEUTRAL_DEFAULTS.items()
                                                        if k != ("serve", "sglang", "device")})
    assert settings_hash(RECIPE, []) != kept


def test_a_renamed_field_is_hashed_under_its_old_name(monkeypatch):
    """algo.step_max_staleness was algo.max_staleness: runs made before the rename keep their names."""
    from benchmarks import run_cache

    kept = settings_hash(RECIPE, ["algo.step_max_staleness=2"])
    assert kept != settings_hash(RECIPE, [])
    monkeypatch.setattr(run_cache, "RENAMED_FIELDS", {})
    assert settings_hash(RECIPE, ["algo.step_max_staleness=2"]) != kept
