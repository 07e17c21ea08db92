"""Bytes and seconds per publish: LoRA adapters only (lora.sync=adapter) against full weights, into one
embedded engine process (`clawr1 serve`) on loopback.

Each publish, in the same run on the same engine:
- full weights: the model's whole HF state as trainer.weight_sync=http streams it (raw safetensors into
  /update_weights_from_tensor, with the pause, flush and continue around it);
- adapter: one rank-r LoRA on every linear of every layer (q, k, v, o, gate, up, down), as the trainer's
  adapter sink sends it (/load_lora_adapter_from_tensors, base64 safetensors in JSON), then the unload of the
  version before the previous one, as the sink does.
`--slots S` publishes S adapters per version (one per user), so the adapter side is S times the work.

Usage: python benchmarks/adapter_publish.py [--model PATH | --model smollm2-135m-instruct] [--rank 8]
                                            [--slots 1] [--publishes 10]
Prints one JSON line.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from clawr1.config import ModelConfig  # noqa: E402
from clawr1.devtools import LoopProcess, local_config  # noqa: E402
from clawr1.engine_api.client import SyncEngineClient  # noqa: E402
from clawr1.engine_api.lora import adapter_name, load_from_tensors_payload  # noqa: E402
from clawr1.model_path import resolve_model_path  # noqa: E402
from clawr1.serving.adapters import LORA_MODULES  # noqa: E402

MODULES = LORA_MODULES


def full_state_bytes(model_dir: Path) -> bytes:
    """The model's weights as one safetensors file, as the http sink sends them."""
    from safetensors.torch import load_file, save

    state = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        state.update(load_file(str(f)))
    return save(state, metadata={"format": "pt"})


def random_adapter(model_dir: Path, rank: int, seed: int) -> tuple[dict, dict[str, torch.Tensor]]:
    """A PEFT config and tensors for a rank-`rank` LoRA on every linear of every layer (B non-zero)."""
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(model_dir)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    q, kv = cfg.num_attention_heads * head_dim, cfg.num_key_value_heads * head_dim
    shapes = {"q_proj": (q, cfg.hidden_size), "k_proj": (kv, cfg.hidden_size), "v_proj": (kv, cfg.hidden_size),
              "o_proj": (cfg.hidden_size, q), "gate_proj": (cfg.intermediate_size, cfg.hidden_size),
              "up_proj": (cfg.intermediate_size, cfg.hidden_size), "down_proj": (cfg.hidden_size, cfg.intermediate_size)}
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(cfg.num_hidden_layers):
        for module, (out_f, in_f) in shapes.items():
            parent = "self_attn" if module.endswith(("q_proj", "k_proj", "v_proj", "o_proj")) else "mlp"
            prefix = f"base_model.model.model.layers.{layer}.{parent}.{module}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, in_f, generator=g) / in_f ** 0.5
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(out_f, rank, generator=g) * 1e-3
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": list(MODULES)}
    return config, tensors


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="", help="a model directory or a `clawr1 model get` name; empty: the tiny model")
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--slots", type=int, default=1)
    p.add_argument("--publishes", type=int, default=10)
    args = p.parse_args()
    model_cfg = ModelConfig(path=args.model) if Path(args.model).is_dir() else ModelConfig(name=args.model)
    model_dir = resolve_model_path(model_cfg)
    full = full_state_bytes(model_dir)
    config, tensors = random_adapter(model_dir, args.rank, seed=0)
    adapter_bytes = len(json.dumps(load_from_tensors_payload("slot0@v1", config, tensors, embedded=True))) * args.slots

    with tempfile.TemporaryDirectory() as tmp:
        cfg = local_config(Path(tmp), f"model.path={model_dir}", f"serve.max_loras={3 * args.slots + 1}",
                           f"serve.max_lora_rank={max(64, args.rank)}", "serve.num_threads=1")
        engine = LoopProcess(cfg, "serve")
        client = SyncEngineClient(cfg.engine_url, timeout_s=600)
        full_s, adapter_s = [], []
        try:
            engine.wait_http(f"{cfg.engine_url}/health", timeout=600)
            for version in range(1, args.publishes + 1):
                t0 = time.perf_counter()
                client.update_weights_from_tensor_bytes(full, version)
                full_s.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                for slot in range(args.slots):
                    client.load_lora_adapter_from_tensors(adapter_name(slot, version), config, tensors)
                for slot in range(args.slots):
                    if version > 2:
                        client.unload_lora_adapter(adapter_name(slot, version - 2))
                adapter_s.append(time.perf_counter() - t0)
        finally:
            client.close()
            engine.stop()
    print(json.dumps({
        "model": str(model_dir.name), "rank": args.rank, "slots": args.slots, "publishes": args.publishes,
        "full_bytes": len(full), "adapter_bytes": adapter_bytes, "bytes_ratio": round(len(full) / adapter_bytes, 1),
        "full_s_median": round(statistics.median(full_s), 4), "adapter_s_median": round(statistics.median(adapter_s), 4),
        "time_ratio": round(statistics.median(full_s) / statistics.median(adapter_s), 1),
    }))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
