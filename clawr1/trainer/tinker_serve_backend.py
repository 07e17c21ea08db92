"""The machine behind `clawr1 tinker-serve`: Tinker's training calls on clawr1's Megatron trainer, its sampling
calls on clawr1's engine (`clawr1/tinker_serve/backend.py` is the contract, `clawr1/tinker_serve/server.py` the wire).

- The base model is frozen; every Tinker training client owns one LoRA slot (`lora.slots` of them, rank
  `lora.rank`) and an AdamW over that slot's adapters alone.
- `forward_backward` packs the datums in one row (each token through its model's slot), scores each target
  token (position i of `model_input` predicts `target_tokens[i]`), and sums Tinker's loss
  (`clawr1/algo/tinker_serve_losses.py`); the gradients accumulate until `optim_step`.
- Saving weights for the sampler writes the slot's adapter as a PEFT directory under
  RUN_DIR/tinker/sampler_weights/ and loads it into the engine under its own name; sampling names it.
  The engine holds `serve.max_loras` adapters: the least recently used ones are unloaded and loaded back
  from their directory when sampled again.
- `save_state` writes the slot's adapters and AdamW state to RUN_DIR/tinker/weights/NAME.pt.
"""
from __future__ import annotations

import logging
import math
import shutil
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from clawr1.algo.tinker_serve_losses import LossInputError, check_loss_call, tinker_loss
from clawr1.config import Config
from clawr1.engine_api.client import SERVER_INFO_PATHS, SyncEngineClient
from clawr1.model_path import resolve_model_path
from clawr1.tinker_serve.backend import (Datum, ForwardBackwardResult, ModelInfo, SampledSequence, SampleResult,
                                   TinkerRequestError)
from clawr1.trainer.lora import LoraAdapters, LoraShape, peft_config, peft_tensors, write_peft_adapter
from clawr1.trainer.megatron_setup import init_parallel
from clawr1.trainer.model import Packed, Policy, build_policy, hidden_states, logprobs_and_entropy

log = logging.getLogger("clawr1.tinker")
TINKER_SCHEME = "tinker://"


