"""Weight versions: as engines report them (one parser for every place that reads one), and the newest a run has
published (what a resumed run's engines serve)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from clawr1.engine_api.lora import read_current


def parse_version(value: Any) -> int:
    """A weight version as an int: ours count publishes; SGLang reports strings, "default" before any update."""
    if value is None or value in ("", "default"):
        return 0
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ValueError(f"unreadable weight version {value!r} (expected a count of publishes, or 'default')") from None


def token_versions(meta: dict, n: int) -> list[int]:
    """Per-token versions from SGLang's `weight_versions` spans, else the single `weight_version`."""
    spans = meta.get("weight_versions")
    if spans:
        out = [0] * n
        for span in spans:
            for i in range(span["start"], min(span["end"], n)):
                out[i] = parse_version(span["version"])
        return out
    return [parse_version(meta.get("weight_version"))] * n


def newest_weights(weights_dir: Path) -> Optional[tuple[Path, int]]:
    """The newest complete published weight directory (vNNNNNN) and its version, if any."""
    versions = [(int(d.name[1:]), d) for d in weights_dir.glob("v*") if d.name[1:].isdigit() and d.is_dir()]
    if not versions:
        return None
    version, path = max(versions)
    return path, version


def published_version(run_dir: Path, adapters: bool) -> int:
    """The newest version the run in `run_dir` has published: its LoRA adapters' (RUN_DIR/adapters/current.json)
    where it publishes adapters, else its full weights' (RUN_DIR/weights); 0 before any publish."""
    if adapters:
        current = read_current(run_dir / "adapters")
        return current["version"] if current else 0
    newest = newest_weights(run_dir / "weights")
    return newest[1] if newest else 0
