"""Which HF model directory a run uses (the configured one, a known model imported from its GGUF, or the tiny
model clawr1 builds itself), checked before anything starts (clawr1/model_dir.py), and its tokenizer as every
loop loads it."""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clawr1.config import ModelConfig, TinkerConfig
from clawr1.model_dir import ModelDirError, check_model_dir
from clawr1.model_import import ModelImportError, get_model

CPU_DEFAULT_CONTEXT = 4096  # the embedded engine's tokens per request when serve.context_length is 0
log = logging.getLogger(__name__)


def resolve_model_path(model_cfg: ModelConfig, weights: bool = True) -> Path:
    """model.path when set (checked: see `check_model_dir`; `weights=False` where only its tokenizer and config
    are used); else model.name's converted directory; else the cached tiny model, built on first use."""
    if model_cfg.path:
        path = Path(model_cfg.path).expanduser()
        check_model_dir(path, model_cfg.chat_template, weights)
        return path
    if model_cfg.name:
        try:
            return get_model(model_cfg.name, Path(model_cfg.cache_dir).expanduser())
        except ModelImportError as e:
            raise ModelDirError(f"model.name {model_cfg.name}: {e}") from None
    from clawr1.tinymodel.build import ensure_tiny_model

    return ensure_tiny_model(model_cfg.tiny, Path(model_cfg.cache_dir).expanduser())


def tinker_base_model(tinker_cfg: TinkerConfig, model_dir: Path) -> str:
    """The base model Tinker trains and samples: tinker.base_model, else the model directory's name (what
    `clawr1 tinker-serve` calls its model)."""
    return tinker_cfg.base_model or model_dir.name


def engine_context(model_max: int, configured: int) -> int:
    """The embedded engine's context: serve.context_length, or (0) the smaller of the model's maximum and
    CPU_DEFAULT_CONTEXT."""
    if configured:
        return configured
    return min(model_max or CPU_DEFAULT_CONTEXT, CPU_DEFAULT_CONTEXT)


def load_tokenizer(model_cfg: ModelConfig, path: Path) -> Any:
    """The tokenizer of the model at `path`, with `model.chat_template` as its template when one is set."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    if model_cfg.chat_template:
        tokenizer.chat_template = Path(model_cfg.chat_template).expanduser().read_text()
    return tokenizer


def load_chat_tokenizer(model_cfg: ModelConfig, path: Path) -> Any:
    """`load_tokenizer`'s tokenizer read with the `tokenizers` library alone (clawr1/tokenizer_files.py: no torch
    to import) where the files allow, else `load_tokenizer`'s own: for the loops that only render chats and
    encode text (the gateway, the judge)."""
    from clawr1.tokenizer_files import FileTokenizer, FileTokenizerUnsupported

    try:
        tokenizer = FileTokenizer(path)
    except FileTokenizerUnsupported as e:
        log.info("tokenizer of %s loaded with transformers: %s", path, e)
        return load_tokenizer(model_cfg, path)
    if model_cfg.chat_template:
        tokenizer.chat_template = Path(model_cfg.chat_template).expanduser().read_text()
    return tokenizer


@dataclass(frozen=True)
class ModelFacts:
    """What the gateway reads of a model's config.json and generation_config.json (as written: no defaults)."""
    model_type: str
    max_position_embeddings: int  # 0 when config.json does not say
    end_ids: list[int]  # the eos_token_id(s) of both files: the ids the model's own config says end generation


def read_model_facts(path: Path) -> ModelFacts:
    config = json.loads((path / "config.json").read_text())
    ids = [config.get("eos_token_id")]
    if (path / "generation_config.json").is_file():
        ids.append(json.loads((path / "generation_config.json").read_text()).get("eos_token_id"))
    flat = [i for x in ids for i in (x if isinstance(x, list) else [x])]
    return ModelFacts(model_type=config.get("model_type") or "",
                      max_position_embeddings=config.get("max_position_embeddings") or 0,
                      end_ids=[i for i in flat if isinstance(i, int)])
