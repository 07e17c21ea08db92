"""Reading structure out of model text: reasoning blocks and tool calls, in each family's format.

Reasoning (thinking models, e.g. Qwen3): `<think>reasoning</think>answer`, or only `</think>` when the
prompt opened the block.

Tool calls, by `model.tool_call_format` (as SGLang's `--tool-call-parser`):
- `hermes` (Qwen2.5, Qwen3): one block per call, anywhere in the text, any number of them:

      <tool_call>
      {"name": "calculator", "arguments": {"expression": "3 + 4"}}
      </tool_call>

- `llama3_json` (Llama 3.x): the whole reply is the call, optionally after `<|python_tag|>`; parallel
  calls are separated by `;`:

      {"name": "calculator", "parameters": {"expression": "3 + 4"}}

A call that does not parse stays in the content, and is counted (`ParsedOutput.malformed`).

`parse_output` splits a finished reply. `StreamSplitter` does the same as text arrives: reasoning and
content deltas as soon as they are certain (text that could start a tag is held back), and each tool call
as soon as it is complete.
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Optional

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"
TOOL_CALL_FORMATS = ("hermes", "llama3_json")


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
    malformed: int = 0  # tool calls that did not parse (left in the content)


def default_tool_call_format(model_type: str, chat_template: str = "") -> str:
    """The format the chat template teaches: Hermes when it writes <tool_call> blocks, Llama 3's JSON when it
    is Llama 3's (header ids, python tag); else by family (a Llama-architecture model with a ChatML template,
    such as SmolLM2, writes Hermes blocks)."""
    template = chat_template or ""
    if HERMES_OPEN in template:
        return "hermes"
    if "<|start_header_id|>" in template or PYTHON_TAG in template:
        return "llama3_json"
    return "llama3_json" if model_type == "llama" and not template else "hermes"


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


def call_from(data: Any) -> Optional[ToolCall]:
    """A decoded call object (a name, and object arguments or parameters), or None if it is not one."""
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return None
    args = data.get("arguments", data.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    return ToolCall(data["name"], args) if isinstance(args, dict) else None


def parse_call(body: str) -> Optional[ToolCall]:
    """One tool-call body (JSON), or None if it is not one."""
    try:
        return call_from(json.loads(body))
    except json.JSONDecodeError:
        return None


class HermesCalls:
    """`<tool_call>{json}</tool_call>` blocks, anywhere in the reply."""

    name = "hermes"
    open_tag, close_tag = HERMES_OPEN, HERMES_CLOSE
    _block = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)

    def parse(self, text: str) -> tuple[str, list[ToolCall], int]:
        """(content without the well-formed blocks, the calls, how many blocks were malformed)."""
        calls: list[ToolCall] = []
        malformed = 0

        def take(match: re.Match) -> str:
            nonlocal malformed
            call = parse_call(match.group(1))
            if call is None:
                malformed += 1
                return match.group(0)
            calls.append(call)
            return ""

        content = self._block.sub(take, text)
        malformed += content.count(HERMES_OPEN) - content.count(HERMES_CLOSE) if HERMES_OPEN in content else 0
        return (content.strip() if calls else content), calls, max(malformed, 0)


class Llama3JsonCalls:
    """The whole reply is one or more JSON calls (`;`-separated), optionally after `<|python_tag|>`."""

    name = "llama3_json"

    @staticmethod
    def looks_like_call(text: str) -> Optional[bool]:
        """True/False once the reply's start tells; None while it could still be either."""
        start = text.lstrip()
        if not start:
            return None
        if start.startswith(("{", PYTHON_TAG)):
            return True
        return None if PYTHON_TAG.startswith(start) else False

    def parse(self, text: str) -> tuple[str, list[ToolCall], int]:
        if not self.looks_like_call(text):
            return text, [], 0
        body = text.lstrip()
        body = body[len(PYTHON_TAG):] if body.startswith(PYTHON_TAG) else body
        calls: list[ToolCall] = []
        decoder, at = json.JSONDecoder(), 0
        while True:
            while at < len(body) and (body[at].isspace() or body[at] == ";"):
                at += 1
            if at == len(body):
                break
            try:
                data, at = decoder.raw_decode(body, at)
            except json.JSONDecodeError:
                return text, [], 1
            call = call_from(data)
            if call is None:
                return text, [], 1
            calls.append(call)
        return ("", calls, 0) if calls else (text, [], 1)


def tool_call_parser(fmt: str):
    if fmt == "hermes":
        return HermesCalls()
    if fmt == "llama3_json":
        return Llama3JsonCalls()
    raise ValueError(f"unknown tool-call format {fmt!r}; known: {', '.join(TOOL_CALL_FORMATS)}")


