"""ChatML rendering, done with token operations so history tokens are never re-derived.

Each message renders on its own to `<|im_start|>{role}\\n{content}<|im_end|>\\n`.
Because the markers are special tokens (BPE never merges across them), the ids
of a conversation are exactly the concatenation of the ids of its messages.
The gateway relies on that to extend a session's recorded tokens with only the
new messages, and the judge to splice a hint into a recorded prompt.
"""
from __future__ import annotations

from typing import Any, Sequence

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
END_OF_TEXT = "<|endoftext|>"

# The same format as a Jinja template, for tools that render with
# `tokenizer.apply_chat_template` (transformers, SGLang's OpenAI server).
CHATML_JINJA = (
    "{%- for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)


class ChatRenderer:
    """Turns OpenAI-style messages into token ids for a ChatML tokenizer."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.im_start_id = tokenizer.convert_tokens_to_ids(IM_START)
        self.im_end_id = tokenizer.convert_tokens_to_ids(IM_END)
        self.newline_ids = self.encode_text("\n")
        self.generation_prompt_ids = self.encode_text(f"{IM_START}assistant\n")

    def encode_text(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def message_text(self, message: dict) -> str:
        return f"{IM_START}{message['role']}\n{message.get('content') or ''}{IM_END}\n"

    def encode_messages(self, messages: Sequence[dict], add_generation_prompt: bool = True) -> list[int]:
        ids: list[int] = []
        for m in messages:
            ids += self.encode_text(self.message_text(m))
        if add_generation_prompt:
            ids += self.generation_prompt_ids
        return ids

    def encode_for_training(self, messages: Sequence[dict]) -> tuple[list[int], list[int]]:
        """Ids and a loss mask that is 1 on assistant content and its closing <|im_end|>."""
        ids: list[int] = []
        mask: list[int] = []
        for m in messages:
            head = self.encode_text(f"{IM_START}{m['role']}\n")
            body = self.encode_text(m.get("content") or "") + [self.im_end_id]
            trained = 1 if m["role"] == "assistant" else 0
            ids += head + body + self.newline_ids
            mask += [0] * len(head) + [trained] * len(body) + [0] * len(self.newline_ids)
        return ids, mask
