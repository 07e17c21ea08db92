"""Which HF model directory a run uses (the configured one, a known model imported from its GGUF, or the tiny
model clawr1 builds itself), checked before anything starts (clawr1/model_dir.py), and its tokenizer as every
loop loads it."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from clawr1.config import ModelConfig
from clawr1.model_dir import ModelDirError, check_model_dir
from clawr1.model_import import ModelImportError, get_model

CPU_DEFAULT_CONTEXT = 4096  # the embedded engine's tokens per request when serve.context_length is 0


def resolve_model_path(model_cfg: ModelConfig) -> Path:
    """model.path when set (checked: see `check_model_dir`); else model.name's converted directory; else the
    cached tiny model, built on first use."""
    if model_cfg.path:
        path = Path(model_cfg.path).expanduser()
        check_model_dir(path, model_cfg.chat_template)
        return path
    if model_cfg.name:
        try:
            return get_model(model_cfg.name, Path(model_cfg.cache_dir).expanduser())
        except ModelImportError as e:
            raise ModelDirError(f"model.name {model_cfg.name}: {e}") from None
    from clawr1.tinymodel.build import ensure_tiny_model

    return ensure_tiny_model(model_cfg.tiny, Path(model_cfg.cache_dir).expanduser())


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
