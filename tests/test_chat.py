from clawr1.chat import ChatRenderer

CONVERSATION = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is 3 km plus 4 km?"},
    {"role": "assistant", "content": "<ans>7 km</ans>"},
    {"role": "user", "content": "Thanks!\nNext question: Add 1 g and 2 g."},
]


def test_renderer_matches_the_tokenizers_jinja_template(tiny_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    r = ChatRenderer(tok)
    jinja = tok.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=True)
    assert r.tokenizer.decode(r.encode_messages(CONVERSATION)) == jinja
    assert r.encode_messages(CONVERSATION) == tok.encode(jinja, add_special_tokens=False)


def test_message_ids_concatenate(tiny_model):
    from transformers import AutoTokenizer

    r = ChatRenderer(AutoTokenizer.from_pretrained(tiny_model))
    whole = r.encode_messages(CONVERSATION, add_generation_prompt=False)
    parts = sum((r.encode_messages([m], add_generation_prompt=False) for m in CONVERSATION), [])
    assert whole == parts


def test_training_mask_covers_assistant_content_and_its_end(tiny_model):
    from transformers import AutoTokenizer

    r = ChatRenderer(AutoTokenizer.from_pretrained(tiny_model))
    ids, mask = r.encode_for_training(CONVERSATION)
    assert ids == r.encode_messages(CONVERSATION, add_generation_prompt=False)
    trained = [i for i, m in zip(ids, mask) if m]
    assert trained == r.encode_text("<ans>7 km</ans>") + [r.im_end_id]


def test_remembered_message_ids_are_the_tokenizers_and_bounded(tiny_model, monkeypatch):
    from transformers import AutoTokenizer

    from clawr1 import chat

    monkeypatch.setattr(chat, "MESSAGE_CACHE_SIZE", 3)
    tok = AutoTokenizer.from_pretrained(tiny_model)
    r = ChatRenderer(tok)
    first = r.encode_messages(CONVERSATION)
    again = r.encode_messages(CONVERSATION)
    assert first == again == tok.encode(tok.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=True),
                                        add_special_tokens=False)
    again.append(-1)  # a caller extending its ids must not change what is remembered
    assert r.encode_messages(CONVERSATION) == first
    assert len(r._message_ids) == 3  # the least recently used of the 4 messages went out
    assert r.message_text(CONVERSATION[0]) not in r._message_ids
