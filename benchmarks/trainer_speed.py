"""One measurement of trainer speed, shared by gpu_smoke.py, gpu_trainer.py and trainer_throughput.py.

`measure_steps` times training steps (one warm-up batch, then the rest; several step functions interleaved
batch by batch so that they see the same machine state), and `speed_figures` turns a timing into tokens/s,
model TFLOPS and MFU against the device's dense bf16 peak.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Optional, Sequence

# dense bf16 tensor-core peak (TFLOPS, no sparsity), matched in order against torch.cuda.get_device_name()
PEAK_BF16_TFLOPS = [
    ("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("GH200", 989.4), ("H200", 989.4), ("H100", 989.4),
    ("B200", 2250.0), ("A100", 312.0), ("L40S", 362.0), ("L40", 181.0), ("L4", 121.0),
]


def model_flops(arch, samples) -> float:
    """Model FLOPs of one training step (forward + backward = 3x forward, no recomputation counted).

    Forward: 2 x (decoder matmul weights) per token, causal attention 2 x s^2 x heads x head_dim
    per layer per sample (QK^T and AV over the lower triangle), and the output layer 2 x vocab x
    hidden only at the positions the trainer computes logits for (the response tokens).
    """
    h, hd, L = arch.hidden, arch.head_dim, arch.num_layers
    per_layer = h * (arch.heads + 2 * arch.kv_heads) * hd + arch.heads * hd * h + 3 * h * arch.ffn
    tokens = sum(len(s.tokens) for s in samples)
    response = sum(s.response_len for s in samples)
    attn = sum(2 * len(s.tokens) ** 2 * arch.heads * hd for s in samples) * L
    forward = 2 * per_layer * L * tokens + attn + 2 * arch.vocab * h * response
    return 3.0 * forward


def peak_tflops(device_name: str, override: float | None) -> tuple[float | None, str]:
    if override:
        return override, "--peak-tflops"
    for key, tflops in PEAK_BF16_TFLOPS:
        if key.lower() in device_name.lower():
            return tflops, f"table entry {key!r} (dense bf16)"
    return None, f"no dense bf16 peak known for {device_name!r} (pass --peak-tflops)"


def measure_steps(step_fns: dict[str, Callable[[Any], Any]], batches: Sequence, synchronize: Callable[[], None],
                  deadline: Optional[float] = None) -> dict[str, dict]:
    """Each step function runs on every batch, interleaved; batch 0 warms them up and is not counted.

    Returns per name: seconds, tokens, steps and the batches timed. Stops early (after at least one timed
    batch) once time.monotonic() passes `deadline`."""
    timed = {name: {"seconds": 0.0, "tokens": 0, "steps": 0, "batches": []} for name in step_fns}
    for i, batch in enumerate(batches):
        if i > 1 and deadline is not None and time.monotonic() > deadline:
            break
        for name, step in step_fns.items():
            synchronize()
            t0 = time.perf_counter()
            step(batch)
            synchronize()
            if i:
                t = timed[name]
                t["seconds"] += time.perf_counter() - t0
                t["tokens"] += sum(len(s.tokens) for s in batch)
                t["steps"] += 1
                t["batches"].append(batch)
    return timed


def speed_figures(timing: dict, arch=None, peak: float | None = None) -> dict:
    """tokens/s of one measure_steps entry; with `arch`, model TFLOPS; with a peak too, MFU."""
    seconds = max(timing["seconds"], 1e-12)
    out = {"steps": timing["steps"], "tokens_per_step": timing["tokens"] // max(timing["steps"], 1),
           "seconds_per_step": round(seconds / max(timing["steps"], 1), 4),
           "tokens_per_s": round(timing["tokens"] / seconds, 1)}
    if arch is not None:
        achieved = sum(model_flops(arch, b) for b in timing["batches"]) / seconds / 1e12
        out["model_tflops_per_s"] = round(achieved, 3)
        out["mfu"] = round(achieved / peak, 4) if peak else None
    return out
