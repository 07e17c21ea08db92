"""FileTokenizer (clawr1/tokenizer_files.py) is the tokenizer transformers' AutoTokenizer loads, read without
transformers' model code: for every tokenizer at hand, the same rendered text, ids, decoded text, tokens,
vocabulary and special tokens (its Rust tokenizer serializes identically); the layouts of tokenizer files it
reads give what AutoTokenizer gives; what it cannot mirror it refuses, and the gateway then loads AutoTokenizer.
The gateway, tokenizer and model config loaded, has imported no torch."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoConfig, AutoTokenizer, GenerationConfig

from clawr1.chat import ChatRenderer, template_breaking_shapes
from clawr1.config import ModelConfig
from clawr1.model_import import cached_model
from clawr1.model_path import load_chat_tokenizer, read_model_facts
from clawr1.tokenizer_files import MODEL_TYPES, FileTokenizer, FileTokenizerUnsupported
from clawr1.tokenizer_packages import tokenizer_dir
from tests.chat_corpus import TOOLS, corpus
from tests.conftest import FAMILIES, REPO

CACHED_MODELS = ("smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct")  # used when cached, never fetched here
CALL = {"id": "call_0", "type": "function", "function": {"name": "lookup", "arguments": {"word": "cat"}}}
CONVERSATIONS = [
    ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}], None),
    ([{"role": "user", "content": "What is 3 km plus 4 km?"}, {"role": "assistant", "content": "7 km"},
      {"role": "user", "content": "Thanks!\nNext: add 1 g and 2 g."}], None),
    ([{"role": "system", "content": "Use tools."}, {"role": "user", "content": "Define cat"},
      {"role": "assistant", "content": None, "tool_calls": [CALL, {**CALL, "id": "call_1"}]},
      {"role": "tool", "tool_call_id": "call_0", "content": "an animal"},
      {"role": "tool", "tool_call_id": "call_1", "content": "a pet"}, {"role": "assistant", "content": "A pet."},
      {"role": "user", "content": "And dog?"}], TOOLS),
    ([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello.", "reasoning_content": "Greet."},
      {"role": "user", "content": "Why?"}], None),
    *corpus(40, seed=7),
]
TEMPLATE_KWARGS = ({}, {"enable_thinking": False})
TEXTS = ["Hello, world!", " leading space", "  two leading spaces\n\nand newlines\n", "tabs\tand\r\nCRLF",
         "naïve café Straße 東京 数学 нет Ωmega", "emoji 🙂👍🏽 and a flag 🇫🇷", "decomposed: cafe\u0301 vs café",
         "digits 1234567890 and 3.14159", "Hello , world . don't isn't ?", "", " ", "\n", "trailing   "]


def _path(name: str, tiny_model: Path) -> Path:
    if name == "tiny":
        return tiny_model
    if name in FAMILIES:
        return tokenizer_dir(name)
    found = cached_model(name, Path(ModelConfig().cache_dir).expanduser())
    if found is None:
        pytest.skip(f"{name} is not in the model cache (`clawr1 model get {name}` fetches it); not fetched by this test")
    return found


@pytest.fixture(scope="module", params=("tiny", *FAMILIES, *CACHED_MODELS))
def pair(request, tiny_model):
    """(AutoTokenizer's tokenizer, FileTokenizer) of one tokenizer directory."""
    path = _path(request.param, tiny_model)
    return AutoTokenizer.from_pretrained(path), FileTokenizer(path)


def _outcome(render):
    try:
        return render()
    except Exception as e:  # a template that refuses a conversation must refuse it the same way
        return f"{type(e).__name__}: {e}"


def _texts_with_specials(tok) -> list[str]:
    specials = sorted(t.content for t in tok.added_tokens_decoder.values() if t.special)
    return [*TEXTS, "".join(specials), " ".join(specials), f"a{specials[0]}b {specials[-1]}\nc",
            *(f"x {s} y" for s in specials[:20])]


def test_the_chat_template_renders_the_same_text(pair):
    hf, ft = pair
    rendered = 0
    for conversation, tools in CONVERSATIONS:
        for generation_prompt in (True, False):
            for kwargs in TEMPLATE_KWARGS:
                want = _outcome(lambda: hf.apply_chat_template(conversation, tools=tools, tokenize=False,
                                                               add_generation_prompt=generation_prompt, **kwargs))
                got = _outcome(lambda: ft.apply_chat_template(conversation, tools=tools, tokenize=False,
                                                              add_generation_prompt=generation_prompt, **kwargs))
                assert got == want, (conversation, tools, generation_prompt, kwargs)
                rendered += conversation[-1]["content"] in got
    assert rendered >= len(CONVERSATIONS) * 2  # the templates rendered most of them (not only refusals)
    with pytest.raises(ValueError, match="text only"):
        ft.apply_chat_template(CONVERSATIONS[0][0], tokenize=True)


def test_the_renderer_gives_the_same_ids(pair):
    hf, ft = pair
    theirs, ours = ChatRenderer(hf), ChatRenderer(ft)
    assert (ours.markers, ours.end_ids, ours.special_tokens) == (theirs.markers, theirs.end_ids, theirs.special_tokens)
    assert template_breaking_shapes(ours) == template_breaking_shapes(theirs)
    for conversation, tools in CONVERSATIONS:
        for kwargs in TEMPLATE_KWARGS:
            ids = _outcome(lambda: ours.encode_messages(conversation, tools=tools, template_kwargs=kwargs))
            assert ids == _outcome(lambda: theirs.encode_messages(conversation, tools=tools, template_kwargs=kwargs))
            if isinstance(ids, list):  # and transformers' own ids
                assert ids == hf.apply_chat_template(conversation, tools=tools, add_generation_prompt=True,
                                                     return_dict=False, **kwargs)


def test_encode_and_decode_are_the_same(pair):
    hf, ft = pair
    for text in _texts_with_specials(hf):
        for add_special_tokens in (False, True):
            ids = ft.encode(text, add_special_tokens=add_special_tokens)
            assert ids == hf.encode(text, add_special_tokens=add_special_tokens), (text, add_special_tokens)
        assert ft.encode(text) == hf.encode(text)
        for skip in (False, True):
            for clean_up in (None, False, True):
                assert (ft.decode(ids, skip_special_tokens=skip, clean_up_tokenization_spaces=clean_up)
                        == hf.decode(ids, skip_special_tokens=skip, clean_up_tokenization_spaces=clean_up)), text
        assert [ft.decode([i]) for i in ids] == [hf.decode([i]) for i in ids]
        assert [ft.decode(i) for i in ids] == [hf.decode(i) for i in ids]


def test_tokens_vocabulary_and_special_tokens_are_the_same(pair):
    hf, ft = pair
    size = len(hf.get_vocab())
    ids = sorted({*range(0, size, max(1, size // 2000)), *range(size - 50, size + 3), *hf.added_tokens_decoder})
    assert [ft.convert_ids_to_tokens(i) for i in ids] == [hf.convert_ids_to_tokens(i) for i in ids]
    assert ft.convert_ids_to_tokens(ids) == hf.convert_ids_to_tokens(ids)
    assert ft.get_vocab() == hf.get_vocab()
    assert ft.eos_token_id == hf.eos_token_id is not None
    assert ft.special_tokens_map == hf.special_tokens_map
    assert ({i: (t.content, t.special) for i, t in ft.added_tokens_decoder.items()}
            == {i: (t.content, t.special) for i, t in hf.added_tokens_decoder.items()})
    assert ft.chat_template == hf.chat_template
    # the whole pipeline (normalizer, pre-tokenizer, model, decoder, added tokens and their flags)
    assert json.loads(ft.backend_tokenizer.to_str()) == json.loads(hf.backend_tokenizer.to_str())


def test_the_model_types_it_mirrors_get_the_class_autotokenizer_gives_them():
    from transformers.models.auto import tokenization_auto

    for model_type, forced in MODEL_TYPES.items():
        if model_type in tokenization_auto.MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS:  # the model type's class wins
            assert forced == tokenization_auto.TOKENIZER_MAPPING_NAMES[model_type], model_type
        else:  # tokenizer_config.json's class wins
            assert forced is None, model_type


def _edit(path: Path, name: str, change) -> None:
    file = path / name
    data = json.loads(file.read_text()) if file.exists() else {}
    change(data)
    file.write_text(json.dumps(data))


def _layout_named_templates(d: Path) -> None:
    template = (d / "chat_template.jinja").read_text()
    (d / "chat_template.jinja").unlink()
    _edit(d, "tokenizer_config.json", lambda c: c.update(chat_template=[
        {"name": "default", "template": template}, {"name": "tool_use", "template": "TOOLS {{ tools | length }}"}]))


def _layout_template_file_over_config(d: Path) -> None:
    _edit(d, "tokenizer_config.json", lambda c: c.update(chat_template="from the config"))


def _layout_additional_templates(d: Path) -> None:
    (d / "additional_chat_templates").mkdir()
    (d / "additional_chat_templates" / "tool_use.jinja").write_text("TOOLS {{ tools | length }} {{ bos_token }}")


def _layout_legacy_special_tokens_map(d: Path) -> None:
    (d / "special_tokens_map.json").write_text(json.dumps({
        "bos_token": {"content": "<s>", "lstrip": False, "rstrip": False, "normalized": False, "single_word": False},
        "sep_token": "<sep>", "extra_special_tokens": ["<extra>"]}))


def _layout_added_tokens_decoder(d: Path) -> None:
    def change(c: dict) -> None:
        c["added_tokens_decoder"] = {"756": {"content": "<plain>", "special": False, "normalized": True,
                                             "lstrip": False, "rstrip": False, "single_word": False},
                                     "757": {"content": "<mark>", "special": True, "normalized": False,
                                             "lstrip": True, "rstrip": False, "single_word": False}}
        c.update(image_token="<image>", bos_token={"__type": "AddedToken", "content": "<plain>", "special": False},
                 additional_special_tokens=["<mark>", "<tool_call>"], split_special_tokens=False)
        c.pop("extra_special_tokens")
    _edit(d, "tokenizer_config.json", change)


def _layout_tokenizers_backend(d: Path) -> None:  # a model type whose tokenizer class is the one the config names
    _edit(d, "config.json", lambda c: c.update(model_type="llama"))
    _edit(d, "tokenizer_config.json", lambda c: c.update(clean_up_tokenization_spaces=True, pad_token=None))


LAYOUTS = [_layout_named_templates, _layout_template_file_over_config, _layout_additional_templates,
           _layout_legacy_special_tokens_map, _layout_added_tokens_decoder, _layout_tokenizers_backend]


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda f: f.__name__.removeprefix("_layout_"))
def test_each_layout_of_the_files_reads_as_autotokenizer_reads_it(layout, tiny_model, tmp_path):
    d = shutil.copytree(tiny_model, tmp_path / "model", ignore=shutil.ignore_patterns("*.safetensors"))
    layout(d)
    hf, ft = AutoTokenizer.from_pretrained(d), FileTokenizer(d)
    assert type(hf).__name__ == ("TokenizersBackend" if layout is _layout_tokenizers_backend else "Qwen2Tokenizer")
    assert ft.chat_template == hf.chat_template
    assert ft.special_tokens_map == hf.special_tokens_map
    assert json.loads(ft.backend_tokenizer.to_str()) == json.loads(hf.backend_tokenizer.to_str())
    for conversation, tools in CONVERSATIONS[:3]:
        assert (ft.apply_chat_template(conversation, tools=tools, add_generation_prompt=True)
                == hf.apply_chat_template(conversation, tools=tools, tokenize=False, add_generation_prompt=True))
    for text in [*_texts_with_specials(hf), "<plain> <mark>x <image><extra>"]:
        ids = hf.encode(text, add_special_tokens=False)
        assert ft.encode(text, add_special_tokens=False) == ids
        assert ft.decode(ids) == hf.decode(ids) and ft.decode(ids, True) == hf.decode(ids, True)


UNSUPPORTED = {
    "no tokenizer.json": lambda d: (d / "tokenizer.json").unlink(),
    "a model type whose tokenizer class AutoTokenizer may override":
        lambda d: _edit(d, "config.json", lambda c: c.update(model_type="gemma")),
    "a class that builds its own pipeline": lambda d: (
        _edit(d, "config.json", lambda c: c.update(model_type="llama")),
        _edit(d, "tokenizer_config.json", lambda c: c.update(tokenizer_class="GPT2Tokenizer"))),
    "remote code": lambda d: _edit(d, "tokenizer_config.json", lambda c: c.update(auto_map={"AutoTokenizer": "x.T"})),
}


@pytest.mark.parametrize("change", UNSUPPORTED.values(), ids=UNSUPPORTED.keys())
def test_what_it_does_not_mirror_it_refuses_and_the_gateway_loads_autotokenizer(change, tiny_model, tmp_path):
    d = shutil.copytree(tiny_model, tmp_path / "model", ignore=shutil.ignore_patterns("*.safetensors"))
    template = tmp_path / "override.jinja"
    template.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    cfg = ModelConfig(chat_template=str(template))
    loaded = load_chat_tokenizer(cfg, d)
    assert isinstance(loaded, FileTokenizer) and loaded.chat_template == template.read_text()
    change(d)
    with pytest.raises(FileTokenizerUnsupported):
        FileTokenizer(d)
    if (d / "tokenizer.json").exists() and "auto_map" not in (d / "tokenizer_config.json").read_text():
        fallback = load_chat_tokenizer(cfg, d)  # (AutoTokenizer needs tokenizer.json here, and runs no remote code)
        assert not isinstance(fallback, FileTokenizer) and fallback.chat_template == template.read_text()


def test_the_model_facts_are_what_transformers_reads(tiny_model, tmp_path):
    paths = [tiny_model, *(p for p in (cached_model(n, Path(ModelConfig().cache_dir).expanduser())
                                       for n in CACHED_MODELS) if p)]
    for path in paths:
        config, facts = AutoConfig.from_pretrained(path), read_model_facts(path)
        assert facts.model_type == config.model_type
        assert facts.max_position_embeddings == config.max_position_embeddings > 0
        assert facts.end_ids == [config.eos_token_id, GenerationConfig.from_pretrained(path).eos_token_id]
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "llama", "eos_token_id": [5, 6]}))
    assert read_model_facts(d).end_ids == [5, 6] and read_model_facts(d).max_position_embeddings == 0
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": 7}))
    assert read_model_facts(d).end_ids == [5, 6, 7]


def test_the_gateway_imports_no_torch(tiny_model):
    script = (
        "import sys, clawr1.gateway.main\n"
        "from pathlib import Path\n"
        "from clawr1.chat import ChatRenderer, template_breaking_shapes\n"
        "from clawr1.config import ModelConfig\n"
        "from clawr1.model_path import load_chat_tokenizer, read_model_facts\n"
        "print('torch' in sys.modules)\n"
        f"tokenizer = load_chat_tokenizer(ModelConfig(), Path({str(tiny_model)!r}))\n"
        f"read_model_facts(Path({str(tiny_model)!r}))\n"
        "template_breaking_shapes(ChatRenderer(tokenizer))\n"
        "print(type(tokenizer).__name__, 'torch' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "FileTokenizer", "False"], done.stdout
