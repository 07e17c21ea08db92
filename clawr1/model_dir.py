"""The checks a model directory must pass before anything starts (config.json of a supported family, weights,
tokenizer, chat template, vocabulary): shared by the run's model path and by the GGUF import, which checks what
it wrote."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SUPPORTED_FAMILIES = ("qwen2", "qwen3", "llama")  # config.json's model_type; the trainer converts these


class ModelDirError(ValueError):
    """A model directory that cannot be run; the text names everything missing."""


def check_model_dir(path: Path, chat_template_file: str = "", weights: bool = True) -> dict[str, Any]:
    """Refuse a directory that lacks what a run needs, naming every missing part: config.json of a supported
    architecture, safetensors weights, a tokenizer, a chat template, and a vocabulary that covers the
    tokenizer's ids (the trainer pads it to a multiple of the tensor-parallel size). Returns config.json.
    `weights=False`: the weights may be missing (trainer.backend=tinker: Tinker holds them; this machine only
    renders chats and tokenizes)."""
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
    if weights and not any(path.glob("*.safetensors")):
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
