"""What the embedded engine will hold in memory, worked out before it loads anything.

The engine holds the weights and one pool of KV positions shared by its running requests (SGLang's token pool:
2 x layers x kv_heads x head_dim values per token). A request is admitted while the tokens it may fill (prompt +
max_new_tokens, within `serve.context_length`) fit in the pool, and waits otherwise. The pool's size is
`serve.max_total_tokens` when set; else whatever `serve.mem_fraction_static` of the budget leaves beside the
weights, at most `serve.max_running_requests` whole contexts (more could never be used). A model's maximum context
is often far more than a CPU run needs (SmolLM2: 8,192; Qwen3: 40,960), so the context defaults to the smaller of
the model's maximum and `CPU_DEFAULT_CONTEXT` (clawr1/model_path.py). The budget is `serve.memory_budget_gb`
(default: the memory the machine has available). The engine refuses to start, saying which keys to change, when
the weights and one request's whole context do not fit, or when a set pool does not: never killed by the kernel
halfway through.

On a GPU (`serve.device=cuda`) the same plan is held in GPU memory, and the budget is GPU memory (0: what
the device has free). When the trainer shares the GPU (one machine, no device partition), each engine on it
takes its budget and the trainer the rest; the engine refuses to start when the engines' budgets plus what
the trainer needs (`trainer_bytes`) exceed the card, naming every number (`check_colocation`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from clawr1.model_path import engine_context

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
GIB = 1 << 30


class EngineMemoryError(RuntimeError):
    """The engine would not fit; the text names the numbers and the keys that change them."""


@dataclass(frozen=True)
class EnginePlan:
    context: int  # tokens per request at most
    slots: int  # requests at once at most
    weights_bytes: int
    token_bytes: int  # one token's keys and values over every layer
    pool_tokens: int  # the KV pool

    @property
    def kv_cache_bytes(self) -> int:
        return self.pool_tokens * self.token_bytes

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


def plan_engine(model_dir: Path, dtype: str, slots: int, context_length: int, pool_tokens: int = 0,
                prepacked: bool = False) -> EnginePlan:
    """The engine's plan with a pool of `pool_tokens` (0: every slot's whole context; `size_pool` fits it to a
    budget); `prepacked`: the weights counted twice (serve.cpu_prepack packs a second copy of the large ones)."""
    config = json.loads((model_dir / "config.json").read_text())
    config = config.get("text_config", config)
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    kv_heads = config.get("num_key_value_heads") or heads
    context = engine_context(config.get("max_position_embeddings", 0), context_length)
    width = DTYPE_BYTES[dtype]
    token_bytes = 2 * config["num_hidden_layers"] * kv_heads * head_dim * width
    weights = parameter_count(model_dir) * width * (2 if prepacked else 1)
    return EnginePlan(context, slots, weights, token_bytes, pool_tokens or slots * context)


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


def size_pool(plan: EnginePlan, budget_gb: float, device: str = "cpu", fraction: float = 1.0,
              pool_tokens: int = 0) -> EnginePlan:
    """The plan with its pool sized within `fraction` of the budget (0 GB: what the device has available): the
    set `pool_tokens`, refused when it does not fit; else what the budget leaves beside the weights, at most the
    plan's pool. Raises EngineMemoryError when the weights and one request's whole context do not fit."""
    budget = int(budget_gb * GIB) if budget_gb else available_bytes(device)
    usable = int(budget * fraction)
    room_tokens = max(usable - plan.weights_bytes, 0) // plan.token_bytes
    where = (f"{'serve.memory_budget_gb is' if budget_gb else 'the machine has'} {budget / GIB:.2f} GiB"
             f"{'' if budget_gb else ' available'}, of which serve.mem_fraction_static ({fraction:g}) is "
             f"{usable / GIB:.2f} GiB")
    if pool_tokens:
        if pool_tokens > room_tokens:
            raise EngineMemoryError(
                f"the engine needs {(plan.weights_bytes + pool_tokens * plan.token_bytes) / GIB:.2f} GiB (weights "
                f"{plan.weights_bytes / GIB:.2f} GiB + a KV pool of serve.max_total_tokens={pool_tokens} tokens) but "
                f"{where}. Lower serve.max_total_tokens ({room_tokens} would fit) or use serve.dtype=bfloat16")
        return replace(plan, pool_tokens=pool_tokens)
    if room_tokens < plan.context:
        raise EngineMemoryError(
            f"the engine needs {(plan.weights_bytes + plan.context * plan.token_bytes) / GIB:.2f} GiB at least "
            f"(weights {plan.weights_bytes / GIB:.2f} GiB + the KV cache of one request of {plan.context} tokens, "
            f"{plan.context * plan.token_bytes / GIB:.2f} GiB) but {where}. "
            + (f"Lower serve.context_length ({room_tokens} tokens would fit), use serve.dtype=bfloat16, or raise "
               "serve.memory_budget_gb" if room_tokens else
               "The weights alone do not fit: use serve.dtype=bfloat16 or raise serve.memory_budget_gb"))
    return replace(plan, pool_tokens=min(plan.pool_tokens, room_tokens))


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
