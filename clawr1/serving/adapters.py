"""LoRA adapters in the embedded engine: many adapters on one base model, picked per request (`lora_path`).

An adapter arrives in PEFT's format (adapter_config.json's fields plus `base_model.model.<module>.lora_A.weight`
and `lora_B.weight` tensors) and is kept as (A, B) per HF linear module. Forward hooks on those modules add
scale * B A x to the rows of a batch whose request uses the adapter; rows of other adapters get theirs, rows
without one see the base alone. A request's adapter is fixed for its whole life, and a request's KV cache is
computed by its own adapter (the engine keeps no KV across requests, so there is no cache to key by adapter).

Names follow SGLang: loading a name that is loaded fails, and an adapter being unloaded takes no new requests
but serves its in-flight ones to the end. A name ending in `@vN` gives the adapter weight version N, which the
tokens it samples carry (clawr1's trainer publishes `<adapter>@v<step>`).
"""
from __future__ import annotations

import contextlib
import json
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional

import torch
from torch import Tensor

from clawr1.engine_api.lora import HF_MODULES_OF_TARGET

LORA_MODULES = tuple(m for modules in HF_MODULES_OF_TARGET.values() for m in modules)  # q_proj, ..., down_proj
_PEFT_PREFIX = "base_model.model."


class AdapterError(ValueError):
    """An adapter request the engine refuses (the HTTP layer answers 400)."""


def adapter_version(name: str) -> Optional[int]:
    """N of a name ending in `@vN`; None for any other name."""
    m = re.search(r"@v(\d+)$", name)
    return int(m.group(1)) if m else None


@dataclass
class Adapter:
    name: str
    scale: float
    weights: dict[str, tuple[Tensor, Tensor]]  # HF module name -> (A [rank, in], B [out, rank])
    source: str = "__tensor__"  # the directory it was loaded from, as SGLang reports it
    in_flight: int = 0
    draining: bool = False
    version: Optional[int] = field(init=False)  # the name's @vN, read once (every sampled token carries it)

    def __post_init__(self) -> None:
        self.version = adapter_version(self.name)


def _linear_modules(model: torch.nn.Module) -> dict[str, torch.nn.Linear]:
    return {name: m for name, m in model.named_modules()
            if isinstance(m, torch.nn.Linear) and name.rsplit(".", 1)[-1] in LORA_MODULES}


def build_adapter(name: str, config: dict[str, Any], tensors: dict[str, Tensor], model: torch.nn.Module,
                  max_rank: int, source: str = "__tensor__") -> Adapter:
    """Check a PEFT adapter against the base model and keep its (A, B) pairs (in the model's dtype)."""
    if not isinstance(name, str) or not name or len(name) > 256:
        raise AdapterError("lora_name must be a non-empty string of at most 256 characters")
    if not isinstance(config, dict):
        raise AdapterError("config_dict must be an object (PEFT's adapter_config.json)")
    if config.get("peft_type", "LORA") != "LORA" or config.get("use_dora"):
        raise AdapterError(f"only plain LoRA adapters are served (peft_type {config.get('peft_type')!r}, "
                           f"use_dora {config.get('use_dora')!r})")
    rank, alpha = config.get("r"), config.get("lora_alpha")
    if not isinstance(rank, int) or isinstance(rank, bool) or not 1 <= rank <= max_rank:
        raise AdapterError(f"config_dict.r must be an integer in [1, {max_rank}] (serve.max_lora_rank), got {rank!r}")
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool):
        raise AdapterError(f"config_dict.lora_alpha must be a number, got {alpha!r}")
    scale = alpha / (rank ** 0.5 if config.get("use_rslora") else rank)
    modules = _linear_modules(model)
    halves: dict[str, dict[str, Tensor]] = {}
    for key, tensor in tensors.items():
        m = re.fullmatch(r"(?:base_model\.model\.)?(.+)\.lora_([AB])(?:\.default)?\.weight", key)
        if m is None or m.group(1) not in modules:
            raise AdapterError(f"tensor {key!r} names no LoRA-capable linear module of this model "
                               f"(expected {_PEFT_PREFIX}model.layers.N.self_attn.q_proj.lora_A.weight and the like)")
        halves.setdefault(m.group(1), {})[m.group(2)] = tensor
    if not halves:
        raise AdapterError("the adapter has no tensors")
    dtype = next(model.parameters()).dtype
    weights = {}
    for module, pair in halves.items():
        if set(pair) != {"A", "B"}:
            raise AdapterError(f"{module}: needs both lora_A and lora_B")
        linear = modules[module]
        a, b = pair["A"], pair["B"]
        if tuple(a.shape) != (rank, linear.in_features) or tuple(b.shape) != (linear.out_features, rank):
            raise AdapterError(f"{module}: lora_A {tuple(a.shape)} and lora_B {tuple(b.shape)} do not fit a rank-{rank} "
                               f"adapter of a {linear.in_features} -> {linear.out_features} linear")
        if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
            raise AdapterError(f"{module}: the adapter holds inf or nan")
        weights[module] = (a.detach().to(dtype).contiguous(), b.detach().to(dtype).contiguous())
    return Adapter(name=name, scale=float(scale), weights=weights, source=source)


