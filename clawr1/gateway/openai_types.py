"""Request and response shapes of the OpenAI Chat Completions API (the subset we serve)."""
from __future__ import annotations

import time
import uuid
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Optional[Union[str, list[dict[str, Any]]]] = None
    name: Optional[str] = None
    tool_calls: Optional[list[dict[str, Any]]] = None
    tool_call_id: Optional[str] = None

    def text(self) -> str:
        """Content as text; list content keeps its text parts."""
        if isinstance(self.content, list):
            return "".join(str(p.get("text", "")) for p in self.content if p.get("type", "text") == "text")
        return self.content or ""


class ChatCompletionRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    messages: list[ChatMessage] = Field(min_length=1)
    model: str = ""
    max_tokens: Optional[int] = Field(default=None, ge=1)
    max_completion_tokens: Optional[int] = Field(default=None, ge=1)
    temperature: Optional[float] = Field(default=None, ge=0, le=2)
    top_p: Optional[float] = Field(default=None, gt=0, le=1)
    n: int = Field(default=1, ge=1, le=16)
    stop: Optional[Union[str, list[str]]] = None
    seed: Optional[int] = None
    stream: bool = False
    user: Optional[str] = None
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Optional[Union[str, dict[str, Any]]] = None


def error_body(message: str, type_: str = "invalid_request_error", param: Optional[str] = None,
               code: Optional[str] = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex[:24]}"


def chat_completion(model: str, choices: list[dict], prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "id": completion_id(), "object": "chat.completion", "created": int(time.time()), "model": model,
        "choices": choices,
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
    }


def finish_reason(engine_reason: str) -> str:
    return {"stop": "stop", "length": "length"}.get(engine_reason, "stop")
