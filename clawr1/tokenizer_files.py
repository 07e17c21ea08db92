"""The model's tokenizer read from its files with the `tokenizers` library alone: what the gateway uses of a
transformers tokenizer, without importing transformers' model code (which imports torch).

`FileTokenizer` loads tokenizer.json the way `transformers.AutoTokenizer` (5.x) does for the tokenizer classes
it knows how to mirror: as the file says (`TokenizersBackend`), or rebuilt around the file's vocabulary and
merges (`Qwen2Tokenizer`), then the added and special tokens of tokenizer_config.json added in the same order
with the same flags. Chat templates are rendered by transformers' own renderer (`render_jinja_template`, whose
module imports no torch) with the arguments `apply_chat_template` passes. Anything else (no tokenizer.json,
another tokenizer class, remote code) raises `FileTokenizerUnsupported`: load it with AutoTokenizer instead.
tests/test_tokenizer_files.py holds that both give the same text and ids.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional, Sequence, Union

from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import BPE

# transformers' SPECIAL_TOKENS_ATTRIBUTES: the named tokens `special_tokens_map` holds
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
# transformers.models.qwen2.tokenization_qwen2.PRETOKENIZE_REGEX
QWEN2_PRETOKENIZE_REGEX = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
                           r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
# config.json's model_type -> the tokenizer class AutoTokenizer uses whatever tokenizer_config.json names (None: the
# class it names). Only these model types are mirrored: for others AutoTokenizer may override the named class.
MODEL_TYPES: dict[Optional[str], Optional[str]] = {None: None, "qwen2": "Qwen2Tokenizer", "qwen3": None,
                                                   "qwen3_moe": None, "llama": None}
FILE_AS_IS = ("TokenizersBackend", "PreTrainedTokenizer")  # classes that use tokenizer.json unchanged ("Fast" cut)


class FileTokenizerUnsupported(ValueError):
    """The files alone do not say what AutoTokenizer would load; the text says why."""


class FileTokenizer:
    """The model's tokenizer read from its files with the `tokenizers` library alone."""

    def __init__(self, path: Union[str, Path]):
        path = Path(path)
        self.name_or_path = str(path)
        if not (path / "tokenizer.json").is_file():
            raise FileTokenizerUnsupported(f"{path} has no tokenizer.json")
        config = _read_json(path / "tokenizer_config.json")
        model_type = _read_json(path / "config.json").get("model_type")
        tokenizer_class = _tokenizer_class(config, model_type)
        from_file = Tokenizer.from_file(str(path / "tokenizer.json"))
        file_added = from_file.get_added_tokens_decoder()
        self.backend_tokenizer = from_file
        if tokenizer_class == "Qwen2Tokenizer":
            self.backend_tokenizer = _as_qwen2(from_file, bool(config.get("add_prefix_space")))
            config = {"unk_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
                      **config}  # Qwen2Tokenizer's defaults
        if self.backend_tokenizer.post_processor is None:  # what transformers sets then (it adds no bos or eos)
            self.backend_tokenizer.post_processor = processors.TemplateProcessing(single="$A:0", pair="$A:0 $B:1")
        # transformers' encode turns these off (or sets them per call); the gateway wants neither
        self.backend_tokenizer.no_truncation()
        self.backend_tokenizer.no_padding()
        self._named, extra, added = _special_tokens(config, path, file_added)
        self._add_tokens_as_transformers_does(added, extra, rebuilt=tokenizer_class == "Qwen2Tokenizer")
        self.backend_tokenizer.encode_special_tokens = bool(config.get("split_special_tokens", False))
        self.clean_up_tokenization_spaces = bool(config.get("clean_up_tokenization_spaces", False))
        self._clean_up_bpe = bool(config.get("clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output"))
        self.chat_template = _chat_template(config, path)

    def _add_tokens_as_transformers_does(self, added: dict[int, AddedToken], extra: list, rebuilt: bool) -> None:
        """TokenizersBackend.__init__'s additions: every token of tokenizer_config's added_tokens_decoder, then the
        special tokens not among them (named ones marked special); Qwen2Tokenizer then adds all special tokens."""
        tokens = [added[i] for i in sorted(added)]
        present = {t.content for t in self.backend_tokenizer.get_added_tokens_decoder().values()}
        present |= {t.content for t in tokens}
        named = [str(t) for t in self._named.values()]
        tokens += [t for t in [*self._named.values(), *extra] if str(t) not in present]
        tokens = [AddedToken(t, special=True) if isinstance(t, str) else t for t in tokens]
        for t in tokens:
            if not t.special and t.content in named:
                t.special = True
        if tokens:
            self.backend_tokenizer.add_tokens(tokens)
        if rebuilt:
            every = dict.fromkeys([*named, *map(str, extra)])  # all_special_tokens: in order, once each
            self.backend_tokenizer.add_tokens([AddedToken(t, special=True) for t in every])

    # ------------------------------------------------------------ what transformers' tokenizer offers
    @property
    def special_tokens_map(self) -> dict[str, str]:
        return {name: str(token) for name, token in self._named.items()}

    @property
    def eos_token_id(self) -> Optional[int]:
        eos, unk = self._named.get("eos_token"), self._named.get("unk_token")
        if eos is None:
            return None
        found = self.backend_tokenizer.token_to_id(str(eos))
        return found if found is not None or unk is None else self.backend_tokenizer.token_to_id(str(unk))

    @property
    def added_tokens_decoder(self) -> dict[int, AddedToken]:
        return self.backend_tokenizer.get_added_tokens_decoder()

    def get_vocab(self) -> dict[str, int]:
        return self.backend_tokenizer.get_vocab(with_added_tokens=True)

    def convert_ids_to_tokens(self, ids: Union[int, Sequence[int]]) -> Union[Optional[str], list[Optional[str]]]:
        if isinstance(ids, int):
            return self.backend_tokenizer.id_to_token(ids)
        return [self.backend_tokenizer.id_to_token(int(i)) for i in ids]

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.backend_tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Union[int, Sequence[int]], skip_special_tokens: bool = False,
               clean_up_tokenization_spaces: Optional[bool] = None) -> str:
        text = self.backend_tokenizer.decode([ids] if isinstance(ids, int) else list(ids),
                                             skip_special_tokens=skip_special_tokens)
        clean = self.clean_up_tokenization_spaces if clean_up_tokenization_spaces is None else clean_up_tokenization_spaces
        # transformers skips the clean-up for BPE, which it would corrupt
        if clean and (type(self.backend_tokenizer.model).__name__ != "BPE" or self._clean_up_bpe):
            for spaced, joined in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                                   (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
                text = text.replace(spaced, joined)
        return text

    def apply_chat_template(self, conversation: Sequence[dict], tools: Optional[list[dict]] = None,
                            tokenize: bool = False, add_generation_prompt: bool = False, **kwargs: Any) -> str:
        """The rendered text, as transformers' apply_chat_template(..., tokenize=False) gives it."""
        from transformers.utils.chat_template_utils import render_jinja_template

        if tokenize:
            raise ValueError("FileTokenizer.apply_chat_template renders text only: encode the text (tokenize=False)")
        if not conversation:
            raise ValueError("Cannot apply chat template to an empty conversation. Provide at least one message.")
        messages = [{k: v for k, v in dict(m).items() if v is not None} for m in conversation]
        rendered, _ = render_jinja_template(
            conversations=[messages], tools=tools, documents=None, chat_template=self._template(tools),
            add_generation_prompt=add_generation_prompt, **{**self.special_tokens_map, **kwargs})
        return rendered[0]

    def _template(self, tools: Optional[list]) -> str:
        """transformers' get_chat_template: of named templates, "tool_use" when there are tools, else "default"."""
        if isinstance(self.chat_template, dict):
            if tools is not None and "tool_use" in self.chat_template:
                return self.chat_template["tool_use"]
            if "default" not in self.chat_template:
                raise ValueError(f"{self.name_or_path} has several chat templates and no default: "
                                 f"{sorted(self.chat_template)}")
            return self.chat_template["default"]
        if self.chat_template is None:
            raise ValueError(f"the tokenizer from {self.name_or_path} has no chat template")
        return self.chat_template


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _tokenizer_class(config: dict, model_type: Optional[str]) -> str:
    """The tokenizer class AutoTokenizer picks, if it is one this module mirrors."""
    if "auto_map" in config:
        raise FileTokenizerUnsupported("the tokenizer is remote code (auto_map in tokenizer_config.json)")
    if model_type not in MODEL_TYPES:
        raise FileTokenizerUnsupported(f"model_type {model_type!r}: its tokenizer class is not mirrored here")
    named = (config.get("tokenizer_class") or "").removesuffix("Fast")
    chosen = MODEL_TYPES[model_type] or named
    if chosen not in (*FILE_AS_IS, "Qwen2Tokenizer"):
        raise FileTokenizerUnsupported(f"tokenizer class {named or '(none)'!r} is not mirrored here")
    return chosen


def _as_qwen2(from_file: Tokenizer, add_prefix_space: bool) -> Tokenizer:
    """What Qwen2Tokenizer.__init__ builds: tokenizer.json's vocabulary, merges and post-processor in its own
    pipeline, with no added tokens yet."""
    model = from_file.model
    if not isinstance(model, BPE):
        raise FileTokenizerUnsupported(f"Qwen2Tokenizer with a {type(model).__name__} model in tokenizer.json")
    model.dropout, model.unk_token, model.fuse_unk, model.byte_fallback, model.ignore_merges = None, None, False, False, False
    model.continuing_subword_prefix, model.end_of_word_suffix = "", ""
    backend = Tokenizer(model)
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space, use_regex=False)])
    backend.decoder = decoders.ByteLevel()
    backend.post_processor = from_file.post_processor
    return backend


