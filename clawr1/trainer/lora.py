"""LoRA adapters on the Megatron policy, one or more per run (one per user with lora.per_user).

Each targeted linear W of every layer gets, per adapter slot k, a pair (A_k, B_k) and computes

    y = W x + (alpha / rank) * B_k A_k x

for the tokens routed to slot k (`LoraAdapters.route`); tokens routed to -1 see the base alone. B starts
at zero, so a fresh adapter is the base model. The base stays frozen and the adapters live outside the
GPTModel (forward hooks add the low-rank term), so the model's state dict and the full-weight conversion
are untouched.

Tensor parallelism follows the base layer's split:
- column-parallel base (linear_qkv, linear_fc1; output split): A is replicated, B is split on its output rows.
  The rank-r activation A x passes `copy_to_tensor_model_parallel_region`, so its gradient is summed
  over the TP ranks that each saw part of the output;
- row-parallel base (linear_proj, linear_fc2; input split): A is split on its input columns and B is
  replicated; the partial A x is summed over TP ranks (`reduce_from_tensor_model_parallel_region`).

Every slot's A is drawn from one seeded generator as the full matrix and then split, so any TP layout
starts from the same adapter.
"""
from __future__ import annotations

import contextlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

import torch
from torch import Tensor

from clawr1.engine_api.lora import HF_MODULES_OF_TARGET
from clawr1.trainer.convert import ArchSpec, split_qkv

TARGETS = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")
COLUMN_PARALLEL = {"linear_qkv", "linear_fc1"}
_SUBMODULE = {"linear_qkv": "self_attention", "linear_proj": "self_attention", "linear_fc1": "mlp", "linear_fc2": "mlp"}
_HF_PARENT = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
              "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}


def full_shape(a: ArchSpec, target: str) -> tuple[int, int]:
    """(out_features, in_features) of a target's whole (unsplit) weight."""
    attention = a.heads * a.head_dim
    return {
        "linear_qkv": ((a.heads + 2 * a.kv_heads) * a.head_dim, a.hidden),
        "linear_proj": (a.hidden, attention),
        "linear_fc1": (2 * a.ffn, a.hidden),
        "linear_fc2": (a.hidden, a.ffn),
    }[target]


@dataclass(frozen=True)
class LoraShape:
    rank: int
    alpha: float
    targets: tuple[str, ...]
    slots: int

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    def __post_init__(self) -> None:
        unknown = sorted(set(self.targets) - set(TARGETS))
        if unknown or not self.targets:
            raise ValueError(f"lora.targets must be a non-empty subset of {list(TARGETS)}, got {list(self.targets)}")
        if self.rank < 1 or self.slots < 1:
            raise ValueError(f"lora.rank and lora.slots must be >= 1, got {self.rank} and {self.slots}")


