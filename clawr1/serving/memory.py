"""What the embedded engine will hold in memory, worked out before it loads anything.

The engine holds the weights and a KV cache of `serve.max_running_requests` slots of `serve.context_length`
tokens each (2 x layers x slots x context x kv_heads x head_dim values). A model's maximum context is often
far more than a CPU run needs (SmolLM2: 8,192; Qwen3: 40,960), so the context defaults to the smaller of the
model's maximum and `CPU_DEFAULT_CONTEXT` (clawr1/model_path.py). If weights plus cache do not fit in `serve.memory_budget_gb`
(default: the memory the machine has available), the engine refuses to start and says which keys to change,
rather than being killed by the kernel halfway through.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from clawr1.model_path import engine_context

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
GIB = 1 << 30


class EngineMemoryError(RuntimeError):
    """The engine would not fit; the text names the numbers and the keys that change them."""


@dataclass(frozen=True)
class EnginePlan:
    context: int  # tokens per request
    slots: int  # requests at once
    weights_bytes: int
    kv_cache_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_cache_bytes


def parameter_count(model_dir: Path) -> int:
    """Elements in the directory's safetensors files, read from their headers (no tensor is loaded)."""
    total = 0
    for f in sorted(model_dir.glob("*.safetensors")):
        with open(f, "rb") as fh:
            header = json.loads(fh.read(int.from_bytes(fh.read(8), "little")))
        for name, meta in header.items():
            if name != "__metadata__":
                n = 1
                for d in meta["shape"]:
                    n *= d
                total += n
    return total


def plan_engine(model_dir: Path, dtype: str, slots: int, context_length: int) -> EnginePlan:
    config = json.loads((model_dir / "config.json").read_text())
    config = config.get("text_config", config)
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    kv_heads = config.get("num_key_value_heads") or heads
    context = engine_context(config.get("max_position_embeddings", 0), context_length)
    width = DTYPE_BYTES[dtype]
    kv = 2 * config["num_hidden_layers"] * slots * context * kv_heads * head_dim * width
    return EnginePlan(context, slots, parameter_count(model_dir) * width, kv)


def available_bytes() -> int:
    """MemAvailable from /proc/meminfo (Linux); elsewhere the physical memory size."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    import os

    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_fits(plan: EnginePlan, budget_gb: float) -> None:
    """Raise EngineMemoryError when the plan needs more than the budget (0: what the machine has available)."""
    budget = int(budget_gb * GIB) if budget_gb else available_bytes()
    if plan.total_bytes <= budget:
        return
    per_slot = plan.kv_cache_bytes / max(plan.slots, 1)
    fits_slots = int(max(budget - plan.weights_bytes, 0) // per_slot) if per_slot else 0
    raise EngineMemoryError(
        f"the engine needs {plan.total_bytes / GIB:.2f} GiB (weights {plan.weights_bytes / GIB:.2f} GiB + KV cache "
        f"{plan.kv_cache_bytes / GIB:.2f} GiB for {plan.slots} requests x {plan.context} tokens) but "
        f"{'serve.memory_budget_gb is' if budget_gb else 'the machine has'} {budget / GIB:.2f} GiB"
        f"{'' if budget_gb else ' available'}. Lower serve.max_running_requests (at this context "
        f"{fits_slots} would fit) or serve.context_length, or use serve.dtype=bfloat16")
