"""What the gateway answers when a request cannot be served: an OpenAI-shaped error with its HTTP status, and the
prompt limits every endpoint that renders a prompt checks."""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Optional

from clawr1.engine_api.client import EngineError
from clawr1.gateway.router import NoEngineError


class GatewayError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", code: Optional[str] = None):
        super().__init__(message)
        self.status, self.message, self.type, self.code = status, message, type_, code


@contextmanager
def engine_errors() -> Iterator[None]:
    """Engine calls inside it fail as the client's error: 503 when no engine is reachable; an engine's 4xx
    (e.g. longer than its context) as the client's 400; any other engine failure as 502."""
    try:
        yield
    except NoEngineError as e:
        raise GatewayError(503, str(e), "engine_unavailable") from None
    except EngineError as e:
        if 400 <= e.status < 500:
            raise GatewayError(400, f"the engine refused the request: {e}", code="engine_rejected") from None
        raise GatewayError(502, f"the engine failed: {e}", "engine_error") from None


@dataclass
class PromptLimits:
    """How many tokens a prompt may hold: gateway.max_prompt_tokens, and below the engine's context length
    (max_context: 0 while unknown; `clawr1 gateway` works it out from the config)."""

    max_prompt_tokens: int
    max_context: int = 0

    def check(self, prompt: list[int]) -> list[int]:
        """The prompt, or the client's 400 naming the limit it passes."""
        if len(prompt) > self.max_prompt_tokens:
            raise GatewayError(400, f"the conversation is {len(prompt)} tokens; the limit is {self.max_prompt_tokens}",
                               code="context_length_exceeded")
        if self.max_context and len(prompt) >= self.max_context:
            raise GatewayError(400, f"the conversation is {len(prompt)} tokens; the engine's context is "
                                    f"{self.max_context} (serve.context_length)", code="context_length_exceeded")
        return prompt

    def fits(self, prompt: list[int], response: list[int]) -> bool:
        """Whether a logged turn (prompt and reply together) is within both limits."""
        return len(prompt) <= self.max_prompt_tokens and not (
            self.max_context and len(prompt) + len(response) > self.max_context)
