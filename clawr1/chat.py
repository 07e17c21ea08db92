"""The only place a chat template becomes text or ids: the model's own template, as transformers renders it.

The template is the one that ships with the model (`chat_template` in tokenizer_config.json, or
chat_template.jinja), rendered by `tokenizer.apply_chat_template`: the same Jinja semantics, the same
normalisation of messages (keys whose value is None are dropped). The tiny model's template is ChatML
(`clawr1/tinymodel/chatml.py`); nothing here knows any family's markers. What the code needs of a
template it reads off the template itself (`TemplateMarkers`): the special token that closes an assistant
turn, and the text that opens and closes a user turn (the judge puts hints there).

Token-in/token-out: a session's next prompt is its recorded ids (prompt plus the sampled reply) plus the
ids of only the new messages. When the template renders the recorded history exactly as it was sampled,
the new messages' text is the fresh render's suffix after it. When it does not (Qwen3's template drops
earlier turns' reasoning; any template re-renders a tool call's JSON its own way), the template is not
prefix-stable there: `model.on_template_break` keeps the sampled ids (the default) or re-renders, and
either way the break is counted.

Ids come from the rendered text split before each special token: the tokenizer splits there anyway, so
the pieces' ids concatenate to the whole text's ids, and each piece (a message, mostly) is tokenized once
and remembered.
"""
from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import jinja2

MESSAGE_CACHE_SIZE = 4096  # rendered pieces (about one per message) whose ids the renderer keeps
# apply_chat_template's own arguments: a request's chat_template_kwargs may not set them
RESERVED_TEMPLATE_KWARGS = frozenset({
    "conversation", "tools", "documents", "chat_template", "add_generation_prompt", "continue_final_message",
    "tokenize", "padding", "truncation", "max_length", "return_tensors", "return_dict",
    "return_assistant_tokens_mask", "tokenizer_kwargs", "sanitize_control_tokens", "messages"})
# plain words that no template changes, to find where a message's content sits in a rendering
_PROBE_A, _PROBE_B, _PROBE_C = "probe-alpha", "probe-bravo", "probe-charlie"


class ChatTemplateError(ValueError):
    """The template cannot render these messages (or is missing); the text says why."""


@dataclass
class Prompt:
    ids: list[int]
    text: str  # what the ids decode to (for a recorded history: the sampled text, exactly)


@dataclass(frozen=True)
class TemplateMarkers:
    turn_end: str  # the special token that closes an assistant turn (sampled as its last token)
    user_header: str  # the text that opens a user message, before its content
    user_end: str  # the special token right after a user message's content


def checked_template_kwargs(kwargs: Optional[dict]) -> dict:
    """A request's chat_template_kwargs, refused when one names an argument of apply_chat_template itself."""
    kwargs = dict(kwargs or {})
    clash = sorted(RESERVED_TEMPLATE_KWARGS & kwargs.keys())
    if clash:
        raise ChatTemplateError(f"chat_template_kwargs may not set {', '.join(clash)}")
    return kwargs


