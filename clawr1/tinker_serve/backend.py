"""What `clawr1 tinker-serve` asks of the machine behind the Tinker API (the contract between its two halves).

`clawr1/tinker_serve/server.py` speaks Tinker's wire protocol (sessions, futures, protobuf) and calls a
`TinkerBackend`; `clawr1/trainer/tinker_serve_backend.py` implements it on clawr1's Megatron trainer (LoRA
adapters, one slot per training client) and its engine (sampling with the adapter last saved for it).
Every method blocks; the server runs training calls of one model in their `seq_id` order, one at a time.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Protocol

import numpy as np


class TinkerRequestError(ValueError):
    """A request the backend refuses (bad input, an unsupported option): the message goes to the client."""


@dataclass
class Datum:
    """One training example: `tokens` (model_input), and its loss_fn_inputs as arrays of shape (len(tokens),)."""

    tokens: list[int]
    inputs: dict[str, np.ndarray]


@dataclass
class SampledSequence:
    tokens: list[int]
    logprobs: list[float]
    stop_reason: str  # "stop" | "length"


@dataclass
class SampleResult:
    sequences: list[SampledSequence]
    prompt_logprobs: Optional[list[float]] = None  # one per prompt token; the first is NaN (nothing predicts it)


@dataclass
class ModelInfo:
    model_name: str  # what the client reports as its base model
    tokenizer_dir: str  # the directory of the model's tokenizer files, which the server hands out (/hub)
    lora_rank: int
    arch: str = ""
    max_context: int = 0  # tokens a sample's prompt and reply may hold together (0: unknown, not checked)


@dataclass
class ForwardBackwardResult:
    logprobs: list[np.ndarray]  # per datum: the learner's log p of each target token, float32 (N,)
    metrics: dict[str, float] = field(default_factory=dict)  # keys "name:reduction", e.g. "loss:sum"


class TinkerBackend(Protocol):
    def info(self) -> ModelInfo: ...

    def create_model(self, model_id: str, base_model: str, rank: int, seed: Optional[int]) -> None:
        """A new LoRA training client, its adapter initialized from `seed` (None: the server's own); refuses a base
        model or rank it cannot train, or when all slots are taken."""

    def release_model(self, model_id: str) -> None:
        """The client's session finished: its slot may train another client (its saved weights stay)."""

    def forward_backward(self, model_id: str, data: list[Datum], loss_fn: str, loss_fn_config: dict[str, float],
                         forward_only: bool) -> ForwardBackwardResult:
        """The loss summed over `data` (gradients accumulate until optim_step unless `forward_only`)."""

    def optim_step(self, model_id: str, learning_rate: float, beta1: float, beta2: float, eps: float,
                   weight_decay: float, grad_clip_norm: float) -> dict[str, float]:
        """One AdamW step on the model's adapter with the accumulated gradients, which are then cleared."""

    def save_state(self, model_id: str, name: str, overwrite: bool) -> str:
        """Adapter and optimizer state saved under `name`; returns its tinker:// path. A name saved before is
        refused unless `overwrite`."""

    def load_state(self, model_id: str, path: str, with_optimizer: bool) -> None: ...

    def save_for_sampler(self, model_id: str, name: Optional[str]) -> str:
        """The adapter's current weights made available to sampling; returns the sampler reference (a path)."""

    def check_sampler(self, path: str) -> None:
        """Refuses (TinkerRequestError) a sampler path that names no saved sampler weights."""

    def delete_checkpoint(self, path: str) -> None:
        """The saved state or sampler weights at `path` deleted (unloaded from sampling first)."""

    def sample(self, sampler: str, prompt: list[int], num_samples: int, max_tokens: int, temperature: float,
               top_p: float, top_k: int, stop: Optional[list], seed: Optional[int],
               prompt_logprobs: bool) -> SampleResult:
        """`sampler`: a reference from save_for_sampler, or "" for the base model."""

    def close(self) -> None: ...
