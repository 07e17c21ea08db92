"""Whether Triton's kernels can run here: triton importable, and on a CPU its interpreter on. Shared by the
trainer's fused kernels and the engine's paged decode attention (loops never import each other)."""
from __future__ import annotations

import os


def require_triton(setting: str, on_cpu: bool, fallback: str) -> None:
    """Raise naming `setting` (the config key and value asking for kernels) where they cannot run."""
    try:
        import triton  # noqa: F401
    except ImportError:
        raise RuntimeError(f"{setting} needs triton, which is not installed") from None
    if on_cpu and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(f"{setting}: Triton's kernels run on a CPU only under its interpreter (TRITON_INTERPRET=1, "
                           f"slow: for tests); on a CPU {fallback}")
