"""Request and response shapes of the OpenAI Chat Completions API (the subset we serve), plus our endpoints."""
from __future__ import annotations

import secrets
import time
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator

NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str = Field(min_length=1, max_length=64)
    arguments: Union[str, dict[str, Any]] = "{}"


class ToolCallIn(BaseModel):
    model_config = ConfigDict(extra="ignore")
    id: Optional[str] = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Optional[Union[str, list[dict[str, Any]]]] = None
    name: Optional[str] = None
    tool_calls: Optional[list[ToolCallIn]] = None
    tool_call_id: Optional[str] = None
    reasoning_content: Optional[str] = None  # a thinking model's reasoning, when a client sends it back

    @field_validator("content")
    @classmethod
    def _text_only(cls, v):
        """The policy reads text: an image (or any other non-text part) is refused, never silently dropped."""
        for part in v if isinstance(v, list) else []:
            kind = part.get("type", "text")
            if kind != "text":
                raise ValueError(f"content part of type {kind!r} is not supported: this policy reads text only")
        return v

    def text(self) -> str:
        """Content as text; list content keeps its text parts."""
        if isinstance(self.content, list):
            return "".join(str(p.get("text", "")) for p in self.content if p.get("type", "text") == "text")
        return self.content or ""

    def as_dict(self) -> dict:
        """The plain message the renderer and the session store work with."""
        role = "system" if self.role == "developer" else self.role
        out: dict[str, Any] = {"role": role, "content": self.text()}
        if self.tool_calls:
            out["tool_calls"] = [{"id": c.id, "type": "function",
                                  "function": {"name": c.function.name, "arguments": c.function.arguments}}
                                 for c in self.tool_calls]
        if self.tool_call_id:
            out["tool_call_id"] = self.tool_call_id
        if self.reasoning_content is not None:
            out["reasoning_content"] = self.reasoning_content
        return out


class FunctionSpec(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str = Field(pattern=NAME_PATTERN)
    description: Optional[str] = None
    parameters: Optional[dict[str, Any]] = None

    @field_validator("parameters")
    @classmethod
    def _object_schema(cls, v: Optional[dict]) -> Optional[dict]:
        if v is not None and v.get("type", "object") != "object":
            raise ValueError("a function's parameters must be a JSON schema of type object")
        return v


class Tool(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["function"]
    function: FunctionSpec


def tool_dicts(tools: Optional[list[Tool]]) -> Optional[list[dict]]:
    """A request's tools as the chat template takes them, or None."""
    return [t.model_dump(exclude_none=True) for t in tools] if tools else None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


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
    seed: Optional[int] = Field(default=None, ge=-(2**63), le=2**63 - 17)  # + choice index stays in int64
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    logprobs: bool = False  # each output token's log-prob (as sampled), in OpenAI's shape
    top_logprobs: Optional[int] = Field(default=None, ge=0, le=20)  # with logprobs: the k most likely at each position
    user: Optional[str] = None
    tools: Optional[list[Tool]] = None
    tool_choice: Optional[Union[Literal["none", "auto", "required"], dict[str, Any]]] = None
    # passed to the model's chat template, as SGLang and vLLM take it (e.g. {"enable_thinking": false})
    chat_template_kwargs: Optional[dict[str, Any]] = None

    @field_validator("stop")
    @classmethod
    def _few_stops(cls, v):
        if isinstance(v, list) and len(v) > 4:
            raise ValueError("at most 4 stop sequences")
        return v

    def tool_dicts(self) -> Optional[list[dict]]:
        """The tools to render, or None (also when tool_choice is "none")."""
        return None if self.tool_choice == "none" else tool_dicts(self.tools)


class TurnFeedback(BaseModel):
    """Feedback on one assistant turn of an ingested conversation (`turn`: its index among assistant turns)."""

    model_config = ConfigDict(extra="forbid")
    turn: int = Field(ge=0)
    score: Optional[float] = None
    text: str = ""


class IngestRequest(BaseModel):
    """One pre-collected conversation in OpenAI chat format (a line of `clawr1 ingest`'s input)."""

    model_config = ConfigDict(extra="ignore")
    messages: list[ChatMessage] = Field(min_length=1, max_length=2000)
    tools: Optional[list[Tool]] = None
    session_id: Optional[str] = Field(default=None, max_length=256)
    feedback: list[TurnFeedback] = Field(default_factory=list)
    reward: Optional[float] = None  # the conversation's outcome: the next state of its last assistant turn


class ScoreRequest(BaseModel):
    """Log-probs of a response under the current policy, optionally with a hint in context (the teacher's view)."""

    model_config = ConfigDict(extra="ignore")
    messages: list[ChatMessage] = Field(min_length=1, max_length=2000)
    response: str = Field(max_length=100_000)
    hint: str = Field(default="", max_length=4000)
    tools: Optional[list[Tool]] = None
    temperature: float = Field(default=1.0, ge=0.01, le=2)
    chat_template_kwargs: Optional[dict[str, Any]] = None


class FeedbackRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    session_id: str = Field(min_length=1)
    turn_index: Optional[int] = Field(default=None, ge=0)  # default: the session's latest turn
    score: Optional[float] = None
    text: str = ""


class CompleteRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    reward: Optional[float] = None
    text: str = ""
    done: bool = True


def error_body(message: str, type_: str = "invalid_request_error", param: Optional[str] = None,
               code: Optional[str] = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def completion_id() -> str:
    return f"chatcmpl-{secrets.token_hex(12)}"


def chat_completion(cid: str, model: str, choices: list[dict], prompt_tokens: int, completion_tokens: int,
                    fingerprint: Optional[str] = None) -> dict:
    return {
        "id": cid, "object": "chat.completion", "created": int(time.time()), "model": model, "choices": choices,
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
        "system_fingerprint": fingerprint,
    }


def chunk(cid: str, model: str, choices: list[dict], usage: Optional[dict] = None,
          fingerprint: Optional[str] = None) -> dict:
    out = {"id": cid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model, "choices": choices}
    if fingerprint is not None:
        out["system_fingerprint"] = fingerprint
    if usage is not None:
        out["usage"] = usage
    return out