class MegatronTinkerBackend:
    """Tinker training clients as LoRA slots of one frozen base; sampling through the engine at `engine_url`."""

    def __init__(self, cfg: Config, engine_url: str):
        if not (cfg.lora.enabled and cfg.lora.per_user and cfg.lora.sync == "adapter"):
            raise ValueError("clawr1 tinker-serve trains one adapter per training client: set lora.enabled=true, "
                             "lora.per_user=true, lora.sync=adapter (recipes/tinker/serve_cpu.yaml does)")
        self.cfg = cfg
        self.model_path = resolve_model_path(cfg.model)
        self.root = cfg.run_dir / "tinker"
        torch.set_num_threads(cfg.trainer.num_threads)
        init_parallel(1, seed=cfg.run.seed)
        self.policy = build_policy(self.model_path)
        self.policy.model.requires_grad_(False)
        lc = cfg.lora
        self.shape = LoraShape(rank=lc.slot_rank, alpha=lc.alpha, targets=tuple(lc.targets), slots=lc.slots)
        self.policy.lora = LoraAdapters(self.policy.model, self.policy.arch, self.shape, 1, 0, seed=lc.init_seed)
        self.slot_of: dict[str, int] = {}
        self.ranks: dict[str, int] = {}  # each client's rank: the first components of its slot
        self.optimizers: dict[str, torch.optim.AdamW] = {}
        self.saves: dict[str, int] = {}
        self.engine = SyncEngineClient(engine_url)
        self.max_context = engine_context_length(self.engine)
        self.loaded: OrderedDict[str, Path] = OrderedDict()  # adapters in the engine, least recently used first
        self.engine_lock = threading.Lock()

    # -- models
    def info(self) -> ModelInfo:
        return ModelInfo(model_name=self.cfg.tinker.model_name or self.model_path.name,
                         tokenizer_dir=str(self.model_path.resolve()), lora_rank=self.shape.rank,
                         arch=self.policy.arch.family, max_context=self.max_context)

    def create_model(self, model_id: str, base_model: str, rank: int, seed: Optional[int]) -> None:
        served = self.info().model_name
        if base_model not in (served, str(self.model_path)):
            raise TinkerRequestError(f"this server trains {served!r}, not {base_model!r}")
        if not 1 <= rank <= self.shape.rank:
            raise TinkerRequestError(f"LoRA rank {rank} is not served: this server trains ranks 1 to {self.shape.rank} "
                                     f"(lora.max_rank)")
        free = sorted(set(range(self.shape.slots)) - set(self.slot_of.values()))
        if not free:
            raise TinkerRequestError(f"all {self.shape.slots} training slots are taken (lora.slots)")
        slot = free[0]
        self.policy.lora.reset_slot(slot, seed, rank)  # a slot a released client trained starts afresh
        self.slot_of[model_id] = slot
        self.ranks[model_id] = rank
        self.optimizers[model_id] = torch.optim.AdamW(self.policy.lora.slot_parameters(slot), lr=1e-4)
        log.info("training client %s: LoRA slot %d, rank %d", model_id, slot, rank)

    def release_model(self, model_id: str) -> None:
        slot = self.slot_of.pop(model_id, None)
        self.optimizers.pop(model_id, None)
        self.ranks.pop(model_id, None)
        if slot is not None:
            log.info("training client %s released LoRA slot %d", model_id, slot)

    def _slot(self, model_id: str) -> int:
        if model_id not in self.slot_of:
            raise TinkerRequestError(f"unknown model_id {model_id!r}")
        return self.slot_of[model_id]

    # -- training
    def forward_backward(self, model_id: str, data: list[Datum], loss_fn: str, loss_fn_config: dict[str, float],
                         forward_only: bool) -> ForwardBackwardResult:
        slot = self._slot(model_id)
        if not data:
            raise TinkerRequestError("forward_backward needs at least one datum")
        try:
            for datum in data:
                check_loss_call(loss_fn, set(datum.inputs), loss_fn_config)
        except LossInputError as e:
            raise TinkerRequestError(str(e)) from None
        inputs = [self._tensors(d) for d in data]
        packed = self._pack(data, [t["target_tokens"] for t in inputs], slot)
        with torch.set_grad_enabled(not forward_only):
            hidden = hidden_states(self.policy, packed)[packed.predict_at]
            logprobs, _, _ = logprobs_and_entropy(self.policy, hidden, packed.targets)
            per_datum = torch.split(logprobs, [len(d.tokens) for d in data])
            loss = sum(tinker_loss(loss_fn, lp, t, loss_fn_config) for lp, t in zip(per_datum, inputs))
            if not forward_only:
                loss.backward()
        logprobs_out = [lp.detach().float().numpy() for lp in per_datum]
        return ForwardBackwardResult(logprobs_out, {"loss:sum": float(loss.detach())})

    def _tensors(self, datum: Datum) -> dict[str, torch.Tensor]:
        n = len(datum.tokens)
        out = {}
        for name, array in datum.inputs.items():
            if array.shape != (n,):
                raise TinkerRequestError(f"loss_fn_inputs[{name!r}] has shape {array.shape}; model_input has {n} "
                                         f"tokens, so it must be ({n},)")
            out[name] = torch.from_numpy(np.ascontiguousarray(array))
        out["target_tokens"] = out["target_tokens"].long()
        return out

    def _pack(self, data: list[Datum], targets: list[torch.Tensor], slot: int) -> Packed:
        """Every datum end to end; every position predicts its target; every token goes through `slot`."""
        vocab, longest = self.policy.arch.vocab, self.policy.arch.max_positions
        tokens = [t for d in data for t in d.tokens]
        all_targets = torch.cat(targets)
        for ids, what in ((tokens, "model_input"), (all_targets.tolist(), "target_tokens")):
            bad = [t for t in ids if not 0 <= t < vocab]
            if bad:
                raise TinkerRequestError(f"{what} holds token id {bad[0]}, outside the vocabulary (0..{vocab - 1})")
        too_long = [len(d.tokens) for d in data if len(d.tokens) > longest]
        if too_long:
            raise TinkerRequestError(f"a datum of {too_long[0]} tokens exceeds the model's {longest} positions")
        n = len(tokens)
        return Packed(input_ids=torch.tensor([tokens]), position_ids=torch.tensor([[i for d in data
                                                                                    for i in range(len(d.tokens))]]),
                      lengths=[len(d.tokens) for d in data], predict_at=torch.arange(n), targets=all_targets,
                      sample_index=torch.tensor([i for i, d in enumerate(data) for _ in d.tokens]),
                      token_slots=torch.full((n,), slot))

    def optim_step(self, model_id: str, learning_rate: float, beta1: float, beta2: float, eps: float,
                   weight_decay: float, grad_clip_norm: float) -> dict[str, float]:
        self._slot(model_id)
        optimizer = self.optimizers[model_id]
        for group in optimizer.param_groups:
            group.update(lr=learning_rate, betas=(beta1, beta2), eps=eps, weight_decay=weight_decay)
        params = [p for g in optimizer.param_groups for p in g["params"]]
        grads = [p.grad for p in params if p.grad is not None]
        norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))) if grads \
            else 0.0
        if grad_clip_norm > 0 and grads:
            torch.nn.utils.clip_grad_norm_(params, grad_clip_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return {"grad_norm:mean": norm, "learning_rate:mean": learning_rate}

    # -- checkpoints
    def save_state(self, model_id: str, name: str, overwrite: bool) -> str:
        slot = self._slot(model_id)
        path = self._path("weights", model_id, name, ".pt")
        if path.exists() and not overwrite:
            saved = self._tinker_path("weights", model_id, name)
            raise TinkerRequestError(f"a state named {name!r} is saved already ({saved}); save under another name, "
                                     f"or with overwrite=True")
        path.parent.mkdir(parents=True, exist_ok=True)
        adapters = {k: v.detach().clone() for k, v in self.policy.lora.state_dict().items() if k.endswith(f"_{slot}")}
        torch.save({"slot": slot, "adapters": adapters, "optimizer": self.optimizers[model_id].state_dict()}, path)
        return self._tinker_path("weights", model_id, name)

    def load_state(self, model_id: str, path: str, with_optimizer: bool) -> None:
        slot = self._slot(model_id)
        saved = torch.load(self._local(path, "weights", ".pt"), weights_only=True)
        state = self.policy.lora.state_dict()
        with torch.no_grad():
            for key, value in saved["adapters"].items():
                state[key.rsplit("_", 1)[0] + f"_{slot}"].copy_(value)
        if with_optimizer:
            self.optimizers[model_id].load_state_dict(saved["optimizer"])

    # -- sampling
    def save_for_sampler(self, model_id: str, name: Optional[str]) -> str:
        slot = self._slot(model_id)
        self.saves[model_id] = self.saves.get(model_id, 0) + 1
        name = name or f"step{self.saves[model_id]:06d}"
        directory = self._path("sampler_weights", model_id, name)
        rank = self.ranks[model_id]
        tensors = peft_tensors([self.policy.lora.host_state(slot)], self.policy.arch, self.shape.targets)
        tensors = {k: _first_components(k, v, rank) for k, v in tensors.items()}
        # the same alpha / slot rank scaling at rank r: PEFT scales by lora_alpha / r
        shape = LoraShape(rank=rank, alpha=self.shape.alpha * rank / self.shape.rank, targets=self.shape.targets,
                          slots=1)
        write_peft_adapter(directory, tensors, peft_config(shape, str(self.model_path)))
        self._load(self._tinker_path("sampler_weights", model_id, name), directory)
        return self._tinker_path("sampler_weights", model_id, name)

    def sample(self, sampler: str, prompt: list[int], num_samples: int, max_tokens: int, temperature: float,
               top_p: float, top_k: int, stop: Optional[list], seed: Optional[int],
               prompt_logprobs: bool) -> SampleResult:
        adapter = self._adapter(sampler) if sampler else None
        params = {"max_new_tokens": max_tokens, "temperature": temperature, "top_p": top_p, "top_k": top_k}
        if stop is not None:
            params.update(_stop_params(stop))
        sequences = []
        for i in range(num_samples):
            if seed is not None:
                params["sampling_seed"] = seed + i
            g = self.engine.generate(prompt, dict(params), lora_path=adapter)
            sequences.append(SampledSequence(g.output_ids, g.logprobs, "length" if g.finish_reason == "length"
                                             else "stop"))
        scored = self._prompt_logprobs(prompt, adapter) if prompt_logprobs else None
        return SampleResult(sequences, scored)

    def _prompt_logprobs(self, prompt: list[int], adapter: Optional[str]) -> list[float]:
        if len(prompt) < 2:
            return [math.nan] * len(prompt)
        scored = self.engine.generate(prompt, {"max_new_tokens": 0, "temperature": 0.0}, logprob_start_len=0,
                                      lora_path=adapter)  # SGLang's entry 0 is null: the first token has none
        return [math.nan, *scored.prompt_logprobs]

    def _adapter(self, sampler: str) -> str:
        """The engine's name for a saved sampler, loaded again if it was unloaded meanwhile."""
        with self.engine_lock:
            if sampler in self.loaded:
                self.loaded.move_to_end(sampler)
                return sampler
        directory = self._local(sampler, "sampler_weights", "")
        if not directory.is_dir():
            raise TinkerRequestError(f"no sampler weights at {sampler!r}")
        self._load(sampler, directory)
        return sampler

    def check_sampler(self, path: str) -> None:
        if not self._local(path, "sampler_weights", "").is_dir():
            raise TinkerRequestError(f"no sampler weights at {path!r}")

    def delete_checkpoint(self, path: str) -> None:
        kind = "sampler_weights" if "/sampler_weights/" in path else "weights"
        local = self._local(path, kind, "" if kind == "sampler_weights" else ".pt")
        with self.engine_lock:
            if self.loaded.pop(path, None) is not None:
                self.engine.unload_lora_adapter(path)
        if local.is_dir():
            shutil.rmtree(local)
        else:
            local.unlink(missing_ok=True)

    def _load(self, name: str, directory: Path) -> None:
        with self.engine_lock:
            while len(self.loaded) >= max(1, self.cfg.serve.max_loras - 1):
                old, _ = self.loaded.popitem(last=False)
                self.engine.unload_lora_adapter(old)
            self.engine.load_lora_adapter(name, str(directory.resolve()))
            self.loaded[name] = directory

    # -- paths: tinker://MODEL_ID/KIND/NAME <-> RUN_DIR/tinker/KIND/MODEL_ID/NAME
    def _tinker_path(self, kind: str, model_id: str, name: str) -> str:
        return f"{TINKER_SCHEME}{model_id}/{kind}/{name}"

    def _path(self, kind: str, model_id: str, name: str, suffix: str = "") -> Path:
        if not name or "/" in name or name.startswith("."):
            raise TinkerRequestError(f"a checkpoint name must be a plain file name, got {name!r}")
        return self.root / kind / model_id.replace(":", "_") / f"{name}{suffix}"

    def _local(self, path: str, kind: str, suffix: str) -> Path:
        if not path.startswith(TINKER_SCHEME):
            raise TinkerRequestError(f"expected a {TINKER_SCHEME} path, got {path!r}")
        parts = path[len(TINKER_SCHEME):].split("/")
        if len(parts) != 3 or parts[1] != kind:
            raise TinkerRequestError(f"expected {TINKER_SCHEME}MODEL_ID/{kind}/NAME, got {path!r}")
        return self._path(kind, parts[0], parts[2], suffix)

    def close(self) -> None:
        self.engine.close()


def _first_components(name: str, tensor: torch.Tensor, rank: int) -> torch.Tensor:
    """A PEFT tensor cut to its adapter's rank: lora_A's first rows, lora_B's first columns (the rest are zero)."""
    if "lora_A" in name:
        return tensor[:rank].contiguous()
    return tensor[:, :rank].contiguous() if "lora_B" in name else tensor


def engine_context_length(engine: SyncEngineClient) -> int:
    """The tokens a request may hold on the engine (its /server_info's context_length; 0 where it says none)."""
    for path in SERVER_INFO_PATHS:
        reply = engine.http.get(path)
        if reply.status_code == 200:
            return int(reply.json().get("context_length") or 0)
    return 0


def _stop_params(stop: list) -> dict:
    """Tinker's `stop`: strings, or token ids ([]: not even EOS stops)."""
    if not stop:
        return {"ignore_eos": True}
    if all(isinstance(s, int) for s in stop):
        return {"stop_token_ids": list(stop)}
    return {"stop": [str(s) for s in stop]}
