"""`clawr1 export CKPT OUT_DIR`: a trainer checkpoint as an HF safetensors directory any server can load
(a LoRA checkpoint: PEFT adapters, adapter_config.json + adapter_model.safetensors, on the base model)."""
from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoConfig

from clawr1.trainer.checkpoint import CheckpointMeta, read_meta
from clawr1.trainer.convert import ArchSpec, from_te_names, megatron_to_hf
from clawr1.trainer.hf_io import write_weights_dir
from clawr1.trainer.lora import LoraShape, peft_config, peft_tensors, slot_tensors, write_peft_adapter


def export_checkpoint(ckpt: Path, out_dir: Path) -> Path:
    """Merge the TP shards of data-parallel rank 0 (ranks 0..tp-1) and write HF weights, config and tokenizer."""
    ckpt = Path(ckpt)
    if not (ckpt / "meta.json").exists():
        raise FileNotFoundError(f"{ckpt} is not a clawr1 checkpoint (no meta.json); pick RUN_DIR/checkpoints/stepNNNNNN")
    meta = read_meta(ckpt)
    base = Path(meta.base_model)
    arch = ArchSpec.from_hf(AutoConfig.from_pretrained(base))
    shards = [torch.load(ckpt / f"rank{rank:03d}.pt", map_location="cpu", weights_only=False)["model"]
              for rank in range(meta.tp)]
    if meta.lora:
        return export_adapters(shards, meta, arch, Path(out_dir))
    return write_weights_dir(megatron_to_hf([from_te_names(s) for s in shards], arch), Path(out_dir), copy_from=base)


def export_adapters(shards: list[dict[str, torch.Tensor]], meta: CheckpointMeta, arch: ArchSpec, out_dir: Path) -> Path:
    """A LoRA checkpoint as PEFT adapters: OUT_DIR itself for one slot, OUT_DIR/slotK for each of several."""
    shape = LoraShape(rank=meta.lora["rank"], alpha=meta.lora["alpha"], targets=tuple(meta.lora["targets"]),
                      slots=meta.lora["slots"])
    for slot in range(shape.slots):
        per_rank = [slot_tensors(s, slot, arch.num_layers, shape.targets) for s in shards]
        where = out_dir if shape.slots == 1 else out_dir / f"slot{slot}"
        write_peft_adapter(where, peft_tensors(per_rank, arch, shape.targets), peft_config(shape, meta.base_model))
    return out_dir
