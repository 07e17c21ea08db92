"""Reading and writing HF-format weight directories (safetensors), atomically."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch
from torch import Tensor


def load_hf_state(path: Path) -> dict[str, Tensor]:
    from safetensors.torch import load_file

    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {path}")
    state: dict[str, Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    return state


def write_weights_dir(state: dict[str, Tensor], out_dir: Path, copy_from: Path | None = None) -> Path:
    """Write `model.safetensors` (plus config/tokenizer files from `copy_from`) to out_dir, atomically.

    The directory appears under its final name only when complete, so a reader
    never sees half a checkpoint.
    """
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if copy_from is not None:
        for f in Path(copy_from).iterdir():
            if f.is_file() and not f.name.endswith(".safetensors") and f.name != "model.safetensors.index.json":
                shutil.copy2(f, tmp / f.name)
    save_file({k: v.detach().to("cpu").contiguous() for k, v in state.items()}, str(tmp / "model.safetensors"),
              metadata={"format": "pt"})
    if out_dir.exists():
        shutil.rmtree(out_dir)
    os.replace(tmp, out_dir)
    return out_dir


def dtype_of(name: str) -> torch.dtype:
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]
