"""Directive hints (judge.rules_hint=directive), contradicting wrong hints (judge.hint_noise_kind=contradict),
dropped 0-scored turns (judge.drop_zero) and the teacher's unhinted scores (algo.opd_baseline=teacher)."""
from __future__ import annotations

import asyncio
import random

import pytest

from clawr1.config import ConfigError, DirectiveOption, JudgeConfig, load_config
from clawr1.judge.directives import DirectiveMap, request
from clawr1.judge.noise import HintNoise
from clawr1.judge.rules import RulePatterns, judge_rules
from clawr1.protocol import NextState, TurnRecord
from tests.conftest import make_config

RECIPE = "recipes/combined/cpu.yaml"  # the personal env's recipes include recipes/personal_directives.yaml
PATTERNS = RulePatterns.compile(JudgeConfig().correction_patterns, JudgeConfig().directive_patterns)


def personal_map() -> DirectiveMap:
    return DirectiveMap(load_config(RECIPE).judge.directives)


def record(reply: str, session: str = "s", prompt_ids=(1, 2), response_ids=(3, 4)) -> TurnRecord:
    return TurnRecord(session_id=session, turn_index=0, prompt_ids=list(prompt_ids), response_ids=list(response_ids),
                      rollout_logprobs=[-1.0] * len(response_ids), versions=[0] * len(response_ids),
                      messages=[{"role": "user", "content": "What is 3 km plus 4 km?"}], response_text="a",
                      next_state=NextState(kind="user", text=reply) if reply is not None else None)


def test_a_directive_hint_is_made_of_configured_options_only():
    mapping = personal_map()
    configured = {o.directive for o in load_config(RECIPE).judge.directives}
    for reply, wanted in (("No. Spell the units out please.", ["spell out the units like kilometers"]),
                          ("Hmm, not quite. Could you wrap the result in <ans> tags? Skip the pleasantries.",
                           ["put the answer in <ans> tags", "skip the pleasantries at the start"]),
                          ("No. Please put the answer in <ans> tags and end with 'Hope this helps!'.",
                           ["put the answer in <ans> tags", "end with 'Hope this helps!'"])):
        verdict = judge_rules(record(reply), PATTERNS, directive_hint=mapping.hint)
        assert verdict.score == -1.0 and verdict.reason == "correction"
        assert verdict.hint == request([w for w in mapping.wishes(reply)]) == \
            "Please " + (wanted[0] if len(wanted) == 1 else f"{wanted[0]} and {wanted[1]}") + "."
        assert set(wanted) <= configured


def test_an_unmappable_correction_gives_no_hint_and_the_same_score():
    mapping = personal_map()
    reply = "No. Please do it the other way."
    words = judge_rules(record(reply), PATTERNS)
    directive = judge_rules(record(reply), PATTERNS, directive_hint=mapping.hint)
    assert words.hint == "Please do it the other way." and words.score == -1.0
    assert (directive.score, directive.hint, directive.reason) == (-1.0, "", "correction, unmapped")
    # scores never depend on the hint's source
    for reply in ("Thanks! Next question: What is 1 g plus 2 g?", "Hmm. What is 3 km plus 4 km?",
                  "Ugh, that's not it.", "Nope. Skip the pleasantries.", "Could you spell the units out?"):
        assert judge_rules(record(reply), PATTERNS).score == \
            judge_rules(record(reply), PATTERNS, directive_hint=mapping.hint).score


def test_of_a_kinds_options_the_most_matches_win_and_the_first_listed_on_a_tie():
    mapping = DirectiveMap([DirectiveOption(kind="k", option="a", directive="do a", patterns=["alpha", "first"]),
                            DirectiveOption(kind="k", option="b", directive="do b", patterns=["beta", "first"]),
                            DirectiveOption(kind="j", option="c", directive="do c", patterns=["gamma"])])
    assert [w.option for w in mapping.wishes("beta first please")] == ["b"]
    assert [w.option for w in mapping.wishes("alpha beta")] == ["a"]  # a tie: listed first
    assert [w.option for w in mapping.wishes("alpha, and then beta")] == ["b"]  # a later clause overrides
    assert mapping.hint("gamma. beta.") == "Please do c and do b."
    assert mapping.hint("nothing here") == ""


