"""`clawr1 export CKPT OUT_DIR`: a trainer checkpoint as an HF safetensors directory any server can load."""
from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoConfig

from clawr1.trainer.checkpoint import read_meta
from clawr1.trainer.convert import ArchSpec, from_te_names, megatron_to_hf
from clawr1.trainer.hf_io import write_weights_dir


def export_checkpoint(ckpt: Path, out_dir: Path) -> Path:
    """Merge the TP shards of data-parallel rank 0 (ranks 0..tp-1) and write HF weights, config and tokenizer."""
    ckpt = Path(ckpt)
    if not (ckpt / "meta.json").exists():
        raise FileNotFoundError(f"{ckpt} is not a clawr1 checkpoint (no meta.json); pick RUN_DIR/checkpoints/stepNNNNNN")
    meta = read_meta(ckpt)
    base = Path(meta.base_model)
    arch = ArchSpec.from_hf(AutoConfig.from_pretrained(base))
    shards = []
    for rank in range(meta.tp):
        state = torch.load(ckpt / f"rank{rank:03d}.pt", map_location="cpu", weights_only=False)["model"]
        shards.append(from_te_names(state))
    return write_weights_dir(megatron_to_hf(shards, arch), Path(out_dir), copy_from=base)
