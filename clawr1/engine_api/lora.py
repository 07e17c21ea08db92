"""LoRA adapter endpoints, as each engine takes them (docs/sglang_api_notes.md §6b).

SGLang (read in its 0.5.15.post1, 0.5.16, 0.5.17 and 0.5.23 wheels):
- POST /load_lora_adapter {lora_name, lora_path, pinned}: a PEFT directory the engine can read;
- POST /load_lora_adapter_from_tensors {lora_name, config_dict, ...}: the tensors in the request, pickled by
  torch's ForkingPickler (MultiprocessingSerializer), so only an engine on the same machine can read them.
  Up to 0.5.16 one base64 string `serialized_tensors`; from 0.5.17 on `serialized_named_tensors`, one
  base64 copy per engine TP rank;
- POST /unload_lora_adapter {lora_name}; every reply is {success, error_message, loaded_adapters}, HTTP 400
  when success is false (a name already loaded, an unknown name);
- /generate takes `lora_path`: the adapter's name, or one per prompt.
clawr1's embedded engine takes the 0.5.17+ shape with base64 safetensors entries (`load_format: "safetensors"`).
"""
from __future__ import annotations

import base64
import io
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from clawr1.runtime import write_atomically

if TYPE_CHECKING:  # torch only for the annotations: the gateway imports this module and never torch
    from torch import Tensor

SERIALIZED_LIST_SINCE = (0, 5, 17)  # the first SGLang with serialized_named_tensors (a list, one per TP rank)


# the HF modules each Megatron target of lora.targets adapts (fused qkv and gate/up are split for serving)
HF_MODULES_OF_TARGET = {"linear_qkv": ("q_proj", "k_proj", "v_proj"), "linear_proj": ("o_proj",),
                        "linear_fc1": ("gate_proj", "up_proj"), "linear_fc2": ("down_proj",)}


def adapter_name(slot: int, version: int) -> str:
    """The name the engines serve adapter slot `slot` of weight version `version` under (trainer, gateway, engine)."""
    return f"slot{slot}@v{version}"


def adapter_version(name: str) -> Optional[int]:
    """N of a name `adapter_name` made (`slotK@vN`); None for any other name."""
    m = re.fullmatch(r"slot\d+@v(\d+)", name)
    return int(m.group(1)) if m else None


def write_current(directory: Path, version: int, slots: list[int]) -> None:
    """RUN_DIR/adapters/current.json: the newest published adapters (the trainer writes it aside, then renames)."""
    write_atomically(directory / "current.json", json.dumps({"version": version, "slots": slots}))


def read_current(directory: Path) -> Optional[dict]:
    """{"version", "slots"} of the newest published adapters; None before the first publish."""
    try:
        current = json.loads((directory / "current.json").read_text())
        return {"version": int(current["version"]), "slots": [int(s) for s in current["slots"]]}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def published_adapters(cfg) -> dict[str, Any]:
    """For a run's summary.json: the version of the adapters the engines serve at the end (lora.sync=adapter)."""
    if not cfg.lora.serves_adapters:
        return {}
    current = read_current(cfg.run_dir / "adapters")
    return {"adapter_version": current["version"] if current else None}


def load_from_disk_payload(name: str, path: str, pinned: bool = False) -> dict[str, Any]:
    return {"lora_name": name, "lora_path": path, "pinned": pinned}


def unload_payload(name: str) -> dict[str, Any]:
    return {"lora_name": name}


def safetensors_b64(tensors: dict[str, Tensor]) -> str:
    from safetensors.torch import save

    return base64.b64encode(save({k: v.detach().cpu().contiguous() for k, v in tensors.items()})).decode()


def pickled_b64(tensors: dict[str, Tensor]) -> str:
    """SGLang's MultiprocessingSerializer.serialize(tensors, output_str=True): a ForkingPickler dump, base64."""
    from multiprocessing.reduction import ForkingPickler

    buffer = io.BytesIO()
    ForkingPickler(buffer).dump({k: v.detach().cpu().contiguous() for k, v in tensors.items()})
    return base64.b64encode(buffer.getvalue()).decode()


def load_from_tensors_payload(name: str, config: dict[str, Any], tensors: dict[str, Tensor], *, embedded: bool,
                              release: Optional[tuple[int, int, int]] = None, tp_size: int = 1) -> dict[str, Any]:
    """The /load_lora_adapter_from_tensors body for clawr1's embedded engine, or an SGLang release."""
    if embedded:
        return {"lora_name": name, "config_dict": config, "serialized_named_tensors": [safetensors_b64(tensors)],
                "load_format": "safetensors"}
    if release is not None and release < SERIALIZED_LIST_SINCE:
        return {"lora_name": name, "config_dict": config, "serialized_tensors": pickled_b64(tensors)}
    # one dump per rank: each holds its own shared-memory handles, which can be taken only once
    return {"lora_name": name, "config_dict": config,
            "serialized_named_tensors": [pickled_b64(tensors) for _ in range(tp_size)]}
