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
