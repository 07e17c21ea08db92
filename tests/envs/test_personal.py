import asyncio
import os
import random

import pytest
import torch

from clawr1.environment import AssistantTurn
from envs.personal.env import PersonalEnv, make_profile
from envs.personal.preferences import (KINDS, OPTIONS, directive_text, parse_style, random_style, read_free_text,
                                      render_answer, violations)
from envs.personal.questions import Question, heldout_questions, train_question
from tests.numerics import assert_close


def test_every_rendered_style_parses_back_to_itself():
    q = Question("q", 3, 4, "km")
    for seed in range(200):
        style = random_style(random.Random(seed))
        assert parse_style(render_answer(q, style)) == style


def test_examples_of_parsing():
    assert parse_style("Sure! <ans>7 kilometers</ans> Because 3 + 4 = 7. Hope this helps!") == {
        "tone": "sure", "closing": "thanks", "length": "explain", "format": "tags", "units": "word"}
    assert parse_style("7 km")["format"] == "plain"
    assert parse_style("seven")["format"] == "?"


def test_violations_name_only_what_differs():
    profile = {"format": "tags", "units": "word"}
    assert violations("<ans>7 kilometers</ans>", profile) == {}
    assert violations("7 kilometers", profile) == {"format": "tags"}


def test_free_text_reader_agrees_with_the_exact_one_on_the_tiny_models_shapes():
    q = Question("q", 3, 4, "km")
    for seed in range(200):
        style = random_style(random.Random(seed))
        assert read_free_text(render_answer(q, style)) == style


def test_free_text_reader_finds_parts_anywhere_and_refuses_mixed_units():
    answer = "Sure, 3 kilometers plus 4 kilometers is 7 kilometers in total."
    assert read_free_text(answer) == {"tone": "sure", "closing": "none", "length": "short", "format": "?",
                                      "units": "word"}
    assert parse_style(answer)["units"] == "?"
    assert read_free_text("To add them: 30 min + 25 min = 55 min.")["units"] == "symbol"
    assert read_free_text("That's 55 min, or 55 minutes.")["units"] == "?"
    assert read_free_text("It takes 1 hour and 5 hours more.")["units"] == "word"
    assert read_free_text("The answer is 12 metres. Hope this helps")["format"] == "sentence"
    assert read_free_text("Walk to the mall.")["units"] == "?"  # "m" not after a number
    profile = {"units": "word"}
    assert violations(answer, profile, read_free_text) == {}
    assert violations(answer, profile) == {"units": "word"}


def test_env_refuses_an_unknown_reader():
    with pytest.raises(ValueError, match="reader must be one of"):
        PersonalEnv({"reader": "lenient"})


def test_directive_text_joins_requests():
    assert directive_text({"format": "tags"}) == "Please put the answer in <ans> tags."
    assert directive_text({"format": "tags", "closing": "thanks"}) == \
        "Please put the answer in <ans> tags and end with 'Hope this helps!'."


def test_profiles_differ_across_seeds_and_cover_kinds():
    profiles = [make_profile(s, list(KINDS)) for s in range(20)]
    assert len({tuple(sorted(p.items())) for p in profiles}) > 10
    assert all(p[k] in OPTIONS[k] for p in profiles for k in KINDS)


def test_a_users_wish_for_a_kind_does_not_depend_on_the_other_kinds_in_play():
    for seed in range(50):
        full = make_profile(seed, list(KINDS))
        for kinds in (["tone"], ["units"], ["tone", "format"], ["closing", "length"]):
            assert make_profile(seed, kinds) == {k: full[k] for k in kinds}
    assert list(make_profile(4, ["tone", "format"])) == ["tone", "format"]  # in the order asked


class AnswerAll:
    """Answers every question as 'Sure! The answer is 7 km.'; records whose adapter was asked."""

    def __init__(self):
        self.users = []

    async def chat(self, session_id, messages, *, side=False, seed=None, user="", **_):
        self.users.append(user)
        return AssistantTurn("Sure! The answer is 7 km.")


def test_each_user_holds_their_own_kinds_and_is_scored_on_them_only():
    env = PersonalEnv({"users": [4, 2001], "user_kinds": {4: ["tone", "format"], 2001: ["tone"]},
                       "reader": "free_text"})
    assert env.profiles == {"u4": {"tone": "sure", "format": "sentence"}, "u2001": {"tone": "certainly"}}
    assert env.eval_metrics == ("personalization_score", "personalization_score_u4", "personalization_score_u2001",
                                "pref_format", "pref_tone")
    agent = AnswerAll()
    out = asyncio.run(env.evaluate(agent, 4, "e"))
    assert sorted(set(agent.users)) == ["u2001", "u4"]
    # u4 wants "Sure!" and "The answer is": every answer does; u2001 wants "Certainly.": none does
    assert (out["personalization_score_u4"], out["personalization_score_u2001"]) == (1.0, 0.0)
    assert "pref_format_u2001" not in out and out["pref_format"] == 1.0  # format: u4's alone
    assert out["pref_tone"] == 0.5 and out["personalization_score"] == 0.5
    as_saved = PersonalEnv({"users": [4, 2001], "user_kinds": {"4": ["tone", "format"], "2001": ["tone"]}})
    assert as_saved.profiles == env.profiles  # a config file read back names users by strings
    with pytest.raises(ValueError, match="user_kinds names user 7"):
        PersonalEnv({"users": [4], "user_kinds": {7: ["tone"]}})
    with pytest.raises(ValueError, match=r"user_kinds\[4\] must be a non-empty subset"):
        PersonalEnv({"users": [4], "user_kinds": {4: ["colour"]}})


