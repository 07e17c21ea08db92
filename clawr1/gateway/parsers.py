"""Reading structure out of model text: reasoning blocks and Qwen/Hermes tool calls.

    <think>reasoning</think>answer text<tool_call>
    {"name": "calculator", "arguments": {"expression": "3 + 4"}}
    </tool_call>

`parse_output` splits a finished response into reasoning, content and tool
calls. `StreamSplitter` does the same incrementally for streaming: it emits
reasoning and content deltas as soon as they are certain, holds back text that
could be the start of a tag, and keeps tool-call blocks until they close.
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Optional

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
_CALL_RE = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any]
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")

    def openai(self, index: Optional[int] = None) -> dict:
        out = {"id": self.id, "type": "function",
               "function": {"name": self.name, "arguments": json.dumps(self.arguments, ensure_ascii=False)}}
        if index is not None:
            out["index"] = index
        return out


@dataclass
class ParsedOutput:
    content: str
    reasoning: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)


def split_reasoning(text: str) -> tuple[str, str]:
    """(reasoning, rest). Handles a `<think>` opened in the prompt (only `</think>` in the output)."""
    stripped = text.lstrip()
    if stripped.startswith(THINK_OPEN):
        body = stripped[len(THINK_OPEN):]
        if THINK_CLOSE not in body:  # cut off while thinking
            return body.strip(), ""
        reasoning, rest = body.split(THINK_CLOSE, 1)
        return reasoning.strip(), rest.lstrip()
    if THINK_CLOSE in text and THINK_OPEN not in text:
        reasoning, rest = text.split(THINK_CLOSE, 1)
        return reasoning.strip(), rest.lstrip()
    return "", text


def parse_call(body: str) -> Optional[ToolCall]:
    """One tool-call body (JSON with a name and object arguments), or None if it is not one."""
    try:
        data = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return None
    args = data.get("arguments", data.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    return ToolCall(data["name"], args) if isinstance(args, dict) else None


def parse_tool_calls(text: str) -> tuple[str, list[ToolCall]]:
    """(content without the well-formed call blocks, the calls). Malformed blocks stay in the content."""
    calls: list[ToolCall] = []

    def take(match: re.Match) -> str:
        call = parse_call(match.group(1))
        if call is None:
            return match.group(0)
        calls.append(call)
        return ""

    content = _CALL_RE.sub(take, text)
    return (content.strip() if calls else content), calls


def parse_output(text: str, parse_tools: bool = True) -> ParsedOutput:
    reasoning, rest = split_reasoning(text)
    if not parse_tools:
        return ParsedOutput(rest, reasoning)
    content, calls = parse_tool_calls(rest)
    return ParsedOutput(content, reasoning, calls)


def _held_suffix(text: str, tags: tuple[str, ...]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of one of `tags`."""
    best = 0
    for tag in tags:
        for n in range(min(len(tag) - 1, len(text)), 0, -1):
            if text.endswith(tag[:n]):
                best = max(best, n)
                break
    return best


class StreamSplitter:
    """Incremental `parse_output`: feed the growing text, get the new reasoning and content deltas."""

    def __init__(self, parse_tools: bool = True):
        self.parse_tools = parse_tools
        self.state = "start"  # start | think | content | call
        self.buffer = ""  # text received but not yet classified
        self.call_text = ""  # the open tool-call block so far
        self.calls: list[ToolCall] = []

    def feed(self, delta: str) -> tuple[str, str]:
        """Returns (reasoning delta, content delta) that are certain given the text so far."""
        self.buffer += delta
        reasoning, content = [], []
        while True:
            progressed = self._step(reasoning, content)
            if not progressed:
                break
        return "".join(reasoning), "".join(content)

    def finish(self) -> tuple[str, str]:
        """Flush at the end: held-back text is content; an unclosed call block stays text."""
        reasoning, content = self.feed("")
        rest = self.buffer + (self.call_text if self.state == "call" else "")
        self.buffer = self.call_text = ""
        if self.state == "think":
            return reasoning + rest, content
        return reasoning, content + rest

    def _step(self, reasoning: list[str], content: list[str]) -> bool:
        if self.state == "start":
            stripped = self.buffer.lstrip()
            if stripped.startswith(THINK_OPEN):
                self.buffer, self.state = stripped[len(THINK_OPEN):].lstrip(), "think"
                return True
            if THINK_OPEN.startswith(stripped) and stripped:
                return False  # might still become <think>
            self.state = "content"
            return True
        if self.state == "think":
            if THINK_CLOSE in self.buffer:
                before, self.buffer = self.buffer.split(THINK_CLOSE, 1)
                reasoning.append(before)
                self.buffer, self.state = self.buffer.lstrip(), "content"
                return True
            keep = _held_suffix(self.buffer, (THINK_CLOSE,))
            reasoning.append(self.buffer[: len(self.buffer) - keep])
            self.buffer = self.buffer[len(self.buffer) - keep:]
            return False
        if self.state == "call":
            self.call_text += self.buffer
            self.buffer = ""
            if CALL_CLOSE in self.call_text:
                block, after = self.call_text.split(CALL_CLOSE, 1)
                call = parse_call(block[len(CALL_OPEN):].strip())
                if call is None:
                    content.append(block + CALL_CLOSE)  # not a call after all: it was text
                else:
                    self.calls.append(call)
                self.call_text, self.buffer, self.state = "", after, "content"
                return True
            return False
        # content
        if self.parse_tools and CALL_OPEN in self.buffer:
            before, after = self.buffer.split(CALL_OPEN, 1)
            content.append(before)
            self.buffer, self.call_text, self.state = after, CALL_OPEN, "call"
            return True
        keep = _held_suffix(self.buffer, (CALL_OPEN,)) if self.parse_tools else 0
        content.append(self.buffer[: len(self.buffer) - keep])
        self.buffer = self.buffer[len(self.buffer) - keep:]
        return False
