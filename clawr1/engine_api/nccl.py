"""One NCCL on both ends of a weight-update group: what each side reports, and what SGLang's releases bring.

NCCL's init rejects peers of another NCCL release ("Mismatched NCCL version detected"), so a trainer and
engines that differ could never publish over NCCL. `DistributedWeightSync.connect` compares the trainer's
version with each engine's before any engine joins a group (clawr1/engine_api/weight_push.py).

Engines report theirs as "nccl_version" in /model_info: clawr1's embedded engine does (torch's NCCL, null
without one). SGLang reports none (0.5.15.post1 and 0.5.23: neither /model_info nor /server_info has it),
so for SGLang the check is skipped with a warning naming the NCCL that the engine's release brings through
the torch it pins (SGLANG_NCCL).
"""
from __future__ import annotations

from typing import Any, Optional

# SGLang release -> (the torch it pins, the NCCL that torch pins): docs/trainer.md ("GPU install") matches them
SGLANG_NCCL = {"0.5.23": ("2.14.1", "2.30.7"), "0.5.15.post1": ("2.11.0", "2.28.9")}


def version_string(raw: Any) -> Optional[str]:
    """NCCL's version as "major.minor.patch": from torch's tuple, NCCL's integer code, or a string; None if absent."""
    if raw is None or raw == "":
        return None
    if isinstance(raw, (tuple, list)):
        return ".".join(str(int(part)) for part in raw[:3])
    if isinstance(raw, int) and not isinstance(raw, bool):
        # NCCL_VERSION_CODE: major*10000 + minor*100 + patch since 2.9, major*1000 + minor*100 + patch before
        major, rest = (raw // 10000, raw % 10000) if raw >= 20900 else (raw // 1000, raw % 1000)
        return f"{major}.{rest // 100}.{rest % 100}"
    if isinstance(raw, str):
        return raw.strip()
    raise ValueError(f"unreadable NCCL version {raw!r}")


def local_nccl_version() -> Optional[str]:
    """The NCCL this process's torch runs with; None where torch has no NCCL (CPU builds)."""
    import torch

    try:
        return version_string(torch.cuda.nccl.version())
    except (AttributeError, RuntimeError):  # a CPU build has no torch._C._nccl_version
        return None


def reported_nccl_version(model_info: dict) -> Optional[str]:
    """The NCCL version an engine's /model_info reports; None where it reports none (SGLang)."""
    return version_string(model_info.get("nccl_version"))


def release_nccl(engine_version: Optional[str]) -> Optional[tuple[str, str]]:
    """(torch, NCCL) that an SGLang release brings, for the releases docs/trainer.md pins; None for others."""
    return SGLANG_NCCL.get((engine_version or "").strip())
