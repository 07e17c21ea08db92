"""Which HF model directory a run uses: the configured one, or the tiny model clawr1 builds itself."""
from __future__ import annotations

from pathlib import Path

from clawr1.config import ModelConfig


def resolve_model_path(model_cfg: ModelConfig) -> Path:
    """model.path when set (it must hold an HF config.json); else the cached tiny model, built on first use."""
    if model_cfg.path:
        path = Path(model_cfg.path).expanduser()
        if not (path / "config.json").exists():
            raise FileNotFoundError(f"model.path {path} holds no config.json (an HF model directory is expected)")
        return path
    from clawr1.tinymodel.build import ensure_tiny_model

    return ensure_tiny_model(model_cfg.tiny, Path(model_cfg.cache_dir).expanduser())
