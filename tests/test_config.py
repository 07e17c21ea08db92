import subprocess
import sys

import pytest

from clawr1.config import Config, ConfigError, load_config, parse_override
from tests.conftest import REPO


def test_defaults_and_override_types():
    cfg = load_config(None, ["trainer.lr=1e-5", "pool.batch_size=7", "rollout.env_args={kinds: [format]}"])
    assert isinstance(cfg, Config)
    assert cfg.trainer.lr == 1e-5 and cfg.pool.batch_size == 7
    assert cfg.rollout.env_args == {"kinds": ["format"]}


def test_int_is_accepted_for_float_but_not_the_reverse():
    assert load_config(None, ["trainer.lr=1"]).trainer.lr == 1.0
    with pytest.raises(ConfigError, match=r"pool.batch_size: Input should be a valid integer.*\(got 1.5\)"):
        load_config(None, ["pool.batch_size=1.5"])


def test_unknown_key_is_an_error_naming_its_path_and_the_closest_key():
    with pytest.raises(ConfigError, match=r"unknown key trainer.lrr \(did you mean trainer.lr\?\); keys here: .*lr_schedule"):
        load_config(None, ["trainer.lrr=1"])
    with pytest.raises(ConfigError, match="unknown key bogus_section"):
        load_config(None, ["bogus_section.x=1"])


def test_a_renamed_key_is_an_error_naming_its_new_name():
    with pytest.raises(ConfigError, match=r"^algo.max_staleness is now algo.step_max_staleness$"):
        load_config(None, ["algo.max_staleness=2"])
    assert load_config(None, ["algo.step_max_staleness=2"]).algo.step_max_staleness == 2


@pytest.mark.parametrize("override, message", [
    ("trainer.weight_sync=bogus", "trainer.weight_sync: 'bogus' is not allowed; choose one of: disk, http, nccl"),
    ("judge.backend=gpt", "judge.backend: 'gpt' is not allowed; choose one of: rules, llm, env"),
    ("algo.loss_aggregation=sum", "algo.loss_aggregation: 'sum' is not allowed; choose one of: token-mean, seq-mean-token-mean"),
    ("trainer.lr=-1", "trainer.lr: Input should be greater than 0 (got -1)"),
    ("pool.max_staleness=-1", "pool.max_staleness: Input should be greater than or equal to 0 (got -1)"),
    ("rollout.max_pool_backlog=3", "rollout.max_pool_backlog (3) must be 0 or at least pool.batch_size (16)"),
    ("algo.dual_clip=0.5", "algo.dual_clip must be 0 (off) or > 1, got 0.5"),
])
def test_bad_values_name_the_key_the_value_and_what_is_allowed(override, message):
    with pytest.raises(ConfigError) as err:
        load_config(REPO / "recipes/combined/cpu.yaml", [override])
    assert message in str(err.value)


def test_assignments_are_checked_too():
    cfg = load_config(None)
    with pytest.raises(ValueError, match="weight_sync"):
        cfg.trainer.weight_sync = "bogus"