def test_contradict_draws_only_options_the_profile_does_not_hold():
    mapping = personal_map()
    options = load_config(RECIPE).judge.directives
    profile = {"format": "tags", "units": "word", "tone": "sure", "length": "short", "closing": "thanks"}
    true_hint = request([w for o in options if profile[o.kind] == o.option
                         for w in mapping.wishes(o.directive)])
    assert {w.kind: w.option for w in mapping.wishes(true_hint)} == profile
    rng = random.Random(0)
    seen: dict[str, set] = {kind: set() for kind in profile}
    for _ in range(200):
        wrong = mapping.contradict(true_hint, rng)
        drawn = {w.kind: w.option for w in mapping.wishes(wrong)}
        assert set(drawn) == set(profile) and all(drawn[k] != profile[k] for k in profile), wrong
        for k, o in drawn.items():
            seen[k].add(o)
    assert seen["format"] == {"plain", "sentence"} and seen["tone"] == {"none", "certainly"}  # every other option
    assert mapping.contradict("Please do it the other way.", rng) is None
    noise = HintNoise(noise=1.0, drop=0.0, rng=random.Random(1), contradict=mapping.contradict)
    assert noise.apply("Please do it the other way.") == ("Please do it the other way.", "no_wrong_one")
    hint, what = noise.apply("Please spell out the units like kilometers.")
    assert what == "wrong" and hint == "Please write units as symbols like km."


def test_settings_that_need_directives_say_so():
    with pytest.raises(ConfigError, match="judge.directives is empty"):
        load_config(None, ["judge.rules_hint=directive"])
    with pytest.raises(ConfigError, match="contradict .* needs judge.directives"):
        load_config(None, ["judge.hint_noise=0.3", "judge.hint_noise_kind=contradict"])
    with pytest.raises(ConfigError, match="opd_baseline=teacher .* set judge.teacher"):
        load_config(None, ["judge.teacher=none", "algo.w_opd=0", "algo.opd_baseline=teacher"])


def test_drop_zero_drops_exactly_the_zero_scored_turns_without_a_hint(tiny_model, tmp_path, loops, engine):
    """Every score abstains (0); the turns with a hint keep their teacher's signal, the others are dropped with
    their own reason; the teacher's unhinted scores come with each hinted sample, the second time from the cache."""
    from transformers import AutoTokenizer

    from clawr1.chat import ChatRenderer
    from clawr1.engine_api.client import EngineClient
    from clawr1.judge.main import Judge
    from clawr1.pool.store import read_samples

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    prompt = ChatRenderer(tokenizer).encode_messages([{"role": "user", "content": "What is 3 km plus 4 km?"}])
    response = tokenizer.encode("7 km", add_special_tokens=False)
    replies = {"hinted": "No. Please put the answer in <ans> tags.", "hinted-again": "No. Please put the answer in <ans> tags.",
               "moved-on": "Thanks! Next question: What is 1 g plus 2 g?", "re-ask": "Hmm. What is 3 km plus 4 km?",
               "no-next-state": None}
    outcomes = {}
    for drop_zero in (True, False):
        cfg = make_config(tmp_path / str(drop_zero), "judge.score_abstain=1.0", "judge.teacher=frozen",
                          f"judge.teacher_url={engine}", "algo.opd_baseline=teacher", f"judge.drop_zero={drop_zero}")
        pool = loops(cfg, "pool")
        pool.wait_file(cfg.run_dir / "state" / "pool.ready")

        async def go():
            judge = Judge(cfg, tokenizer)
            try:
                done = {}
                for session, reply in replies.items():
                    [(_, reason)] = await judge.handle(record(reply, session, prompt, response))
                    done[session] = reason
                return done, dict(judge.counts), judge.teacher.unhinted_cache_hits
            finally:
                judge.pool.close()
                await judge.teacher.engine.close()

        done, counts, hits = asyncio.run(go())
        outcomes[drop_zero] = done
        samples = {s.session_id: s for s in read_samples(cfg.run_dir / "pool")}
        assert all(s.reward in (0.0, None) for s in samples.values())
        assert hits == 1  # the same response to the same prompt, scored without the hint once
        for session in ("hinted", "hinted-again"):
            s = samples[session]
            assert s.reward == 0.0 and s.teacher_logprobs is not None and len(s.teacher_unhinted_logprobs) == len(response)
            assert s.teacher_unhinted_logprobs != s.teacher_logprobs  # the hint is in one context, not the other
        if drop_zero:
            assert counts["dropped_zero_score"] == 2 and set(samples) == {"hinted", "hinted-again"}

    async def plain_scores() -> list[float]:
        client = EngineClient(engine)
        try:
            return (await client.score(list(prompt) + response, first_scored=len(prompt), temperature=1.0)).prompt_logprobs
        finally:
            await client.close()

    assert samples["hinted"].teacher_unhinted_logprobs == asyncio.run(plain_scores())  # the same engine, same input
    assert outcomes[True] == {"hinted": "sample", "hinted-again": "sample", "moved-on": "zero_score",
                              "re-ask": "zero_score", "no-next-state": "no_signal"}
    assert outcomes[False] == {**outcomes[True], "moved-on": "sample", "re-ask": "sample"}