class ChatRenderer:
    """Renders OpenAI-style messages with the tokenizer's chat template, to text and to ids."""

    def __init__(self, tokenizer: Any, template_kwargs: Optional[dict] = None):
        if not getattr(tokenizer, "chat_template", None):
            raise ChatTemplateError(
                f"the tokenizer from {getattr(tokenizer, 'name_or_path', '?')!s} has no chat template "
                "(expected chat_template in tokenizer_config.json, or a chat_template.jinja file)")
        self.tokenizer = tokenizer
        self.template_kwargs = checked_template_kwargs(template_kwargs)
        self._fast = getattr(tokenizer, "backend_tokenizer", None)  # the Rust tokenizer: half the cost per call
        specials = sorted({t.content for t in tokenizer.added_tokens_decoder.values() if t.special}, key=len,
                          reverse=True)
        self.special_tokens = frozenset(specials)
        self._split = re.compile("(?=" + "|".join(map(re.escape, specials)) + ")") if specials else None
        self._piece_ids: OrderedDict[str, tuple[int, ...]] = OrderedDict()
        self.markers = self._find_markers()
        self.turn_end_id = self._single_id(self.markers.turn_end)
        self.user_end_id = self._single_id(self.markers.user_end)
        self.user_header_ids = self.encode(self.markers.user_header)
        # a reply that samples one of these has ended (the gateway adds the model's own eos_token_id list)
        self.end_ids = frozenset({self.turn_end_id,
                                  *([tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else [])})

    # ------------------------------------------------------------ text
    def render(self, messages: Sequence[dict], tools: Optional[Sequence[dict]] = None,
               add_generation_prompt: bool = True, template_kwargs: Optional[dict] = None) -> str:
        if not messages:
            raise ChatTemplateError("a conversation needs at least one message")
        kwargs = {**self.template_kwargs, **checked_template_kwargs(template_kwargs)}
        try:
            return self.tokenizer.apply_chat_template(
                [dict(m) for m in messages], tools=list(tools) if tools else None, tokenize=False,
                add_generation_prompt=add_generation_prompt, **kwargs)
        except (jinja2.TemplateError, TypeError, KeyError, AttributeError, ValueError) as e:
            raise ChatTemplateError(f"the model's chat template cannot render these messages: {e}") from None

    def decode(self, ids: Sequence[int]) -> str:
        """The exact text of ids, special tokens kept and no clean-up of spaces (so it can be compared)."""
        if self._fast is not None:
            return self._fast.decode(list(ids), skip_special_tokens=False)
        return self.tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    # ------------------------------------------------------------ ids
    def encode_text(self, text: str) -> list[int]:
        """Ids of plain text, no special tokens added (a template's markers in it are still special)."""
        try:
            if self._fast is not None:
                return self._fast.encode(text, add_special_tokens=False).ids
            return list(self.tokenizer.encode(text, add_special_tokens=False))
        except (TypeError, UnicodeEncodeError):
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as e:  # JSON may escape a lone surrogate; no tokenizer takes one
                raise ChatTemplateError(f"the messages hold text that is not Unicode: {text[e.start]!r} at "
                                        f"character {e.start} (a lone surrogate)") from None
            raise

    def encode(self, text: str) -> list[int]:
        """Ids of rendered text: the ids of its pieces (split before each special token), each remembered."""
        ids: list[int] = []
        for piece in (self._split.split(text) if self._split else [text]):
            if piece:
                ids.extend(self._remembered_ids(piece))
        return ids

    def _remembered_ids(self, piece: str) -> tuple[int, ...]:
        ids = self._piece_ids.get(piece)
        if ids is None:
            ids = self._piece_ids[piece] = tuple(self.encode_text(piece))
            if len(self._piece_ids) > MESSAGE_CACHE_SIZE:
                self._piece_ids.popitem(last=False)
        else:
            self._piece_ids.move_to_end(piece)
        return ids

    def encode_messages(self, messages: Sequence[dict], add_generation_prompt: bool = True,
                        tools: Optional[Sequence[dict]] = None, template_kwargs: Optional[dict] = None) -> list[int]:
        return self.encode(self.render(messages, tools, add_generation_prompt, template_kwargs))

    # ------------------------------------------------------------ pieces of a conversation
    def continuation_text(self, reply: dict, new: Sequence[dict], tools: Optional[Sequence[dict]] = None,
                          template_kwargs: Optional[dict] = None) -> str:
        """The text that follows an assistant turn's closing token when `new` messages come after `reply`
        (and a generation prompt after them), rendered with `reply` as their only context."""
        before = self.render([reply], tools, False, template_kwargs)
        after = self.render([reply, *new], tools, True, template_kwargs)
        if not after.startswith(before):
            raise ChatTemplateError("the template renders a reply differently once messages follow it")
        cut = before.rfind(self.markers.turn_end)
        return after[cut + len(self.markers.turn_end) if cut >= 0 else len(before):]

    def reply_ids(self, prompt_messages: Sequence[dict], reply: dict, tools: Optional[Sequence[dict]] = None,
                  template_kwargs: Optional[dict] = None) -> list[int]:
        """A logged assistant reply as the model would have sampled it after `prompt_messages`: its text as the
        template renders it last, up to and including the token that closes the turn."""
        prompt = self.render(prompt_messages, tools, True, template_kwargs)
        whole = self.render([*prompt_messages, reply], tools, False, template_kwargs)
        if not whole.startswith(prompt):
            raise ChatTemplateError("the template renders the prompt differently once the reply follows it")
        body = whole[len(prompt):]
        end = body.find(self.markers.turn_end)
        return self.encode(body[: end + len(self.markers.turn_end)] if end >= 0 else body) + (
            [] if end >= 0 else [self.turn_end_id])

    def with_hint(self, prompt_ids: list[int], hint: str) -> list[int]:
        """The prompt with `hint` on a new line at the end of its last user message (the teacher's context)."""
        return splice_hint(prompt_ids, self.encode_text("\n" + hint), self.user_header_ids, self.user_end_id)

    # ------------------------------------------------------------ what the template looks like
    def _find_markers(self) -> TemplateMarkers:
        user_a, reply_b, user_c = ({"role": "user", "content": _PROBE_A}, {"role": "assistant", "content": _PROBE_B},
                                   {"role": "user", "content": _PROBE_C})
        one_turn = self.render([user_a, reply_b], add_generation_prompt=False)
        two_turns = self.render([user_a, reply_b, user_c], add_generation_prompt=False)
        turn_end = self._first_special(one_turn[one_turn.rindex(_PROBE_B) + len(_PROBE_B):], "an assistant turn")
        user_end = self._first_special(two_turns[two_turns.rindex(_PROBE_C) + len(_PROBE_C):], "a user turn")
        between = two_turns[two_turns.rindex(_PROBE_B) + len(_PROBE_B): two_turns.rindex(_PROBE_C)]
        rest = between.split(turn_end, 1)[-1]  # what opens the user turn, after any text between turns
        opens = self._split.search(rest) if self._split else None
        return TemplateMarkers(turn_end=turn_end, user_header=rest[opens.start():] if opens else rest,
                               user_end=user_end)

    def _first_special(self, text: str, what: str) -> str:
        found = [t for t in self.special_tokens if text.lstrip().startswith(t)]
        if not found:
            raise ChatTemplateError(f"the chat template closes {what} with no special token (it renders "
                                    f"{text[:40]!r} after the content); clawr1 needs one to know where a turn ends")
        return max(found, key=len)

    def _single_id(self, token: str) -> int:
        ids = self.encode_text(token)
        if len(ids) != 1:
            raise ChatTemplateError(f"{token!r} is not one token in this tokenizer")
        return ids[0]


def splice_hint(prompt_ids: list[int], hint_ids: list[int], user_header_ids: list[int], end_id: int) -> list[int]:
    """Insert `hint_ids` before the end of the last user message (or of the last message if none)."""
    n = len(user_header_ids)
    starts = [i for i in range(len(prompt_ids) - n + 1) if prompt_ids[i:i + n] == user_header_ids]
    search_from = starts[-1] + n if starts else 0
    ends = [i for i in range(search_from, len(prompt_ids)) if prompt_ids[i] == end_id]
    if not ends:
        raise ValueError("the prompt has no closed message to put the hint in")
    at = ends[0] if starts else ends[-1]
    return prompt_ids[:at] + hint_ids + prompt_ids[at:]


_PROBE_TOOLS = [{"type": "function", "function": {
    "name": "lookup", "description": "Look a word up.",
    "parameters": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]}}}]