@pytest.mark.parametrize("override", ["trainer.weight_sync=bogus", "trainer.lrr=1e-4"])
@pytest.mark.parametrize("dry_run", [True, False])
def test_clawr1_run_refuses_a_bad_config_before_anything_starts(tmp_path, override, dry_run):
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "clawr1.cli", "run", "recipes/combined/cpu.yaml", override, f"run.dir={run_dir}"]
    out = subprocess.run(cmd + (["--dry-run"] if dry_run else []), cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert override.split("=")[0] in out.stderr and ("disk, http, nccl" in out.stderr or "did you mean trainer.lr" in out.stderr)
    assert not run_dir.exists() and not out.stdout


def test_a_dry_run_writes_nothing(tmp_path):
    run_dir = tmp_path / "run"
    out = subprocess.run([sys.executable, "-m", "clawr1.cli", "run", "recipes/combined/cpu.yaml", f"run.dir={run_dir}",
                          "--dry-run"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "wave 1  pool" in out.stdout and "wave 2  trainer" in out.stdout
    assert not run_dir.exists()


def test_every_loop_command_checks_the_config_at_load(tmp_path):
    out = subprocess.run([sys.executable, "-m", "clawr1.cli", "train", "--config", "recipes/combined/cpu.yaml",
                          "algo.baseline=median"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "algo.baseline: 'median' is not allowed; choose one of: group, none" in out.stderr


def test_include_merges_and_overrides(tmp_path):
    (tmp_path / "base.yaml").write_text("trainer:\n  lr: 0.5\n  grad_clip: 2.0\npool:\n  batch_size: 3\n")
    (tmp_path / "child.yaml").write_text("include: base.yaml\ntrainer:\n  lr: 0.25\n")
    cfg = load_config(tmp_path / "child.yaml")
    assert (cfg.trainer.lr, cfg.trainer.grad_clip, cfg.pool.batch_size) == (0.25, 2.0, 3)


def test_bad_override_and_missing_file_are_clear():
    with pytest.raises(ConfigError, match="key.path=value"):
        parse_override("trainer.lr")
    with pytest.raises(ConfigError, match="not found"):
        load_config("no/such/file.yaml")


def test_recipes_differ_only_in_weights_teacher_and_lr():
    combined = load_config(REPO / "recipes/combined/cpu.yaml")
    binary = load_config(REPO / "recipes/binary_rl/cpu.yaml")
    opd = load_config(REPO / "recipes/opd/cpu.yaml")
    assert (combined.algo.w_rl, combined.algo.w_opd) == (1.0, 1.0)
    assert (binary.algo.w_rl, binary.algo.w_opd, binary.judge.teacher) == (1.0, 0.0, "none")
    assert (opd.algo.w_rl, opd.algo.w_opd) == (0.0, 1.0)
    assert binary.rollout == combined.rollout == opd.rollout
    # docs/personalization.md: combined distils from the frozen base (a self-teacher drifts) at binary RL's rate;
    # OPD alone from the policy of 10 versions ago, at the rate its self-teacher needed
    assert (combined.judge.teacher, opd.judge.teacher, opd.judge.teacher_lag) == ("frozen", "lagged", 10)
    assert (combined.trainer.lr, opd.trainer.lr, binary.trainer.lr) == (2e-4, 1e-4, 2e-4)
    opd.trainer.lr = combined.trainer.lr
    assert binary.trainer == combined.trainer == opd.trainer


def test_smollm2_recipes_differ_only_in_weights_and_teacher():
    combined, binary, opd = (load_config(REPO / f"recipes/{r}/cpu_smollm2.yaml") for r in ("combined", "binary_rl", "opd"))
    assert [(c.algo.w_rl, c.algo.w_opd) for c in (combined, binary, opd)] == [(1.0, 1.0), (1.0, 0.0), (0.0, 1.0)]
    assert (combined.judge.teacher, binary.judge.teacher, opd.judge.teacher) == ("frozen", "none", "frozen")
    assert binary.rollout == combined.rollout == opd.rollout and combined.rollout.env_args["reader"] == "free_text"
    assert binary.trainer == combined.trainer == opd.trainer and combined.trainer.lr == 1e-5
    assert combined.model.name == "smollm2-135m-instruct"


def test_the_lora_users_recipe_is_combined_with_one_adapter_per_user():
    combined = load_config(REPO / "recipes/combined/cpu.yaml")
    users = load_config(REPO / "recipes/combined/cpu_lora_users.yaml")
    assert (users.lora.enabled, users.lora.per_user, users.lora.slots, users.lora.sync) == (True, True, 2, "adapter")
    assert users.rollout.env_args["users"] == [0, 1] and users.trainer.lr == 3e-3  # measured: docs/lora.md
    assert users.serve.max_loras == 7  # three versions of each slot's adapter, and one more
    assert users.algo == combined.algo and users.judge.teacher == "policy"  # the base, adapter off: no 2nd engine
    assert users.judge.model_copy(update={"teacher": combined.judge.teacher}) == combined.judge


def test_the_qwen_lora_recipes_differ_only_in_weights_and_teacher_and_score_the_base_as_teacher():
    combined, binary, opd = (load_config(REPO / f"recipes/{r}/cpu_qwen05_lora.yaml") for r in ("combined", "binary_rl", "opd"))
    assert [(c.algo.w_rl, c.algo.w_opd) for c in (combined, binary, opd)] == [(1.0, 1.0), (1.0, 0.0), (0.0, 1.0)]
    assert (combined.judge.teacher, binary.judge.teacher, opd.judge.teacher) == ("policy", "none", "policy")
    assert binary.rollout == combined.rollout == opd.rollout and binary.trainer == combined.trainer == opd.trainer
    assert binary.lora == combined.lora == opd.lora and combined.lora.serves_adapters and combined.lora.rank == 16
    live = load_config(REPO / "recipes/live/cpu_qwen05_lora.yaml")
    assert live.lora.serves_adapters and live.judge.teacher == "policy" and not live.judge.runs_own_teacher
    assert {c.model.name for c in (combined, binary, opd, live)} == {"qwen2.5-coder-0.5b-instruct"}


@pytest.mark.parametrize("overrides, message", [
    (["lora.per_user=true"], "set lora.enabled=true"),
    (["lora.enabled=true", "lora.slots=3"], "set lora.per_user=true"),
    (["lora.enabled=true", "lora.per_user=true", "lora.sync=merged"], "needs lora.sync=adapter"),
    (["lora.enabled=true", "lora.slots=1", "serve.max_loras=2"], "must hold three versions"),
    (["lora.enabled=true", "lora.rank=128"], "exceeds serve.max_lora_rank"),
    (["lora.enabled=true", "judge.teacher=lagged"], "judge.teacher=lagged"),
    (["lora.enabled=true", "lora.targets=[linear_qkv,lm_head]"], "lora.targets"),
])
def test_contradictory_lora_settings_are_refused(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(REPO / "recipes/combined/cpu.yaml", overrides)


def test_a_bare_on_or_off_override_keeps_its_word():
    """YAML 1.1 reads on/off as booleans; the switches take them as their words (found on the first GPU loops run)."""
    cfg = load_config(None, ["trainer.transformer_engine=off", "algo.opd_gate=off"])
    assert (cfg.trainer.transformer_engine, cfg.algo.opd_gate) == ("off", "off")
    assert load_config(None, ["trainer.transformer_engine=on"]).trainer.transformer_engine == "on"
    with pytest.raises(ConfigError, match="algo.opd_gate: 'on' is not allowed"):
        load_config(None, ["algo.opd_gate=on"])


def test_the_tinker_recipes_train_and_serve_through_tinker_with_openclaw_rls_defaults():
    for recipe in ("recipes/combined/tinker.yaml", "recipes/live/tinker.yaml"):
        cfg = load_config(REPO / recipe)
        assert (cfg.trainer.backend, cfg.serve.backend, cfg.judge.teacher) == ("tinker", "tinker", "frozen")
        assert (cfg.tinker.base_model, cfg.tinker.lora_rank, cfg.trainer.lr, cfg.pool.batch_size, cfg.tinker.loss_fn) == (
            "Qwen/Qwen3-4B-Instruct-2507", 32, 1e-4, 4, "ppo")
        assert cfg.tinker.base_url == ""  # Tinker's own service unless told otherwise


@pytest.mark.parametrize("overrides, message", [
    (["trainer.backend=tinker"], "trainer.backend=tinker and serve.backend=tinker go together"),
    (["serve.backend=tinker"], "trainer.backend=tinker and serve.backend=tinker go together"),
    (["trainer.backend=tinker", "serve.backend=tinker", "algo.kl_coef=0.1", "algo.ppo_epochs=2"],
     "trainer.backend=tinker does not support algo.kl_coef, algo.ppo_epochs"),
    (["trainer.backend=tinker", "serve.backend=tinker", "lora.enabled=true"],
     "trainer.backend=tinker does not support lora.enabled"),
])
def test_tinker_backends_refuse_what_only_the_megatron_trainer_has(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


def test_the_policy_as_the_llm_judge_votes_on_the_serving_engine_and_starts_no_prm_engine():
    cfg = load_config(None, ["judge.backend=llm", "judge.prm=policy", "judge.llm_api=generate", "serve.port=23001"])
    assert cfg.prm_url == cfg.engine_urls[0] == "http://127.0.0.1:23001" and not cfg.judge.runs_own_prm
    own = load_config(None, ["judge.backend=llm", "judge.llm_api=generate", "judge.prm_port=23002"])
    assert own.judge.runs_own_prm and own.prm_url == "http://127.0.0.1:23002"
    for wrong in (["judge.llm_api=openai"], ["judge.llm_api=generate", "judge.llm_url=http://127.0.0.1:9/v1"]):
        with pytest.raises(ConfigError, match="judge.prm=policy sends the votes to the serving engine"):
            load_config(None, ["judge.backend=llm", "judge.prm=policy", *wrong])