def parse_output(text: str, parse_tools: bool = True, fmt: str = "hermes", reasoning: bool = True) -> ParsedOutput:
    thought, rest = split_reasoning(text) if reasoning else ("", text)
    if not parse_tools:
        return ParsedOutput(rest, thought)
    content, calls, malformed = tool_call_parser(fmt).parse(rest)
    return ParsedOutput(content, thought, calls, malformed)


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
    """Incremental `parse_output`: feed the growing text, get the new reasoning and content deltas; complete
    tool calls collect in `calls` as they close."""

    def __init__(self, parse_tools: bool = True, fmt: str = "hermes", reasoning: bool = True):
        self.parse_tools = parse_tools
        self.parser = tool_call_parser(fmt)
        self.state = "start" if reasoning else "content"  # start | think | content | call | whole
        self.buffer = ""  # text received but not yet classified
        self.call_text = ""  # the open tool-call block so far (or, for whole-reply formats, the reply)
        self.calls: list[ToolCall] = []
        self.content_seen = False  # whether any content went out (a whole-reply call must be the whole reply)
        self.reasoning_sent = False  # whether any reasoning went out
        self.after_reasoning = False  # right after </think>: whitespace before the answer is dropped
        self.space = ""  # whitespace held back at the end of the content so far

    def feed(self, delta: str) -> tuple[str, str]:
        """Returns (reasoning delta, content delta) that are certain given the text so far."""
        self.buffer += delta
        reasoning, content = [], []
        while self._step(reasoning, content):
            pass
        if "".join(content).strip():
            self.content_seen = True
        return "".join(reasoning), "".join(content)

    def finish(self) -> tuple[str, str]:
        """Flush at the end: held-back text is content; an unclosed or malformed call stays text."""
        reasoning, content = self.feed("")
        if self.state == "whole":
            text, calls, _ = self.parser.parse(self.call_text + self.buffer)
            self.calls += calls
            self.buffer = self.call_text = ""
            return reasoning, content + text
        rest = self.buffer + (self.call_text if self.state == "call" else "")
        self.buffer = self.call_text = ""
        if self.state == "think":
            return reasoning + (rest.rstrip() if self.reasoning_sent else rest.strip()), content
        rest, self.space = self.space + rest, ""
        return reasoning, content + (rest.rstrip() if self.calls else rest)

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
            return self._step_think(reasoning)
        if self.state == "whole":  # the reply is a call: it is parsed once complete
            self.call_text += self.buffer
            self.buffer = ""
            return False
        if self.state == "call":
            return self._step_block(content)
        return self._step_content(content)

    def _step_think(self, reasoning: list[str]) -> bool:
        """Reasoning goes out as it comes, without the whitespace around it (as `split_reasoning` strips it)."""
        if THINK_CLOSE in self.buffer:
            before, self.buffer = self.buffer.split(THINK_CLOSE, 1)
            reasoning.append(before.rstrip() if self.reasoning_sent else before.strip())
            self.state, self.after_reasoning = "content", True
            return True
        keep = _held_suffix(self.buffer, (THINK_CLOSE,))
        ready, held = self.buffer[: len(self.buffer) - keep], self.buffer[len(self.buffer) - keep:]
        if not self.reasoning_sent:
            ready = ready.lstrip()
        out = ready.rstrip()  # trailing whitespace may be the block's end: it waits for what follows
        if out:
            self.reasoning_sent = True
            reasoning.append(out)
        self.buffer = ready[len(out):] + held
        return False

    def _step_content(self, content: list[str]) -> bool:
        if self.after_reasoning:  # the answer starts at its first non-space character
            self.buffer = self.buffer.lstrip()
            if not self.buffer:
                return False
            self.after_reasoning = False
        if not self.parse_tools:
            content.append(self.buffer)
            self.buffer = ""
            return False
        if isinstance(self.parser, Llama3JsonCalls) and not self.content_seen and not content:
            looks = self.parser.looks_like_call(self.buffer)
            if looks is None:
                return False  # too early to tell
            if looks:
                self.state = "whole"
                return True
        if not isinstance(self.parser, HermesCalls):
            content.append(self.buffer)
            self.buffer = ""
            return False
        if HERMES_OPEN in self.buffer:
            before, after = self.buffer.split(HERMES_OPEN, 1)
            self._emit(content, before)
            self.buffer, self.call_text, self.state = after, HERMES_OPEN, "call"
            return True
        keep = _held_suffix(self.buffer, (HERMES_OPEN,))
        self._emit(content, self.buffer[: len(self.buffer) - keep])
        self.buffer = self.buffer[len(self.buffer) - keep:]
        return False

    def _emit(self, content: list[str], text: str) -> None:
        """Hermes content: trailing whitespace waits for text after it, since a reply with calls ends without
        it (as `parse` strips it)."""
        body = text.rstrip()
        if body:
            content.append(self.space + body)
            self.space = text[len(body):]
        else:
            self.space += text

    def _step_block(self, content: list[str]) -> bool:
        self.call_text += self.buffer
        self.buffer = ""
        if HERMES_CLOSE not in self.call_text:
            return False
        block, after = self.call_text.split(HERMES_CLOSE, 1)
        call = parse_call(block[len(HERMES_OPEN):].strip())
        if call is None:
            self._emit(content, block + HERMES_CLOSE)  # not a call after all: it was text
        else:
            self.calls.append(call)
        self.call_text, self.buffer, self.state = "", after, "content"
        return True