def _initial_a(seed: int, layer: int, target: str, shape: tuple[int, int]) -> Tensor:
    """PEFT's default A: kaiming-uniform with a = sqrt(5), i.e. U(-1/sqrt(in), 1/sqrt(in))."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + layer * len(TARGETS) + TARGETS.index(target))
    bound = 1.0 / math.sqrt(shape[1])
    return (torch.rand(shape, generator=g, dtype=torch.float64) * 2 - 1).mul_(bound).float()


def _rms_norm_input(module: torch.nn.Module, x: Tensor, eps: float) -> Tensor:
    """What a TransformerEngine LayerNorm+Linear module feeds its matmul: its fused RMSNorm of x."""
    w = module.layer_norm_weight
    return (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


class LoraAdapters(torch.nn.Module):
    """The adapters of every slot, and the hooks that add them to a Megatron GPTModel's linears."""

    def __init__(self, model: torch.nn.Module, arch: ArchSpec, shape: LoraShape, tp: int, tp_rank: int, seed: int = 0):
        super().__init__()
        self.shape, self.tp, self.tp_rank, self.arch, self.seed = shape, tp, tp_rank, arch, seed
        self.a = torch.nn.ParameterDict()
        self.b = torch.nn.ParameterDict()
        self._token_slots: Optional[Tensor] = None
        self._hooks = []
        for layer in range(arch.num_layers):
            for target in shape.targets:
                out_f, in_f = full_shape(arch, target)
                a_full = _initial_a(seed, layer, target, (shape.rank, in_f))
                column = target in COLUMN_PARALLEL
                a_local = a_full if column else a_full.chunk(tp, dim=1)[tp_rank]
                b_rows = out_f // tp if column else out_f
                for slot in range(shape.slots):
                    key = self.key(layer, target, slot)
                    self.a[key] = torch.nn.Parameter(a_local.clone())
                    self.b[key] = torch.nn.Parameter(torch.zeros(b_rows, shape.rank))
                    # the grad-norm clip counts split tensors once per TP rank, replicated ones once
                    sharded = self.b[key] if column else self.a[key]
                    sharded.tensor_model_parallel = tp > 1
                module = getattr(getattr(model.decoder.layers[layer], _SUBMODULE[target]), target)
                self._hooks.append(module.register_forward_hook(self._hook(layer, target)))

    @staticmethod
    def key(layer: int, target: str, slot: int) -> str:
        return f"{layer}_{target}_{slot}"

    def reset_slot(self, slot: int, seed: Optional[int] = None, rank: int = 0) -> None:
        """A slot back to a fresh adapter: A initialized from `seed` (None: the adapters' own), B = 0 (so it
        changes nothing), no gradients. With `rank` below the slot's, A's rows past it are zero: with B's
        columns past it zero too, neither gets a gradient, so the adapter stays of that rank."""
        seed = self.seed if seed is None else seed
        with torch.no_grad():
            for layer in range(self.arch.num_layers):
                for target in self.shape.targets:
                    key = self.key(layer, target, slot)
                    a_full = _initial_a(seed, layer, target, (self.shape.rank, full_shape(self.arch, target)[1]))
                    column = target in COLUMN_PARALLEL
                    self.a[key].copy_(a_full if column else a_full.chunk(self.tp, dim=1)[self.tp_rank])
                    if rank:
                        self.a[key][rank:].zero_()
                    self.b[key].zero_()
                    self.a[key].grad = self.b[key].grad = None

    def slot_parameters(self, slot: int) -> list[torch.nn.Parameter]:
        suffix = f"_{slot}"
        return [p for store in (self.a, self.b) for k, p in store.items() if k.endswith(suffix)]

    @contextlib.contextmanager
    def route(self, token_slots: Optional[Tensor]) -> Iterator[None]:
        """Within the block, token t of the packed row uses slot token_slots[t] (-1: the base alone).
        Outside any `route` block every token uses slot 0."""
        previous, self._token_slots = self._token_slots, token_slots
        try:
            yield
        finally:
            self._token_slots = previous

    def remove(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks.clear()

    # ------------------------------------------------------------ forward
    def _hook(self, layer: int, target: str):
        def add_lora(module, args, output):
            x = args[0]
            if hasattr(module, "layer_norm_weight"):  # TE fuses the pre-norm into qkv and fc1
                x = _rms_norm_input(module, x, self.arch.norm_eps)
            out, bias = output
            return out + self._delta(layer, target, x, out.shape), bias

        return add_lora

    def _groups(self, rows: int) -> list[tuple[int, Optional[Tensor]]]:
        """(slot, the flat token rows using it; None: all rows) for every slot this forward uses."""
        slots = self._token_slots
        if slots is None:
            return [(0, None)]
        slots = slots.to(self.a[self.key(0, self.shape.targets[0], 0)].device)
        if slots.numel() != rows:
            raise ValueError(f"lora routing has {slots.numel()} token slots for {rows} tokens")
        present = [int(k) for k in torch.unique(slots).tolist() if k >= 0]
        if len(present) == 1 and bool((slots == present[0]).all()):
            return [(present[0], None)]
        return [(k, (slots == k).nonzero().squeeze(1)) for k in present]

    def _delta(self, layer: int, target: str, x: Tensor, out_shape: torch.Size) -> Tensor:
        from megatron.core.tensor_parallel import (copy_to_tensor_model_parallel_region,
                                                   reduce_from_tensor_model_parallel_region)

        # in the wider of the adapters' dtype (fp32) and the base's: over a bf16 base only the base's products
        # round to bf16
        dtype = torch.promote_types(x.dtype, self.a[self.key(layer, target, 0)].dtype)
        flat = x.reshape(-1, x.shape[-1]).to(dtype)
        groups = self._groups(flat.shape[0])
        whole = len(groups) == 1 and groups[0][1] is None  # every token in one slot: no zeros to scatter into
        delta = None if whole else flat.new_zeros(flat.shape[0], out_shape[-1])
        for slot, rows in groups:
            key = self.key(layer, target, slot)
            a, b = self.a[key].to(dtype), self.b[key].to(dtype)
            h = (flat if rows is None else flat.index_select(0, rows)) @ a.t()
            if target in COLUMN_PARALLEL:
                h = copy_to_tensor_model_parallel_region(h) if self.tp > 1 else h
            else:
                h = reduce_from_tensor_model_parallel_region(h) if self.tp > 1 else h
            y = (h @ b.t()) * self.shape.scale
            delta = y if rows is None else delta.index_add(0, rows, y)
        return delta.view(out_shape).to(x.dtype)

    # ------------------------------------------------------------ weights
    def local_delta(self, layer: int, target: str, slot: int) -> Tensor:
        """scale * B A on this rank (in float64): the slot's change of the target's local weight shard."""
        key = self.key(layer, target, slot)
        return (self.b[key].detach().double() @ self.a[key].detach().double()).mul_(self.shape.scale)

    def host_state(self, slot: int) -> dict[str, tuple[Tensor, Tensor]]:
        """This rank's (A, B) of one slot, per `layer_target` (for export)."""
        state = {k: v.detach().cpu() for k, v in self.state_dict().items()}
        return slot_tensors(state, slot, self.arch.num_layers, self.shape.targets)


def slot_tensors(state: dict[str, Tensor], slot: int, num_layers: int,
                 targets: tuple[str, ...]) -> dict[str, tuple[Tensor, Tensor]]:
    """One slot's (A, B) per `layer_target`, from an adapters state dict (as a checkpoint holds it)."""
    key = LoraAdapters.key
    return {f"{layer}_{target}": (state[f"a.{key(layer, target, slot)}"], state[f"b.{key(layer, target, slot)}"])
            for layer in range(num_layers) for target in targets}


def merge_into(state: dict[str, Tensor], adapters: LoraAdapters, slot: int) -> dict[str, Tensor]:
    """A megatron (local-spec, this rank's shard) state with a slot's adapter added into its base weights."""
    merged = dict(state)
    for layer in range(adapters.arch.num_layers):
        for target in adapters.shape.targets:
            name = f"decoder.layers.{layer}.{_SUBMODULE[target]}.{target}.weight"
            delta = adapters.local_delta(layer, target, slot)
            merged[name] = (state[name].double() + delta.to(state[name].device)).to(state[name].dtype)
    return merged


# ---------------------------------------------------------------- PEFT export
def peft_tensors(shards: list[dict[str, tuple[Tensor, Tensor]]], arch: ArchSpec,
                 targets: tuple[str, ...]) -> dict[str, Tensor]:
    """All TP ranks' (A, B) of one slot (rank order) -> PEFT's tensors under HF module names.

    Fused weights split as the full-weight conversion splits them: qkv's B rows by query group into
    q, k and v, fc1's B into gate and up; the shared A goes to each part unchanged."""
    tp = len(shards)
    out: dict[str, Tensor] = {}
    for layer in range(arch.num_layers):
        for target in targets:
            parts = [s[f"{layer}_{target}"] for s in shards]
            if target in COLUMN_PARALLEL:
                a = parts[0][0]
                if target == "linear_qkv":
                    split = [split_qkv(b, arch, arch.kv_heads // tp) for _, b in parts]
                else:
                    split = [b.chunk(2, dim=0) for _, b in parts]
                bs = [torch.cat([p[j] for p in split], dim=0) for j in range(len(HF_MODULES_OF_TARGET[target]))]
            else:
                a = torch.cat([p[0] for p in parts], dim=1)
                bs = [parts[0][1]]
            for hf_name, b in zip(HF_MODULES_OF_TARGET[target], bs):
                prefix = f"base_model.model.model.layers.{layer}.{_HF_PARENT[hf_name]}.{hf_name}"
                out[f"{prefix}.lora_A.weight"] = a.contiguous().clone()
                out[f"{prefix}.lora_B.weight"] = b.contiguous().clone()
    return out


def peft_config(shape: LoraShape, base_model: str) -> dict:
    return {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model,
        "r": shape.rank, "lora_alpha": shape.alpha, "lora_dropout": 0.0, "bias": "none",
        "target_modules": sorted(m for t in shape.targets for m in HF_MODULES_OF_TARGET[t]),
        "fan_in_fan_out": False, "use_rslora": False, "use_dora": False, "init_lora_weights": True,
        "inference_mode": True,
    }


def write_peft_adapter(directory: Path, tensors: dict[str, Tensor], config: dict) -> Path:
    """adapter_config.json + adapter_model.safetensors, as `peft.PeftModel.from_pretrained` reads them."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(directory / "adapter_model.safetensors"))
    (directory / "adapter_config.json").write_text(json.dumps(config, indent=1))
    return directory
