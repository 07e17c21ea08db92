"""Output log-probs in OpenAI's shape: `{"content": [{"token", "logprob", "bytes", "top_logprobs"}]}`.

The log-probs are the engine's, for exactly the sampled tokens (at the sampling
temperature). A token's text is its own bytes: byte-level BPE tokens may hold
part of a UTF-8 character, so `bytes` is exact and `token` decodes it with
replacement, as OpenAI does.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any, Optional

from clawr1.engine_api.client import Generation


def _byte_level_alphabet() -> dict[str, int]:
    """The printable character byte-level BPE stands each byte for, mapped back to the byte."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


class TokenText:
    """A token id's exact bytes and text, for a byte-level BPE tokenizer (else its decoded text)."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.alphabet = _byte_level_alphabet()
        self.bytes = lru_cache(maxsize=65536)(self._bytes)

    def _bytes(self, token_id: int) -> bytes:
        piece = self.tokenizer.convert_ids_to_tokens(token_id)
        if piece is not None and all(ch in self.alphabet for ch in piece):
            return bytes(self.alphabet[ch] for ch in piece)
        return self.tokenizer.decode([token_id]).encode()

    def entry(self, token_id: int, logprob: float) -> dict:
        raw = self.bytes(token_id)
        return {"token": raw.decode("utf-8", errors="replace"), "logprob": logprob, "bytes": list(raw)}


def openai_logprobs(gen: Generation, start: int, end: Optional[int], text: TokenText, top_n: int,
                    skip_ids: set[int]) -> dict:
    """The `logprobs` of one choice for output tokens start..end; tokens in `skip_ids` (the stop token) left out."""
    content = []
    for i in range(start, len(gen.output_ids) if end is None else end):
        token = gen.output_ids[i]
        if token in skip_ids:
            continue
        item = text.entry(token, gen.logprobs[i])
        tops = zip(gen.top_ids[i], gen.top_logprobs[i]) if top_n and i < len(gen.top_ids) else ()
        item["top_logprobs"] = [text.entry(t, lp) for t, lp in list(tops)[:top_n]]
        content.append(item)
    return {"content": content}
