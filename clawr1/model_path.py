"""Which HF model directory a run uses (the configured one, or the tiny model clawr1 builds itself), the
checks it must pass before anything starts, and its tokenizer as every loop loads it."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from clawr1.config import ModelConfig

SUPPORTED_FAMILIES = ("qwen2", "qwen3", "llama")  # config.json's model_type; the trainer converts these
CPU_DEFAULT_CONTEXT = 4096  # the embedded engine's tokens per request when serve.context_length is 0


class ModelDirError(ValueError):
    """A model directory that cannot be run; the text names everything missing."""


def resolve_model_path(model_cfg: ModelConfig) -> Path:
    """model.path when set (checked: see `check_model_dir`); else model.name's converted directory; else the
    cached tiny model, built on first use."""
    if model_cfg.path:
        path = Path(model_cfg.path).expanduser()
        check_model_dir(path, model_cfg.chat_template)
        return path
    if model_cfg.name:
        from clawr1.model_import import ModelImportError, get_model

        try:
            return get_model(model_cfg.name, Path(model_cfg.cache_dir).expanduser())
        except ModelImportError as e:
            raise ModelDirError(f"model.name {model_cfg.name}: {e}") from None
    from clawr1.tinymodel.build import ensure_tiny_model

    return ensure_tiny_model(model_cfg.tiny, Path(model_cfg.cache_dir).expanduser())


def check_model_dir(path: Path, chat_template_file: str = "") -> dict[str, Any]:
    """Refuse a directory that lacks what a run needs, naming every missing part: config.json of a supported
    architecture, safetensors weights, a tokenizer, a chat template, and a vocabulary that covers the
    tokenizer's ids (the trainer pads it to a multiple of the tensor-parallel size). Returns config.json."""
    if not path.is_dir():
        raise ModelDirError(f"model.path {path} is not a directory")
    problems: list[str] = []
    config: dict[str, Any] = {}
    try:
        config = json.loads((path / "config.json").read_text())
    except FileNotFoundError:
        problems.append("config.json is missing (an HF model directory is expected)")
    except json.JSONDecodeError as e:
        problems.append(f"config.json is not JSON ({e})")
    family = config.get("model_type")
    if config and family not in SUPPORTED_FAMILIES:
        problems.append(f"model_type {family!r} ({', '.join(config.get('architectures') or [])}) is not supported; "
                        f"supported: {', '.join(SUPPORTED_FAMILIES)}")
    if not any(path.glob("*.safetensors")):
        problems.append("no *.safetensors weights")
    tokenizer_config = _json_or_empty(path / "tokenizer_config.json")
    if not (path / "tokenizer.json").exists():
        problems.append("tokenizer.json is missing (a fast tokenizer is needed)")
    has_template = bool(tokenizer_config.get("chat_template")) or (path / "chat_template.jinja").exists()
    if chat_template_file and not Path(chat_template_file).expanduser().is_file():
        problems.append(f"model.chat_template {chat_template_file} is not a file")
    elif not (has_template or chat_template_file):
        problems.append("no chat template (chat_template in tokenizer_config.json, chat_template.jinja, or "
                        "model.chat_template)")
    largest_id = _largest_token_id(path / "tokenizer.json")
    vocab = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    if vocab and largest_id is not None and largest_id >= vocab:
        problems.append(f"the tokenizer has token id {largest_id} but vocab_size is {vocab}")
    if problems:
        raise ModelDirError(f"model.path {path} cannot be run:\n  - " + "\n  - ".join(problems))
    return config


def _json_or_empty(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def _largest_token_id(tokenizer_json: Path) -> int | None:
    data = _json_or_empty(tokenizer_json)
    ids = list((data.get("model") or {}).get("vocab", {}).values()) if isinstance(
        (data.get("model") or {}).get("vocab"), dict) else []
    ids += [t["id"] for t in data.get("added_tokens", [])]
    return max(ids) if ids else None


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
