"""Weight versions as engines report them: one parser for every place that reads one."""
from __future__ import annotations

from typing import Any


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
