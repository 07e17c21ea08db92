"""trainer.backend=tinker's contract: a pool batch becomes the Datums the trainer planned, and what the SDK's own
encoder puts on the wire decodes back to exactly those tokens, log-probs and advantages (prompts, a multi-turn
mask, OPD and RL signals, a sample with only one of them)."""
from __future__ import annotations

import numpy as np
import pytest

from clawr1.config import AlgoConfig
from clawr1.protocol import Sample
from clawr1.trainer.step import plan_batch
from clawr1.trainer.tinker_client_plan import planned_datums, ppo_loss_config

tinker = pytest.importorskip("tinker", reason="needs the Tinker SDK (the `tinker` extra: scripts/setup.sh installs it)")
from tinker.proto import request_conv, tinker_public_pb2 as pb  # noqa: E402
from tinker.types import ForwardBackwardInput  # noqa: E402
from tinker.types.forward_backward_request import ForwardBackwardRequest  # noqa: E402

from clawr1.trainer.tinker_client_trainer import sdk_datum  # noqa: E402


def batch() -> list[Sample]:
    """Two samples of one group (+1 and -1), the first multi-turn (tool output masked) with a hint; a third with a
    hint and no reward; rollout and teacher log-probs that are not round in float32."""
    return [
        Sample(sample_id="a", group_id="g", tokens=[5, 6, 7, 8, 20, 21, 30, 31, 22, 23], prompt_len=4,
               loss_mask=[1, 1, 0, 0, 1, 1], rollout_logprobs=[-0.1, -0.7, -2.0, -3.0, -0.3, -1.3],
               versions=[0] * 6, reward=1.0, teacher_logprobs=[-0.2, -0.2, -1.0, -1.0, -0.05, -2.1]),
        Sample(sample_id="b", group_id="g", tokens=[5, 6, 7, 8, 40, 41, 42], prompt_len=4, loss_mask=[1, 1, 1],
               rollout_logprobs=[-1.1, -0.9, -0.33], versions=[0] * 3, reward=-1.0),
        Sample(sample_id="c", group_id="h", tokens=[9, 10, 50, 51], prompt_len=2, loss_mask=[1, 1],
               rollout_logprobs=[-0.6, -1.7], versions=[0, 0], teacher_logprobs=[-0.1, -1.9]),
    ]


ALGO = AlgoConfig(w_rl=1.0, w_opd=0.5, normalize_std=False, opd_center="none", opd_clip=0.0,
                  loss_aggregation="token-mean", tis_cap=0.0)


def hand_advantages(s: Sample, rl: float, trained_tokens: int) -> list[float]:
    """A = (w_rl * A_rl + w_opd * (teacher - rollout)) / tokens trained in the batch, 0 where masked."""
    teacher = s.teacher_logprobs or s.rollout_logprobs
    return [(ALGO.w_rl * rl + ALGO.w_opd * (t - r)) / trained_tokens * m
            for t, r, m in zip(teacher, s.rollout_logprobs, s.loss_mask)]


def test_each_sample_becomes_a_datum_aligned_for_next_token_prediction_with_hand_computed_advantages():
    samples = batch()
    plan, _ = plan_batch(samples, ALGO, trainer_version=0, baselines={})
    datums, _ = planned_datums(plan, ALGO)
    trained_tokens = 4 + 3 + 2
    rl = {"a": 1.0, "b": -1.0, "c": 0.0}  # r - group mean (normalize_std off); c has no reward
    for s, d in zip(samples, datums):
        pad = s.prompt_len - 1
        assert d.model_input == s.tokens[:-1] and d.target_tokens == s.tokens[1:]
        assert d.logprobs[:pad] == [0.0] * pad and d.advantages[:pad] == [0.0] * pad
        assert d.logprobs[pad:] == [lp if m else 0.0 for lp, m in zip(s.rollout_logprobs, s.loss_mask)]
        # float32 tensors inside the planner: rounding of one product and one sum per token
        np.testing.assert_allclose(d.advantages[pad:], hand_advantages(s, rl[s.sample_id], trained_tokens),
                                   rtol=1e-6, atol=1e-7)
    a = datums[0]
    assert a.advantages[4 + 1:4 + 3] == [0.0, 0.0]  # the masked tool output trains nothing


def test_the_sdks_wire_encoding_decodes_back_to_the_planned_tokens_logprobs_and_advantages():
    plan, _ = plan_batch(batch(), ALGO, trainer_version=0, baselines={})
    datums, _ = planned_datums(plan, ALGO)
    config = ppo_loss_config("ppo", ALGO)
    request = ForwardBackwardRequest(forward_backward_input=ForwardBackwardInput(
        data=[sdk_datum(d) for d in datums], loss_fn="ppo", loss_fn_config=config), model_id="m", seq_id=1)
    wire = request_conv.forward_backward_request_to_proto(request).SerializeToString()
    decoded = pb.ForwardBackwardRequest()
    decoded.ParseFromString(wire)
    assert decoded.loss_fn == "ppo"
    assert dict(decoded.loss_fn_config) == pytest.approx({"clip_low_threshold": 0.8, "clip_high_threshold": 1.28})
    assert len(decoded.data) == len(datums)
    for planned, got in zip(datums, decoded.data):
        tokens = [t for chunk in got.model_input for t in np.frombuffer(chunk.encoded_text.tokens, dtype="<i4")]
        assert tokens == planned.model_input
        inputs = {name: _dense(t) for name, t in got.loss_fn_inputs.items()}
        assert inputs["target_tokens"].tolist() == planned.target_tokens
        # the wire carries float32: each value is the planned one rounded once
        assert inputs["logprobs"].tolist() == np.float32(planned.logprobs).tolist()
        assert inputs["advantages"].tolist() == np.float32(planned.advantages).tolist()


def test_a_stale_sample_is_dropped_before_it_becomes_a_datum():
    samples = batch()
    samples[0].versions, samples[2].versions = [2] * 6, [2, 2]
    algo = ALGO.model_copy(update={"step_max_staleness": 1})
    plan, _ = plan_batch(samples, algo, trainer_version=2, baselines={})
    assert plan.dropped_stale == 1 and [d.sample_id for d in planned_datums(plan, algo)[0]] == ["a", "c"]
    plan, _ = plan_batch(samples, algo, trainer_version=4, baselines={})
    assert plan.dropped_stale == 3 and planned_datums(plan, algo)[0] == []


def test_other_losses_get_no_clip_config():
    assert ppo_loss_config("importance_sampling", ALGO) == {} == ppo_loss_config("cispo", ALGO)


def _dense(t: "pb.Tensor") -> np.ndarray:
    dtype = {pb.DTYPE_FLOAT32: np.float32, pb.DTYPE_INT64: np.int64}[t.dtype]
    return np.frombuffer(t.dense, dtype=dtype)
