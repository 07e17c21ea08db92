"""The judge's backends end to end: sample merging, env outcomes for whole sessions, llm votes on real endpoints."""
from __future__ import annotations

import asyncio

import pytest

from clawr1.config import JudgeConfig
from clawr1.judge.env import EnvJudge
from clawr1.judge.llm import LlmJudge
from clawr1.judge.main import make_sample
from clawr1.judge.teacher import TeacherScores
from clawr1.judge.rules import Verdict
from clawr1.protocol import NextState, TurnRecord
from clawr1.engine_api.client import Generation
from tests.conftest import engine_metric, make_config


def record(session: str, turn: int, next_state=None, temperature: float = 1.0) -> TurnRecord:
    return TurnRecord(session_id=session, turn_index=turn, prompt_ids=[1, 2], response_ids=[3, 4],
                      rollout_logprobs=[-1.0, -2.0], versions=[5, 5], messages=[{"role": "user", "content": "q"}],
                      response_text="a", next_state=next_state, group_id="g", task_id="t", temperature=temperature)


def test_a_sample_carries_every_signal_the_turn_earned():
    teacher = Generation(output_ids=[], logprobs=[], versions=[], text="", finish_reason="length",
                         prompt_logprobs=[-0.5, -0.1], weight_version=7, prompt_top_ids=[[3, 9], [4, 8]],
                         prompt_top_logprobs=[[-0.5, -2.0], [-0.1, -3.0]])
    s = make_sample(record("s", 2, temperature=0.7), Verdict(-1.0, hint="Use tags.", votes=[-1, -1, 1]),
                    TeacherScores(teacher, temperature=1.0))
    s.check()
    assert (s.reward, s.teacher_logprobs, s.teacher_version, s.hint) == (-1.0, [-0.5, -0.1], 7, "Use tags.")
    assert (s.temperature, s.teacher_temperature) == (0.7, 1.0)  # e.g. an SGLang teacher: raw logits
    assert s.teacher_topk_ids == [[3, 9], [4, 8]] and s.votes == [-1, -1, 1]
    assert s.tokens == [1, 2, 3, 4] and s.prompt_len == 2 and (s.group_id, s.task_id) == ("g", "t")
    only_reward = make_sample(record("s", 3), Verdict(1.0), None)
    assert only_reward.teacher_logprobs is None and only_reward.reward == 1.0 and only_reward.group_id == "g"


def test_env_backend_gives_the_outcome_to_every_turn_of_the_session():
    judge = EnvJudge(JudgeConfig(backend="env", env_reward="all_turns"))

    async def go():
        first = await judge.verdicts(record("e", 0, NextState(kind="user", text="next")))
        second = await judge.verdicts(record("e", 1, NextState(kind="tool", text="ok")))
        last = await judge.verdicts(record("e", 2, NextState(kind="outcome", reward=0.5, done=True)))
        return first, second, last

    first, second, last = asyncio.run(go())
    assert first == second == [] and [v.score for _, v in last] == [0.5, 0.5, 0.5]
    assert [r.turn_index for r, _ in last] == [0, 1, 2] and not judge.held
    only_last = EnvJudge(JudgeConfig(backend="env"))
    out = asyncio.run(only_last.verdicts(record("e", 0, NextState(kind="user", text="next"))))
    assert [v.score for _, v in out] == [None]


def test_env_backend_holds_a_bounded_number_of_sessions():
    judge = EnvJudge(JudgeConfig(backend="env", env_reward="all_turns", max_held_sessions=2))
    for i in range(4):
        asyncio.run(judge.verdicts(record(f"s{i}", 0, NextState(kind="user", text="x"))))
    assert list(judge.held) == ["s2", "s3"] and judge.dropped_held == 2


def verdict_on_a_correction(judge: LlmJudge):
    async def go():
        try:
            return await judge.verdict(record("s", 0, NextState(kind="user", text="No. Please use tags.")))
        finally:
            await judge.close()

    return asyncio.run(go())


@pytest.mark.parametrize("api", ["openai", "generate"])
def test_llm_backend_asks_m_votes_of_each_kind_on_a_real_endpoint(tiny_model, tmp_path, loops, api):
    cfg = make_config(tmp_path)
    engine = loops(cfg, "serve")
    engine.wait_http(f"{cfg.engine_url}/health")
    url = cfg.engine_url
    if api == "openai":
        gateway = loops(cfg, "gateway")
        gateway.wait_http(f"{cfg.gateway_url}/health")
        url = f"{cfg.gateway_url}/v1"
    judge = LlmJudge(JudgeConfig(backend="llm", llm_url=url, llm_api=api, votes=3, vote_max_tokens=8))
    before = engine_metric(cfg.engine_url, "requests_total")
    verdict = verdict_on_a_correction(judge)
    assert engine_metric(cfg.engine_url, "requests_total") - before == 6  # 3 evaluation + 3 hint votes
    # the tiny model cannot vote: every unparsable answer is an abstention, counted, and the turn gets no score
    assert judge.counts["votes"] == 6 and judge.counts["abstentions"] + judge.counts["hints_accepted"] <= 6
    if judge.counts["decisions"] == 0:
        assert verdict.score is None
    assert judge.report()["llm_endpoint_errors"] == 0


def test_the_policy_as_judge_votes_on_the_serving_engine(tiny_model, tmp_path, loops):
    cfg = make_config(tmp_path, "judge.backend=llm", "judge.prm=policy", "judge.llm_api=generate", "judge.votes=2",
                      "judge.vote_max_tokens=8")
    engine = loops(cfg, "serve")
    engine.wait_http(f"{cfg.engine_url}/health")
    before = engine_metric(cfg.engine_url, "requests_total")
    judge = LlmJudge(cfg.judge, cfg.prm_url)  # what the judge loop builds (clawr1/judge/main.py)
    verdict_on_a_correction(judge)
    assert engine_metric(cfg.engine_url, "requests_total") - before == 4  # 2 evaluation + 2 hint votes
    assert judge.report()["llm_endpoint_errors"] == 0


def test_report_shows_how_long_turns_waited_for_the_judge(tiny_model, tmp_path):
    import time

    from transformers import AutoTokenizer

    from clawr1.judge.main import Judge

    judge = Judge(make_config(tmp_path), AutoTokenizer.from_pretrained(tiny_model))
    now = time.time()
    for i, waited in enumerate((2.0, 0.5)):
        r = record("w", i)
        r.sent_at = now - waited
        judge.received(r)
    first = judge.report()
    late = time.time() - now  # how long after `now` the report came (a loaded machine may take a while)
    assert 1.25 <= first["queue_wait_s_mean"] <= 1.25 + late and 2.0 <= first["queue_wait_s_max"] <= 2.0 + late
    assert first["backlog"] == 2 and first["inflight"] == 2
    assert judge.report()["queue_wait_s_max"] == 0.0  # waits are per report window; counters are not
    assert judge.report()["received"] == 2


def test_an_unreachable_prm_endpoint_gives_abstentions_not_a_crash():
    from clawr1.ports import free_port

    judge = LlmJudge(JudgeConfig(backend="llm", llm_url=f"http://127.0.0.1:{free_port()}/v1", votes=3))
    verdict = verdict_on_a_correction(judge)
    assert verdict.score is None and verdict.hint == ""
    assert judge.report()["llm_endpoint_errors"] == 6 and judge.report()["abstention_rate"] == 1.0
