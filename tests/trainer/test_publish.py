"""WeightPublisher with judge.teacher=lagged: the teacher engine gets the policy's weights every teacher_lag versions.

Two real engine processes (the policy's and the lagged teacher's) on loopback; the trainer's publisher
pushes versions 1..7 through the disk sink, each with different weights.
"""
from __future__ import annotations

from clawr1.engine_api.client import SyncEngineClient
from tests.conftest import make_config
from tests.serving.test_engine_api import prompt_ids


def weights_of_version(base: dict, version: int) -> dict:
    """The base weights with the final norm scaled by a version-dependent factor: every version scores differently."""
    state = dict(base)
    state["model.norm.weight"] = base["model.norm.weight"] * (1.0 + 0.25 * version)
    return state


def prompt_logprobs(engine: SyncEngineClient, ids: list[int]) -> list[float]:
    return engine.generate(ids, {"max_new_tokens": 0, "temperature": 0.0}, logprob_start_len=0).prompt_logprobs


def test_lagged_teacher_is_refreshed_every_teacher_lag_versions_only(tiny_model, tmp_path, loops):
    from transformers import AutoTokenizer

    from clawr1.trainer.hf_io import load_hf_state
    from clawr1.trainer.publish import WeightPublisher

    cfg = make_config(tmp_path, "judge.teacher=lagged", "judge.teacher_lag=3")
    assert cfg.judge.teacher_port and cfg.teacher_engine_url != cfg.engine_url
    loops(cfg, "serve").wait_http(f"{cfg.engine_url}/health")
    loops(cfg, "serve", extra=(f"serve.port={cfg.judge.teacher_port}",), name="teacher").wait_http(
        f"{cfg.teacher_engine_url}/health")
    policy, teacher = SyncEngineClient(cfg.engine_url), SyncEngineClient(cfg.teacher_engine_url)
    ids = prompt_ids(AutoTokenizer.from_pretrained(tiny_model))
    base = load_hf_state(tiny_model)
    publisher = WeightPublisher(cfg, tiny_model)
    try:
        scored: dict[int, list[float]] = {0: prompt_logprobs(teacher, ids)}
        for version in range(1, 8):
            publisher.publish(weights_of_version(base, version), version, step=version)
            scored[version] = prompt_logprobs(policy, ids)
            refreshed_at = version - version % 3
            assert policy.weight_version() == version
            assert teacher.weight_version() == refreshed_at, f"after publishing v{version}"
            # the teacher scores with the weights of the last refresh, not the newest ones
            assert prompt_logprobs(teacher, ids) == scored[refreshed_at], f"after publishing v{version}"
            if version != refreshed_at:
                assert scored[version] != scored[refreshed_at]
    finally:
        publisher.close()
        policy.close()
        teacher.close()
