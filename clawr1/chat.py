"""The only place a chat template becomes text or ids: ChatML with tools, as token operations,
so history tokens are never re-derived.

Each message renders on its own:

    <|im_start|>{role}\\n{content}<|im_end|>\\n

- a system message carries the tool signatures when the request has tools:
  `{content}\\n\\n<tools>\\n{one JSON object per tool}\\n</tools>` (a system
  message is added when the request has tools but none);
- an assistant message with tool calls appends one block per call:
  `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>` (Qwen/Hermes format);
- a tool result renders as role `tool`: `<tool_response>\\n{content}\\n</tool_response>`.

Because the markers are special tokens (BPE never merges across them), the ids
of a conversation are exactly the concatenation of the ids of its messages.
The gateway relies on that to extend a session's recorded tokens with only the
new messages, and the judge to splice a hint into a recorded prompt.
"""
from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any, Optional, Sequence

MESSAGE_CACHE_SIZE = 1024  # rendered messages whose ids the renderer keeps
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
END_OF_TEXT = "<|endoftext|>"

# The same format as a Jinja template, for tools that render with
# `tokenizer.apply_chat_template` (transformers, SGLang's OpenAI server).
CHATML_JINJA = (
    "{%- set ns = namespace(tools='') -%}"
    "{%- for t in (tools or []) -%}"
    "{%- set ns.tools = ns.tools + ('' if loop.first else '\\n')"
    " + ((t.function if t.function is defined else t) | tojson(separators=(',', ':'))) -%}"
    "{%- endfor -%}"
    "{%- if tools and messages[0].role != 'system' -%}"
    "{{ '<|im_start|>system\\n\\n\\n<tools>\\n' + ns.tools + '\\n</tools><|im_end|>\\n' }}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- set ns.content = message.content if message.content is string else '' -%}"
    "{%- if message.role == 'system' and tools -%}"
    "{%- set ns.content = ns.content + '\\n\\n<tools>\\n' + ns.tools + '\\n</tools>' -%}"
    "{%- elif message.role == 'assistant' and message.tool_calls -%}"
    "{%- for call in message.tool_calls -%}"
    "{%- set f = call.function if call.function is defined else call -%}"
    "{%- set block = '<tool_call>\\n{\"name\": \"' + f.name + '\", \"arguments\": '"
    " + (f.arguments if f.arguments is string else (f.arguments | tojson)) + '}\\n</tool_call>' -%}"
    "{%- set ns.content = (ns.content + '\\n' + block) if ns.content else block -%}"
    "{%- endfor -%}"
    "{%- elif message.role == 'tool' -%}"
    "{%- set ns.content = '<tool_response>\\n' + ns.content + '\\n</tool_response>' -%}"
    "{%- endif -%}"
    "{{ '<|im_start|>' + message.role + '\\n' + ns.content + '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)


def tool_signature(tool: dict) -> str:
    """One tool as the compact JSON line the system message lists."""
    return json.dumps(tool.get("function", tool), separators=(",", ":"), ensure_ascii=False)


def tool_call_block(name: str, arguments: Any) -> str:
    """`arguments` may be a dict or the JSON string OpenAI clients send back."""
    args = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return f'<tool_call>\n{{"name": "{name}", "arguments": {args}}}\n</tool_call>'


def message_content(message: dict, tools: Optional[Sequence[dict]] = None) -> str:
    """The text between `<|im_start|>{role}\\n` and `<|im_end|>` for one message."""
    content = message.get("content") or ""
    role = message["role"]
    if role == "system" and tools:
        content += "\n\n<tools>\n" + "\n".join(tool_signature(t) for t in tools) + "\n</tools>"
    elif role == "assistant" and message.get("tool_calls"):
        for call in message["tool_calls"]:
            f = call.get("function", call)
            block = tool_call_block(f["name"], f.get("arguments", {}))
            content = f"{content}\n{block}" if content else block
    elif role == "tool":
        content = f"<tool_response>\n{content}\n</tool_response>"
    return content


def render_text(messages: Sequence[dict], tools: Optional[Sequence[dict]] = None,
                add_generation_prompt: bool = False) -> str:
    """A conversation as ChatML text (for text-in APIs and tokenizer training; the gateway renders ids)."""
    text = "".join(message_text(m, tools) for m in with_tool_system(messages, tools))
    return text + (f"{IM_START}assistant\n" if add_generation_prompt else "")


def message_text(message: dict, tools: Optional[Sequence[dict]] = None) -> str:
    """One message, markers included."""
    return f"{IM_START}{message['role']}\n{message_content(message, tools)}{IM_END}\n"


def with_tool_system(messages: Sequence[dict], tools: Optional[Sequence[dict]]) -> list[dict]:
    """The messages, with a system message added to carry the tools when there is none."""
    if tools and (not messages or messages[0]["role"] != "system"):
        return [{"role": "system", "content": ""}, *messages]
    return list(messages)


def splice_hint(prompt_ids: list[int], hint_ids: list[int], user_header_ids: list[int], im_end_id: int) -> list[int]:
    """Insert `hint_ids` before the end of the last user message (or of the last message if none)."""
    n = len(user_header_ids)
    starts = [i for i in range(len(prompt_ids) - n + 1) if prompt_ids[i:i + n] == user_header_ids]
    search_from = starts[-1] + n if starts else 0
    ends = [i for i in range(search_from, len(prompt_ids)) if prompt_ids[i] == im_end_id]
    if not ends:
        raise ValueError("the prompt has no closed message to put the hint in")
    at = ends[0] if starts else ends[-1]
    return prompt_ids[:at] + hint_ids + prompt_ids[at:]


class ChatRenderer:
    """Turns OpenAI-style messages into token ids for a ChatML tokenizer."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self._fast = getattr(tokenizer, "backend_tokenizer", None)  # the Rust tokenizer: half the cost per call
        # System prompts and tool lists repeat across sessions: their ids are kept (least recently used go first).
        self._message_ids: OrderedDict[str, tuple[int, ...]] = OrderedDict()
        self.im_start_id = tokenizer.convert_tokens_to_ids(IM_START)
        self.im_end_id = tokenizer.convert_tokens_to_ids(IM_END)
        self.end_of_text_id = tokenizer.convert_tokens_to_ids(END_OF_TEXT)
        self.newline_ids = self.encode_text("\n")
        self.generation_prompt_ids = self.encode_text(f"{IM_START}assistant\n")

    def encode_text(self, text: str) -> list[int]:
        if self._fast is not None:
            return self._fast.encode(text, add_special_tokens=False).ids
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def encode_message_text(self, text: str) -> tuple[int, ...]:
        """Ids of one whole rendered message, remembered for the next request that sends it."""
        ids = self._message_ids.get(text)
        if ids is None:
            ids = self._message_ids[text] = tuple(self.encode_text(text))
            if len(self._message_ids) > MESSAGE_CACHE_SIZE:
                self._message_ids.popitem(last=False)
        else:
            self._message_ids.move_to_end(text)
        return ids

    def message_text(self, message: dict, tools: Optional[Sequence[dict]] = None) -> str:
        return message_text(message, tools)

    def role_header_ids(self, role: str) -> list[int]:
        """Ids that open a message of `role` (the judge finds the last user message by them)."""
        return self.encode_text(f"{IM_START}{role}\n")

    def with_hint(self, prompt_ids: list[int], hint: str) -> list[int]:
        """The prompt with `hint` on a new line at the end of its last user message (the teacher's context)."""
        return splice_hint(prompt_ids, self.encode_text("\n" + hint), self.role_header_ids("user"), self.im_end_id)

    def encode_messages(self, messages: Sequence[dict], add_generation_prompt: bool = True,
                        tools: Optional[Sequence[dict]] = None) -> list[int]:
        ids: list[int] = []
        for m in with_tool_system(messages, tools):
            ids += self.encode_message_text(self.message_text(m, tools))
        if add_generation_prompt:
            ids += self.generation_prompt_ids
        return ids

    def encode_for_training(self, messages: Sequence[dict],
                            tools: Optional[Sequence[dict]] = None) -> tuple[list[int], list[int]]:
        """Ids and a loss mask that is 1 on assistant content and its closing <|im_end|>."""
        ids: list[int] = []
        mask: list[int] = []
        for m in with_tool_system(messages, tools):
            head = self.role_header_ids(m["role"])
            body = self.encode_text(message_content(m, tools)) + [self.im_end_id]
            trained = 1 if m["role"] == "assistant" else 0
            ids += head + body + self.newline_ids
            mask += [0] * len(head) + [trained] * len(body) + [0] * len(self.newline_ids)
        return ids, mask
