"""The gateway's error answers: engine failures become the client's status, prompt limits name themselves."""
from __future__ import annotations

import pytest

from clawr1.engine_api.client import EngineError
from clawr1.gateway.errors import GatewayError, PromptLimits, engine_errors
from clawr1.gateway.router import NoEngineError


@pytest.mark.parametrize("failure, status, type_", [
    (NoEngineError("every engine failed"), 503, "engine_unavailable"),
    (EngineError("too long", status=400), 400, "invalid_request_error"),
    (EngineError("no such adapter", status=404), 400, "invalid_request_error"),
    (EngineError("crashed", status=500), 502, "engine_error"),
    (EngineError("no answer"), 502, "engine_error"),
])
def test_an_engine_failure_becomes_the_clients_error(failure, status, type_):
    with pytest.raises(GatewayError) as answer:
        with engine_errors():
            raise failure
    assert (answer.value.status, answer.value.type) == (status, type_)
    assert str(failure) in answer.value.message


def test_other_failures_pass_through_engine_errors():
    with pytest.raises(KeyError):
        with engine_errors():
            raise KeyError("a bug, not an engine failure")


def test_prompt_limits_refuse_past_either_limit_and_fit_logged_turns():
    limits = PromptLimits(max_prompt_tokens=8, max_context=10)
    assert limits.check([1] * 8) == [1] * 8
    with pytest.raises(GatewayError, match="the limit is 8"):
        limits.check([1] * 9)
    with pytest.raises(GatewayError, match="serve.context_length"):
        PromptLimits(max_prompt_tokens=20, max_context=10).check([1] * 10)
    assert limits.fits([1] * 8, [2] * 2) and not limits.fits([1] * 8, [2] * 3)