def _call(word: str, i: int = 0) -> dict:
    return {"id": f"call_{i}", "type": "function", "function": {"name": "lookup", "arguments": {"word": word}}}


# (shape, tools, history ending with a sampled reply, the messages that follow it)
PROBE_SHAPES: list[tuple[str, Optional[list], list[dict], list[dict]]] = [
    ("a reply, then a user message", None,
     [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
      {"role": "assistant", "content": "Hello."}], [{"role": "user", "content": "Thanks"}]),
    ("a reply with reasoning, then a user message", None,
     [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello.", "reasoning_content": "Greet."}],
     [{"role": "user", "content": "Thanks"}]),
    ("a tool call, then its result", _PROBE_TOOLS,
     [{"role": "user", "content": "Define cat"}, {"role": "assistant", "content": "", "tool_calls": [_call("cat")]}],
     [{"role": "tool", "tool_call_id": "call_0", "content": "an animal"}]),
    ("parallel tool calls, then their results", _PROBE_TOOLS,
     [{"role": "user", "content": "Define cat and dog"},
      {"role": "assistant", "content": "", "tool_calls": [_call("cat"), _call("dog", 1)]}],
     [{"role": "tool", "tool_call_id": "call_0", "content": "an animal"},
      {"role": "tool", "tool_call_id": "call_1", "content": "an animal"}]),
    ("a reply after a tool result, then a user message", _PROBE_TOOLS,
     [{"role": "user", "content": "Define cat"}, {"role": "assistant", "content": "", "tool_calls": [_call("cat")]},
      {"role": "tool", "tool_call_id": "call_0", "content": "an animal"},
      {"role": "assistant", "content": "A cat is an animal."}], [{"role": "user", "content": "Thanks"}]),
]


def sampled_text(renderer: ChatRenderer, history: Sequence[dict], tools: Optional[Sequence[dict]] = None,
                 template_kwargs: Optional[dict] = None) -> str:
    """The text a session records for `history` (ending with a reply) if the model sampled exactly what
    the template renders for that reply in generation position."""
    prompt = renderer.render(history[:-1], tools, True, template_kwargs)
    reply = renderer.decode(renderer.reply_ids(history[:-1], history[-1], tools, template_kwargs))
    return prompt + reply


def template_breaking_shapes(renderer: ChatRenderer) -> list[str]:
    """The probe shapes for which the template renders a sampled history otherwise once messages follow it."""
    broken = []
    for shape, tools, history, new in PROBE_SHAPES:
        try:
            recorded = sampled_text(renderer, history, tools)
            fresh = renderer.render([*history, *new], tools, True)
        except ChatTemplateError:
            broken.append(shape)
            continue
        if not fresh.startswith(recorded):
            broken.append(shape)
    return broken