def _as_token(value: Any) -> Any:
    """A token as tokenizer_config.json writes it: a string, or an AddedToken's fields (None stays None)."""
    if isinstance(value, dict) and "content" in value:
        return AddedToken(**{k: v for k, v in value.items() if k != "__type"})
    return value


def _special_tokens(config: dict, path: Path, file_added: dict[int, AddedToken]
                    ) -> tuple[dict[str, Any], list, dict[int, AddedToken]]:
    """(named special tokens, extra special tokens, added_tokens_decoder) as transformers' _from_pretrained and
    __init__ read them: from tokenizer_config.json, or (no added_tokens_decoder there: the legacy layout) with
    special_tokens_map.json over it and tokenizer.json's added tokens (`file_added`)."""
    config = dict(config)
    if config.get("additional_special_tokens") and not config.get("extra_special_tokens"):
        config["extra_special_tokens"] = config.pop("additional_special_tokens")
    if "added_tokens_decoder" in config:
        added = {int(i): _as_token(t) for i, t in config["added_tokens_decoder"].items()}
    else:
        for key, value in _read_json(path / "special_tokens_map.json").items():
            if isinstance(value, dict) and key != "extra_special_tokens":
                value = _as_token({**value, "special": True})
            elif key == "extra_special_tokens" and isinstance(value, list):
                merged = list(config.get("extra_special_tokens") or [])
                value = merged + [t for t in (_as_token({**t, "special": True}) if isinstance(t, dict) else t
                                              for t in value) if t not in merged]
            config[key] = value
        added = file_added
    if "additional_special_tokens" in config and "extra_special_tokens" not in config:
        config["extra_special_tokens"] = config.pop("additional_special_tokens")
    named, extra = {}, []
    for key, value in config.items():
        if key == "extra_special_tokens" and isinstance(value, dict):  # model-specific named tokens
            named.update({k: _as_token(v) for k, v in value.items()})
        elif key == "extra_special_tokens":
            extra = [_as_token(t) for t in value or []]
        elif key.endswith("_token") and isinstance(_as_token(value), (str, AddedToken)):
            named[key] = _as_token(value)
    # SPECIAL_TOKENS_ATTRIBUTES first, then the model-specific ones
    order = [n for n in SPECIAL_TOKEN_NAMES if n in named] + [n for n in named if n not in SPECIAL_TOKEN_NAMES]
    return {n: named[n] for n in order}, extra, added


def _chat_template(config: dict, path: Path) -> Union[str, dict[str, str], None]:
    """chat_template.jinja and additional_chat_templates/*.jinja when present (they replace the config's),
    else tokenizer_config.json's chat_template: a string, or a list of {name, template} made a dict."""
    templates = {}
    if (path / "chat_template.jinja").is_file():
        templates["default"] = (path / "chat_template.jinja").read_text(encoding="utf-8")
    for file in sorted((path / "additional_chat_templates").glob("*.jinja")):
        templates[file.name.removesuffix(".jinja")] = file.read_text(encoding="utf-8")
    if templates:
        return templates["default"] if list(templates) == ["default"] else templates
    template = config.get("chat_template")
    if isinstance(template, (list, tuple)):
        return {t["name"]: t["template"] for t in template}
    return template