def test_heldout_questions_never_appear_in_training():
    rng = random.Random(0)
    train = {train_question(rng).text for _ in range(5000)}
    assert not train & {q.text for q in heldout_questions(200)}


class ScriptedAgent:
    """Answers with a fixed style first, then obeys nothing: to check the user's reactions."""

    def __init__(self, answers):
        self.answers, self.seen, self.completed = list(answers), [], None

    async def chat(self, session_id, messages, *, side=False, seed=None, **_):
        self.seen.append([dict(m) for m in messages])
        return AssistantTurn(self.answers.pop(0))

    async def complete(self, session_id, reward, text=""):
        self.completed = (reward, text)


def test_user_corrects_with_a_directive_then_moves_on():
    env = PersonalEnv({"kinds": ["format"], "profile_seed": 0, "questions_per_session": 2, "implicit_rate": 0.0})
    wanted = env.profile["format"]
    good = render_answer(Question("q", 1, 1, "g"), {"format": wanted, "units": "symbol", "tone": "none",
                                                   "length": "short", "closing": "none"})
    bad = "nonsense"
    agent = ScriptedAgent([bad, good, good])
    result = asyncio.run(env.episode(agent, "s", random.Random(1)))
    correction = agent.seen[1][-1]["content"]
    assert correction.startswith("No. Please ")
    assert agent.seen[2][-1]["content"].split(":")[0] in ("Thanks! Next question", "Got it. Now") or "Great" in agent.seen[2][-1]["content"]
    assert agent.completed == (1.0, "") and result["first_try_ok"] == 0.5 and result["corrections"] == 1


def test_a_language_model_can_word_the_users_messages(tiny_model, tmp_path, loops):
    """The user's corrections and follow-ups come from an OpenAI-compatible endpoint (here our own gateway in
    front of the tiny model); what counts as a violation stays rule-based."""
    from tests.conftest import engine_metric, make_config

    cfg = make_config(tmp_path)
    loops(cfg, "serve").wait_http(f"{cfg.engine_url}/health")
    loops(cfg, "gateway").wait_http(f"{cfg.gateway_url}/health")
    env = PersonalEnv({"kinds": ["format"], "questions_per_session": 2, "implicit_rate": 0.0,
                       "user_llm_url": f"{cfg.gateway_url}/v1"})
    agent = ScriptedAgent(["nonsense"] * 4)  # per question: a wrong answer, a correction, a wrong answer again
    before = engine_metric(cfg.engine_url, "requests_total")

    async def go():
        try:
            return await env.episode(agent, "s", random.Random(3))
        finally:
            await env.user_llm.close()

    result = asyncio.run(go())
    counts = env.report()
    assert engine_metric(cfg.engine_url, "requests_total") - before == 3  # correction, move-on, correction
    assert counts.get("user_llm_messages", 0) + counts.get("user_llm_empty", 0) == 3 and not counts.get("user_llm_errors")
    assert result["corrections"] == 2 and result["first_try_ok"] == 0.0 and agent.completed[0] == -1.0
    if counts.get("user_llm_messages") == 3:  # the model's words, not the script's
        assert not agent.seen[1][-1]["content"].startswith("No. Please ")


def test_an_unreachable_user_model_falls_back_to_the_script():
    from clawr1.ports import free_port

    env = PersonalEnv({"kinds": ["format"], "questions_per_session": 1, "implicit_rate": 0.0,
                       "user_llm_url": f"http://127.0.0.1:{free_port()}/v1"})
    agent = ScriptedAgent(["nonsense", "nonsense"])
    asyncio.run(env.episode(agent, "s", random.Random(0)))
    assert agent.seen[1][-1]["content"].startswith("No. Please ") and env.report() == {"user_llm_errors": 1}


class GroupAgent:
    """Records who asked what under which group id; answers well in the sessions named in `good`."""

    def __init__(self, good_answer: str, good: set[str]):
        self.good_answer, self.good, self.calls, self.completed = good_answer, good, [], {}

    async def chat(self, session_id, messages, *, group_id="", user="", **_):
        self.calls.append((session_id, group_id, user, messages[-1]["content"]))
        return AssistantTurn(self.good_answer if session_id in self.good else "nonsense")

    async def complete(self, session_id, reward, text=""):
        self.completed[session_id] = reward


