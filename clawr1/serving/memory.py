"""What the embedded engine will hold in memory, worked out before it loads anything.

The engine holds the weights and a KV cache of `serve.max_running_requests` slots of `serve.context_length`
tokens each (2 x layers x slots x context x kv_heads x head_dim values). A model's maximum context is often
far more than a CPU run needs (SmolLM2: 8,192; Qwen3: 40,960), so the context defaults to the smaller of the
model's maximum and `CPU_DEFAULT_CONTEXT` (clawr1/model_path.py). If weights plus cache do not fit in `serve.memory_budget_gb`
(default: the memory the machine has available), the engine refuses to start and says which keys to change,
rather than being killed by the kernel halfway through.

On a GPU (`serve.device=cuda`) the same plan is held in GPU memory, and the budget is GPU memory (0: what
the device has free). When the trainer shares the GPU (one machine, no device partition), each engine on it
takes its budget and the trainer the rest; the engine refuses to start when the engines' budgets plus what
the trainer needs (`trainer_bytes`) exceed the card, naming every number (`check_colocation`).
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


def available_bytes(device: str = "cpu") -> int:
    """On CUDA the device's free memory; else MemAvailable from /proc/meminfo (Linux), elsewhere the physical
    memory size."""
    if device.startswith("cuda"):
        import torch

        return torch.cuda.mem_get_info(torch.device(device))[0]
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    import os

    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_fits(plan: EnginePlan, budget_gb: float, device: str = "cpu") -> None:
    """Raise EngineMemoryError when the plan needs more than the budget (0: what the device has available)."""
    budget = int(budget_gb * GIB) if budget_gb else available_bytes(device)
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


# Per parameter, what the trainer keeps for the whole run: bf16 (megatron's distributed optimizer): the bf16
# weight, an fp32 gradient buffer, fp32 main weights, Adam's two fp32 moments; fp32: weight, gradient, moments.
TRAINER_BYTES_PER_PARAM = {"bf16": 2 + 4 + 4 + 8, "fp32": 4 + 4 + 8}
# Activations kept for the backward pass, per token, layer and hidden unit: 34 bytes in 16-bit (Korthikanti et
# al. 2022, "Reducing Activation Recomputation", without the attention-score term that fused attention drops)
ACTIVATION_BYTES_16BIT = 34
CUDA_CONTEXT_BYTES = GIB // 2  # each process's CUDA context and allocator slack, an allowance


def trainer_bytes(model_dir: Path, precision: str, microbatch_tokens: int, logprob_chunk_tokens: int) -> int:
    """What the trainer needs on its GPU: its state, one micro-batch's activations, and the fp32 logits of one
    log-prob chunk (logits, log-softmax and their gradient), plus its CUDA context."""
    config = json.loads((model_dir / "config.json").read_text())
    config = config.get("text_config", config)
    width = 2 if precision == "bf16" else 4
    state = parameter_count(model_dir) * TRAINER_BYTES_PER_PARAM[precision]
    activations = ACTIVATION_BYTES_16BIT * width // 2 * microbatch_tokens * config["hidden_size"] * config["num_hidden_layers"]
    logits = 3 * 4 * logprob_chunk_tokens * config["vocab_size"]
    return state + activations + logits + CUDA_CONTEXT_BYTES


def check_colocation(engine_budget: int, engines: int, trainer_need: int, device_total: int) -> None:
    """Raise EngineMemoryError when `engines` engines of `engine_budget` bytes each and the trainer's need do
    not fit on one device together."""
    engines_total = engines * (engine_budget + CUDA_CONTEXT_BYTES)
    if engines_total + trainer_need <= device_total:
        return
    left = device_total - trainer_need - engines * CUDA_CONTEXT_BYTES
    raise EngineMemoryError(
        f"the engines and the trainer do not fit on one GPU together: {engines} engine(s) x "
        f"{engine_budget / GIB:.2f} GiB (serve.memory_budget_gb) + {engines} x {CUDA_CONTEXT_BYTES / GIB:.2f} GiB "
        f"CUDA context + the trainer's {trainer_need / GIB:.2f} GiB = {(engines_total + trainer_need) / GIB:.2f} GiB, "
        f"but the device has {device_total / GIB:.2f} GiB. Lower serve.memory_budget_gb (at most "
        f"{max(left, 0) / max(engines, 1) / GIB:.2f} GiB per engine would fit), trainer.max_tokens_per_microbatch "
        f"or trainer.logprob_chunk_tokens, or give the engines their own GPUs (cluster.rollout_gpus)")
