import random

import pytest

from clawr1.config import ConfigError, load_config
from clawr1.judge.noise import noisy_score


class Fixed(random.Random):
    """A 'random' source that returns the given draws, for hand-built cases."""

    def __init__(self, draws):
        super().__init__(0)
        self.draws = list(draws)

    def random(self):
        return self.draws.pop(0)


def test_hand_built_draws():
    # abstain 0.1, noise 0.3: [0, 0.1) abstains, [0.1, 0.4) flips, [0.4, 1) keeps
    assert noisy_score(1.0, 0.3, 0.1, Fixed([0.05])) == 0.0
    assert noisy_score(1.0, 0.3, 0.1, Fixed([0.1])) == -1.0
    assert noisy_score(-1.0, 0.3, 0.1, Fixed([0.39])) == 1.0
    assert noisy_score(-1.0, 0.3, 0.1, Fixed([0.4])) == -1.0
    assert noisy_score(None, 0.3, 0.1, Fixed([])) is None  # no score, no draw
    assert noisy_score(1.0, 0.0, 0.0, Fixed([0.0])) == 1.0


def test_rates_over_many_draws():
    rng = random.Random(3)
    out = [noisy_score(1.0, 0.3, 0.0, rng) for _ in range(20_000)]
    assert abs(out.count(-1.0) / len(out) - 0.3) < 0.015 and set(out) == {1.0, -1.0}


def test_config_bounds():
    assert load_config(None, ["judge.score_noise=0.3"]).judge.score_noise == 0.3
    with pytest.raises(ConfigError, match="judge.score_noise"):
        load_config(None, ["judge.score_noise=1.5"])
    with pytest.raises(ConfigError, match="must be at most 1"):
        load_config(None, ["judge.score_noise=0.7", "judge.score_abstain=0.5"])


def test_hint_noise_drops_and_swaps_at_its_rates():
    from clawr1.judge.noise import HintNoise

    hints = HintNoise(noise=0.3, drop=0.1, rng=Fixed([0.05, 0.2, 0.5, 0.2, 0.0]))
    # drop 0.1, noise 0.3: [0, 0.1) drops, [0.1, 0.4) swaps for another recent hint, [0.4, 1) keeps
    assert hints.apply("Use tags.") == ("", "dropped")
    assert hints.apply("Use tags.") == ("Use tags.", "no_wrong_one")  # nothing else seen yet: counted, not guessed
    assert hints.apply("Spell the units.") == ("Spell the units.", "kept")
    hints.rng = random.Random(0)
    hints.rng.random = lambda: 0.2
    assert hints.apply("Use tags.") == ("Spell the units.", "wrong")  # the only other hint it has seen
    many = HintNoise(noise=0.3, drop=0.1, rng=random.Random(5))
    outcomes = [many.apply(f"hint {i % 7}")[1] for i in range(20_000)]
    assert abs(outcomes.count("dropped") / len(outcomes) - 0.1) < 0.01
    assert abs(outcomes.count("wrong") / len(outcomes) - 0.3) < 0.015
    assert HintNoise(0.0, 0.0, random.Random(1)).apply("x") == ("x", "kept")
    with pytest.raises(ConfigError, match="hint_noise \\+ judge.hint_drop must be at most 1"):
        load_config(None, ["judge.hint_noise=0.6", "judge.hint_drop=0.5"])


def test_the_judge_reports_noisy_hints_to_the_pool(tiny_model, tmp_path, loops):
    import asyncio

    from transformers import AutoTokenizer

    from clawr1.judge.main import Judge
    from clawr1.pool.store import read_samples
    from clawr1.protocol import NextState, TurnRecord
    from tests.conftest import make_config

    cfg = make_config(tmp_path, "judge.teacher=none", "algo.w_opd=0", "judge.hint_noise=1.0")
    pool = loops(cfg, "pool")
    pool.wait_file(cfg.run_dir / "state" / "pool.ready")

    def corrected(session: str, text: str) -> TurnRecord:
        return TurnRecord(session_id=session, turn_index=0, prompt_ids=[1, 2], response_ids=[3, 4],
                          rollout_logprobs=[-1.0, -2.0], versions=[0, 0], messages=[{"role": "user", "content": "q"}],
                          response_text="a", next_state=NextState(kind="user", text=f"No. {text}"))

    async def go():
        judge = Judge(cfg, AutoTokenizer.from_pretrained(tiny_model))
        try:
            for session, text in (("a", "Please use tags."), ("b", "Please spell the units out."),
                                  ("c", "Not quite what I wanted.")):  # a vague complaint: a score, no hint
                assert await judge.handle(corrected(session, text)) == [(f"{session}/0/0", "sample")]
            return dict(judge.counts)
        finally:
            judge.pool.close()

    counts = asyncio.run(go())
    assert (counts["hints_no_wrong_one"], counts["hints_wrong"], counts["negative_without_hint"]) == (1, 1, 1)
    hints = {s.session_id: s.hint for s in read_samples(cfg.run_dir / "pool")}
    assert hints == {"a": "Please use tags.", "b": "Please use tags.", "c": ""}  # b's swapped for the other one seen
