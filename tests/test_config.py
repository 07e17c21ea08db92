import pytest

from clawr1.config import Config, ConfigError, load_config, parse_override


def test_defaults_and_override_types():
    cfg = load_config(None, ["trainer.lr=1e-5", "pool.batch_size=7", "rollout.env_args={kinds: [format]}"])
    assert isinstance(cfg, Config)
    assert cfg.trainer.lr == 1e-5 and cfg.pool.batch_size == 7
    assert cfg.rollout.env_args == {"kinds": ["format"]}


def test_int_is_accepted_for_float_but_not_the_reverse():
    assert load_config(None, ["trainer.lr=1"]).trainer.lr == 1.0
    with pytest.raises(ConfigError, match="pool.batch_size: expected int"):
        load_config(None, ["pool.batch_size=1.5"])


def test_unknown_key_is_an_error_naming_its_path():
    with pytest.raises(ConfigError, match="unknown config key.*trainer.learning_rate"):
        load_config(None, ["trainer.learning_rate=1"])


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


def test_recipes_differ_only_in_weights_teacher_and_opd_lr():
    combined = load_config("recipes/combined/cpu.yaml")
    binary = load_config("recipes/binary_rl/cpu.yaml")
    opd = load_config("recipes/opd/cpu.yaml")
    assert (combined.algo.w_rl, combined.algo.w_opd) == (1.0, 1.0)
    assert (binary.algo.w_rl, binary.algo.w_opd, binary.judge.teacher) == (1.0, 0.0, "none")
    assert (opd.algo.w_rl, opd.algo.w_opd) == (0.0, 1.0)
    assert binary.rollout == combined.rollout == opd.rollout
    assert binary.trainer == combined.trainer
    assert opd.trainer.lr == combined.trainer.lr / 2  # self-distillation alone drifts at the shared lr
    opd.trainer.lr = combined.trainer.lr
    assert opd.trainer == combined.trainer
