"""The renderer renders with the model's own chat template, exactly as transformers does, token for token;
a session grows by the recorded ids plus the new messages; hints land in the last user turn."""
from __future__ import annotations

import pytest

from clawr1 import chat
from clawr1.chat import ChatRenderer, ChatTemplateError, template_breaking_shapes
from clawr1.gateway.sessions import SessionStore, canonical
from clawr1.protocol import TurnRecord
from tests.chat_corpus import corpus
from tests.conftest import FAMILIES

CONVERSATION = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is 3 km plus 4 km?"},
    {"role": "assistant", "content": "<ans>7 km</ans>"},
    {"role": "user", "content": "Thanks!\nNext question: Add 1 g and 2 g."},
]
CORPUS = corpus(300)


def reference_ids(tok, messages, tools=None, **kwargs) -> list[int]:
    return tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, return_dict=False, **kwargs)


@pytest.fixture(params=("tiny", *FAMILIES))
def tokenizer(request, tiny_model, family_tokenizer):
    if request.param == "tiny":
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(tiny_model)
    return family_tokenizer(request.param)


def test_the_corpus_has_every_shape():
    messages = [m for conv, _ in CORPUS for m in conv]
    assert sum(1 for _, tools in CORPUS if tools) >= 100
    assert sum(1 for conv, _ in CORPUS if conv[0]["role"] == "system") >= 100
    assert sum(1 for m in messages if len(m.get("tool_calls", [])) >= 2) >= 50
    assert sum(1 for m in messages if m["role"] == "tool") >= 200
    assert sum(1 for m in messages if m.get("reasoning_content")) >= 100
    assert sum(1 for m in messages if any(ord(ch) > 127 for ch in m.get("content") or "")) >= 300
    assert {sum(m["role"] == "user" for m in conv) for conv, _ in CORPUS} == set(range(1, 9))


@pytest.mark.parametrize("family", FAMILIES)
def test_a_fresh_render_is_apply_chat_template_id_for_id(family, family_tokenizer):
    tok = family_tokenizer(family)
    r = ChatRenderer(tok)
    for messages, tools in CORPUS:
        assert r.encode_messages(messages, tools=tools) == reference_ids(tok, messages, tools), (messages, tools)


def test_the_tiny_models_template_is_chatml_rendered_like_any_other(tokenizer):
    r = ChatRenderer(tokenizer)
    assert r.encode_messages(CONVERSATION) == reference_ids(tokenizer, CONVERSATION)
    assert r.decode(r.encode_messages(CONVERSATION)) == tokenizer.apply_chat_template(
        CONVERSATION, tokenize=False, add_generation_prompt=True)


def test_template_kwargs_reach_the_template(family_tokenizer):
    tok = family_tokenizer("qwen3")
    r = ChatRenderer(tok)
    off = r.encode_messages(CONVERSATION, template_kwargs={"enable_thinking": False})
    assert off == reference_ids(tok, CONVERSATION, enable_thinking=False) != r.encode_messages(CONVERSATION)
    assert r.decode(off).endswith("<think>\n\n</think>\n\n")
    assert ChatRenderer(tok, {"enable_thinking": False}).encode_messages(CONVERSATION) == off
    with pytest.raises(ChatTemplateError, match="tokenize"):
        r.encode_messages(CONVERSATION, template_kwargs={"tokenize": True})


def test_a_tokenizer_without_a_template_is_refused_by_name(family_tokenizer):
    import copy

    tok = copy.copy(family_tokenizer("llama3_1"))
    tok.chat_template = None
    with pytest.raises(ChatTemplateError, match="no chat template"):
        ChatRenderer(tok)


def test_a_hint_lands_at_the_end_of_the_last_user_message(tokenizer):
    r = ChatRenderer(tokenizer)
    hinted = [*CONVERSATION[:-1], {"role": "user", "content": CONVERSATION[-1]["content"] + "\nUse grams."}]
    spliced = r.with_hint(r.encode_messages(CONVERSATION), "Use grams.")
    # in text, exactly the template's; in ids, the recorded ones kept (BPE may merge "." and "\n" otherwise)
    assert r.decode(spliced) == r.render(hinted)
    original, hint = r.encode_messages(CONVERSATION), r.encode_text("\nUse grams.")
    at = next(i for i, (a, b) in enumerate(zip(spliced, original)) if a != b)
    assert spliced[at: at + len(hint)] == hint and spliced[:at] + spliced[at + len(hint):] == original


def test_remembered_pieces_are_the_tokenizers_and_bounded(tokenizer, monkeypatch):
    monkeypatch.setattr(chat, "MESSAGE_CACHE_SIZE", 3)
    r = ChatRenderer(tokenizer)
    first = r.encode_messages(CONVERSATION)
    again = r.encode_messages(CONVERSATION)
    assert first == again == reference_ids(tokenizer, CONVERSATION)
    again.append(-1)  # a caller extending its ids must not change what is remembered
    assert r.encode_messages(CONVERSATION) == first
    assert len(r._piece_ids) == 3


def test_the_probe_finds_qwen3s_reasoning_break_and_none_in_chatml(tiny_model, family_tokenizer):
    from transformers import AutoTokenizer

    assert template_breaking_shapes(ChatRenderer(AutoTokenizer.from_pretrained(tiny_model))) == []
    assert "a reply with reasoning, then a user message" in template_breaking_shapes(
        ChatRenderer(family_tokenizer("qwen3")))


def _grow(store: SessionStore, messages: list[dict], tools) -> tuple[int, int]:
    """Play `messages` turn by turn through the session store, the model sampling exactly what the template
    renders for each reply in generation position. Returns (turns, turns the template re-renders otherwise)."""
    r, tok = store.renderer, store.renderer.tokenizer
    session = store.get(f"s{id(messages)}")
    turns = expected_breaks = 0
    recorded: list[int] = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        history = messages[:i]
        fresh = reference_ids(tok, history, tools)
        prompt, _ = store.prompt_for(session, history, tools, [canonical(x) for x in history])
        if turns:
            broken = fresh[: len(recorded)] != recorded
            expected_breaks += broken
            if not broken or store.on_template_break == "rerender":
                assert prompt.ids == fresh  # token-exact where the template is prefix-stable
            else:
                assert prompt.ids[: len(recorded)] == recorded  # the sampled tokens are kept
        else:
            assert prompt.ids == fresh
        assert r.decode(prompt.ids) == prompt.text
        reply_ids = r.reply_ids(history, m, tools)
        record = TurnRecord(session_id=session.id, turn_index=turns, prompt_ids=prompt.ids, response_ids=reply_ids,
                            rollout_logprobs=[0.0] * len(reply_ids), versions=[0] * len(reply_ids), messages=history)
        store.record(session, history, tools, [(m, reply_ids, record)], prompt, [canonical(x) for x in history])
        recorded = prompt.ids + reply_ids
        turns += 1
    return turns, expected_breaks


@pytest.mark.parametrize("policy", ("keep_sampled", "rerender"))
@pytest.mark.parametrize("family", FAMILIES)
def test_a_session_grows_token_exact_and_counts_each_template_break(family, policy, family_tokenizer):
    store = SessionStore(ChatRenderer(family_tokenizer(family)), max_sessions=10_000, ttl_s=3600,
                         on_template_break=policy)
    turns = expected = 0
    for messages, tools in CORPUS:
        t, b = _grow(store, messages, tools)
        turns, expected = turns + t, expected + b
    assert turns >= 500
    assert store.template_breaks == expected and store.prefix_breaks == 0
    if family == "qwen3":  # its template drops earlier reasoning (and re-renders thinking-mode turns)
        assert expected > 0