def read_peft_dir(path: str) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """adapter_config.json and adapter_model.safetensors of a PEFT directory."""
    from safetensors.torch import load_file

    d = Path(path)
    config_file, weights_file = d / "adapter_config.json", d / "adapter_model.safetensors"
    if not config_file.is_file() or not weights_file.is_file():
        raise AdapterError(f"{path} is not a PEFT adapter directory (needs adapter_config.json and "
                           f"adapter_model.safetensors)")
    try:
        return json.loads(config_file.read_text()), load_file(str(weights_file))
    except (OSError, ValueError) as e:
        raise AdapterError(f"cannot read the adapter in {path}: {e}") from None


@dataclass
class AdapterBank:
    """The adapters one engine holds, and the hooks that add each batch row's adapter to the base's linears."""

    model: torch.nn.Module
    max_loras: int
    max_rank: int
    adapters: dict[str, Adapter] = field(default_factory=dict)
    _rows: Optional[list[Optional[Adapter]]] = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        for name, module in _linear_modules(self.model).items():
            module.register_forward_hook(self._hook(name))

    # ------------------------------------------------------------ registry (any thread)
    def add(self, adapter: Adapter) -> None:
        with self._lock:
            if adapter.name in self.adapters:
                raise AdapterError(f"the LoRA adapter {adapter.name!r} is already loaded; unload it first or load "
                                   f"under another name")
            if len(self.adapters) >= self.max_loras:
                raise AdapterError(f"{len(self.adapters)} LoRA adapters are loaded, the most this engine holds "
                                   f"(serve.max_loras); unload one first")
            self.adapters[adapter.name] = adapter

    def acquire(self, name: str) -> Adapter:
        """The adapter a new request uses, counted in flight until `release`."""
        with self._lock:
            adapter = self.adapters.get(name)
            if adapter is None or adapter.draining:
                state = "is being unloaded" if adapter is not None else "is not loaded"
                raise AdapterError(f"the LoRA adapter {name!r} {state}; loaded: {self._names()}")
            adapter.in_flight += 1
            return adapter

    def release(self, adapter: Adapter) -> None:
        with self._lock:
            adapter.in_flight -= 1

    def start_draining(self, name: str) -> Adapter:
        with self._lock:
            adapter = self.adapters.get(name)
            if adapter is None:
                raise AdapterError(f"the LoRA adapter {name!r} is not loaded; loaded: {self._names()}")
            adapter.draining = True
            return adapter

    def remove_if_idle(self, adapter: Adapter) -> bool:
        with self._lock:
            if adapter.in_flight:
                return False
            self.adapters.pop(adapter.name, None)
            return True

    def loaded(self) -> dict[str, str]:
        with self._lock:
            return {n: a.source for n, a in self.adapters.items() if not a.draining}

    def _names(self) -> list[str]:
        return sorted(n for n, a in self.adapters.items() if not a.draining)

    # ------------------------------------------------------------ forward (scheduler thread)
    @contextlib.contextmanager
    def use(self, rows: list[Optional[Adapter]]) -> Iterator[None]:
        """Within the block, batch row i uses rows[i] (one entry: every row, as in a prefill)."""
        self._rows = rows if any(a is not None for a in rows) else None
        try:
            yield
        finally:
            self._rows = None

    def _hook(self, module_name: str):
        def add_lora(module, args, out):
            rows = self._rows
            if rows is None:
                return out
            x = args[0]
            flat, flat_out = x.reshape(-1, x.shape[-1]), out.reshape(-1, out.shape[-1]).clone()
            for adapter, index in _groups(rows, flat.shape[0]):
                pair = adapter.weights.get(module_name)
                if pair is None:
                    continue
                a, b = pair
                xs = flat if index is None else flat[index]
                delta = (xs @ a.t()) @ b.t() * adapter.scale
                if index is None:
                    flat_out += delta
                else:
                    flat_out[index] += delta
            return flat_out.view(out.shape)

        return add_lora


def _groups(rows: list[Optional[Adapter]], n: int) -> list[tuple[Adapter, Optional[Tensor]]]:
    """(adapter, the flat rows using it; None: all rows) for each adapter in the batch."""
    if len(rows) == 1:
        return [(rows[0], None)]
    if len(rows) != n:
        raise RuntimeError(f"{len(rows)} adapter rows for a batch of {n}")
    by_adapter: dict[int, tuple[Adapter, list[int]]] = {}
    for i, adapter in enumerate(rows):
        if adapter is not None:
            by_adapter.setdefault(id(adapter), (adapter, []))[1].append(i)
    return [(adapter, torch.tensor(index)) for adapter, index in by_adapter.values()]
