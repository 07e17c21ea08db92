"""Whether bf16 work on this CPU runs in bf16, or falls back to fp32 (and why).

A frozen bf16 base halves the memory a CPU reads per matrix product, and on CPUs with bf16 instructions
(`avx512_bf16`, AMX) oneDNN runs those products at up to twice the fp32 rate. Without them torch emulates
bf16 products, several times slower than fp32: on such a CPU the fp32 path is the fast one. So
`trainer.precision: bf16` and `serve.dtype: bfloat16` on CPU mean "bf16 where the CPU has it", decided here
once per process, with `run.cpu_bf16` to force either way (tests force both).
"""
from __future__ import annotations

import platform
from pathlib import Path

import torch

BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # Linux /proc/cpuinfo names of the instructions oneDNN uses for bf16


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str]:
    """The CPU's feature flags as Linux reports them (empty where there is no /proc/cpuinfo)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            return set(line.split(":", 1)[1].split())
    return set()


def cpu_has_bf16(flags: set[str] | None = None) -> bool:
    return bool(set(BF16_FLAGS) & (cpu_flags() if flags is None else flags))


def cpu_dtype(requested: torch.dtype, setting: str = "auto", flags: set[str] | None = None) -> tuple[torch.dtype, str]:
    """The dtype that bf16 work asked for as `requested` runs in on this CPU, and a one-line reason when it is not
    the one asked for ("" otherwise). `setting` is run.cpu_bf16: auto (the CPU decides), on, off."""
    if requested != torch.bfloat16 or setting == "on":
        return requested, ""
    if setting == "off":
        return torch.float32, "bf16 falls back to fp32: run.cpu_bf16=off treats this CPU as having no bf16 instructions"
    if cpu_has_bf16(flags):
        return requested, ""
    return torch.float32, (f"bf16 falls back to fp32: this CPU ({platform.machine()}) reports neither "
                           f"{' nor '.join(BF16_FLAGS)}, so torch would emulate bf16 products, slower than fp32")