def test_a_group_is_one_users_sessions_asking_the_same_questions():
    env = PersonalEnv({"kinds": ["format"], "users": [0, 1], "questions_per_session": 2, "implicit_rate": 0.0,
                       "group_size": 3, "max_corrections": 1})
    wanted = env.profiles["u0"]["format"]
    good = render_answer(Question("q", 1, 1, "g"), {"format": wanted, "units": "symbol", "tone": "none",
                                                   "length": "short", "closing": "none"})
    agent = GroupAgent(good, {"s-0"})
    result = asyncio.run(env.episode(agent, "s", random.Random(4)))
    sessions = {c[0] for c in agent.calls}
    assert sessions == {"s-0", "s-1", "s-2"} and {c[2] for c in agent.calls} == {"u0"}  # one user, three sessions
    first = {c[3] for c in agent.calls if c[1] == "s-q0"}
    assert len(first) == 1  # the same first question in every session of the group
    second = [c[3] for c in agent.calls if c[1] == "s-q1"]  # the same next question, after each one's reaction
    common = os.path.commonprefix([t[::-1] for t in second])[::-1]
    assert len(second) == 3 and common.endswith("?") and len(common) > 20 and len(set(second)) > 1
    # first answers in groups of 3; a retry after a correction (s-1 and s-2 only) in none
    assert [c[1] for c in agent.calls if c[0] == "s-1"] == ["s-q0", "", "s-q1", ""]
    assert sorted(c[1] for c in agent.calls if c[1]) == ["s-q0"] * 3 + ["s-q1"] * 3
    assert agent.completed == {"s-0": 1.0, "s-1": -1.0, "s-2": -1.0}
    # counts over three sessions: one float64 division each, and the literals' rounding
    assert_close([result["first_try_ok"], result["corrections"]], [1 / 3, 4 / 3], torch.float64, 2)
    assert asyncio.run(env.episode(agent, "t", random.Random(4))) and {c[2] for c in agent.calls[-12:]} == {"u1"}
    with pytest.raises(ValueError, match="group_size must be >= 1"):
        PersonalEnv({"group_size": 0})


def users_messages(phrasing: str, episodes: int) -> list[str]:
    """Every message a user of this phrasing says after a session's first question, to an agent whose answers take
    every option of every kind in turn."""
    every = "Sure! <ans>7 kilometers</ans> Because 3 + 4 = 7. Hope this helps!", "Certainly. 7 km", "The answer is 7 km."
    said = []
    for seed in range(episodes):
        env = PersonalEnv({"profile_seed": seed, "phrasing": phrasing, "implicit_rate": 0.1})
        agent = ScriptedAgent([every[(seed + i) % 3] for i in range(8)])
        asyncio.run(env.episode(agent, "s", random.Random(seed)))
        said += [seen[-1]["content"] for seen in agent.seen[1:]] + [agent.completed[1]]
    return said


def test_free_users_say_only_held_out_wordings_and_every_one_of_them():
    from envs.personal.phrases import (HELDOUT_COMPLAINTS, PHRASINGS, TRAINING_COMPLAINTS, VAGUE_COMPLAINTS,
                                       heldout_phrasings)
    from envs.personal.preferences import DIRECTIVES, KINDS

    training = [DIRECTIVES[k][o] for k in KINDS for o in OPTIONS[k]]
    training += [p for k in KINDS for o in OPTIONS[k] for p in PHRASINGS[k][o] if p not in heldout_phrasings(k, o)]
    training += VAGUE_COMPLAINTS[:TRAINING_COMPLAINTS]
    heldout = [p for k in KINDS for o in OPTIONS[k] for p in heldout_phrasings(k, o)] + list(HELDOUT_COMPLAINTS)
    assert all(len(heldout_phrasings(k, o)) >= 4 and len(PHRASINGS[k][o]) >= 5 for k in KINDS for o in OPTIONS[k])

    said = " | ".join(users_messages("free", 300)).lower()
    assert [t for t in training if t.lower() in said] == []
    assert [h for h in heldout if h.lower() not in said] == []  # the whole held-out bank is in use
    canonical = " | ".join(users_messages("canonical", 20)).lower()
    own_words = [h for h in heldout if not any(h.lower() in t.lower() for t in training)]  # not inside a directive
    assert any(t.lower() in canonical for t in training) and not any(h.lower() in canonical for h in own_words)


def test_free_wishes_are_sentences_of_held_out_wordings():
    from envs.personal.phrases import heldout_phrasings
    from envs.personal.preferences import free_wish_text

    text = free_wish_text({"format": "tags", "units": "word"}, random.Random(0))
    tags, word = heldout_phrasings("format", "tags"), heldout_phrasings("units", "word")
    assert any(text.startswith(t[0].upper() + t[1:]) for t in tags)
    assert any((w[0].upper() + w[1:]) in text for w in word) and text[-1] in ".?!"
    with pytest.raises(ValueError, match="phrasing must be"):
        PersonalEnv({"phrasing": "poetic"})
