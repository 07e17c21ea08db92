"""ChatML, the tiny model's chat template, and its Python twin that renders the build's training corpus.

The template (`CHATML_JINJA`) ships in the tiny model's tokenizer_config.json; every loop renders with it
through `clawr1.chat.ChatRenderer`, like any other model's template. The Python functions below render the
same text and exist for the build alone: the warm start trains on them, and the model's checksum depends on
them, so they stay byte-for-byte as they are.

Each message renders on its own:

    <|im_start|>{role}\\n{content}<|im_end|>\\n

- a system message carries the tool signatures when the request has tools:
  `{content}\\n\\n<tools>\\n{one JSON object per tool}\\n</tools>` (a system
  message is added when the request has tools but none);
- an assistant message with tool calls appends one block per call:
  `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>` (Qwen/Hermes format);
- a tool result renders as role `tool`: `<tool_response>\\n{content}\\n</tool_response>`.
"""
from __future__ import annotations

import json
from typing import Any, Optional, Sequence

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


def encode_for_training(tokenizer: Any, messages: Sequence[dict],
                        tools: Optional[Sequence[dict]] = None) -> tuple[list[int], list[int]]:
    """Ids and a loss mask that is 1 on assistant content and its closing <|im_end|>."""
    fast = getattr(tokenizer, "backend_tokenizer", None)

    def encode(text: str) -> list[int]:
        if fast is not None:
            return fast.encode(text, add_special_tokens=False).ids
        return list(tokenizer.encode(text, add_special_tokens=False))

    im_end_id = tokenizer.convert_tokens_to_ids(IM_END)
    newline_ids = encode("\n")
    ids: list[int] = []
    mask: list[int] = []
    for m in with_tool_system(messages, tools):
        head = encode(f"{IM_START}{m['role']}\n")
        body = encode(message_content(m, tools)) + [im_end_id]
        trained = 1 if m["role"] == "assistant" else 0
        ids += head + body + newline_ids
        mask += [0] * len(head) + [trained] * len(body) + [0] * len(newline_ids)
    return ids, mask
