"""The embedded engine: continuous batching over `ModelRunner`, driven by one scheduler thread.

Requests arrive from any thread (`submit`). Between decode steps the
scheduler applies pending weight updates, admits waiting requests (prefill), then
decodes one token for every running request in one batch. Every sampled token
is tagged with the weight version that produced it, so a weight swap never
fails a request: tokens before the swap carry the old version, tokens after it
the new one.

The KV cache is one pool of token positions (SGLang's token pool): a request
is admitted, first come first served, while the positions it may fill (prompt
+ max_new_tokens, within the context) are free, and waits otherwise; at most
`max_running` run at once.

No KV entry outlives the weights that computed it. There is no prefix cache
across requests (a request's keys and values are rewritten by each prefill), and a
weight change retracts every running request, as SGLang's `retract` pause does:
its slot is released and it goes back to the front of the queue, to be
prefilled again (prompt + the tokens it has so far) under the new weights
before it samples its next token. So a request that spans an update gets, from
the update on, exactly the log-probs a cold request for the same tokens gets.
Pause modes follow SGLang: `abort` ends every request, `retract` retracts the
running ones, `in_place` keeps them in their slots; `flush_cache` is refused
while a request holds a slot, or while requests wait and the engine is not paused.

Log-prob conventions follow SGLang: output log-probs are log_softmax(logits / T)
over the full vocabulary (top-p/top-k do not change them); prompt log-probs use
the raw logits; the stop token is part of `output_ids` and of the log-probs.
One extension SGLang lacks: a request may set `input_logprob_temperature` to take
its prompt log-probs at a temperature (the judge scores a teacher at the
temperature the student sampled at); /get_model_info advertises it.
"""
from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from clawr1.serving.adapters import Adapter, AdapterBank, AdapterError, build_adapter
from clawr1.serving.model_runner import ModelRunner
from clawr1.serving.packed_linear import pack_linears
from clawr1.serving.sampling import counter_uniform, filtered_probs, inverse_cdf

log = logging.getLogger("clawr1.engine")


class RequestError(ValueError):
    """A request the engine cannot serve (bad parameters); the HTTP layer answers 400."""


@dataclass
class SamplingParams:
    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    sampling_seed: Optional[int] = None
    n: int = 1

    @classmethod
    def from_dict(cls, d: Optional[dict]) -> "SamplingParams":
        d = dict(d or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise RequestError(f"unknown sampling_params field(s): {', '.join(unknown)}")
        if isinstance(d.get("stop"), str):
            d["stop"] = [d["stop"]]
        d = {k: v for k, v in d.items() if v is not None or k == "sampling_seed"}
        p = cls(**d)
        p.validate()
        return p

    def validate(self) -> None:
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 0:
            raise RequestError("max_new_tokens must be an integer >= 0")
        if self.temperature < 0:
            raise RequestError("temperature must be >= 0")
        if not 0 < self.top_p <= 1:
            raise RequestError("top_p must be in (0, 1]")
        if not 0 <= self.min_p <= 1:
            raise RequestError("min_p must be in [0, 1]")
        if self.n < 1:
            raise RequestError("n must be >= 1")
        if len(self.stop) > 32:
            raise RequestError("at most 32 stop strings")
        if self.sampling_seed is not None and not -(2**63) <= self.sampling_seed < 2**63:
            raise RequestError("sampling_seed must fit in a signed 64-bit integer")

    @property
    def greedy(self) -> bool:
        return self.temperature < 1e-6


@dataclass
class GenerateRequest:
    input_ids: list[int]
    params: SamplingParams
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    input_logprob_temperature: float = 1.0  # prompt log-probs are log_softmax(logits / this)
    stream: bool = False  # emit an event per token (otherwise only the final result)
    lora_path: Optional[str] = None  # the name of a loaded LoRA adapter (SGLang's field); None: the base
    rid: str = field(default_factory=lambda: uuid.uuid4().hex)


@dataclass
class _Running:
    """Scheduler-side state of one request."""

    req: GenerateRequest
    on_event: Callable[[dict], None]
    seed: int  # its sampling_seed, or one drawn at submit
    generator: Optional[torch.Generator]  # serve.sampler=generator: its own, seeded; counter: None
    created: float
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    output_top: list[list] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    input_logprobs: list = field(default_factory=list)
    input_top: list = field(default_factory=list)
    finish: Optional[dict] = None
    stop_text_cut: Optional[int] = None
    slot: int = -1  # KV pool slot while running
    retractions: int = 0  # times its KV cache was dropped (pause in retract mode, weight change)
    adapter: Optional[Adapter] = None  # its LoRA adapter, held until it finishes
    cached_tokens: int = 0  # prompt tokens whose keys and values were copied from a request with the same tokens


class Engine:
    """One model, one scheduler thread, many concurrent requests."""

    def __init__(self, model_path: str | Path, dtype: str = "float32", max_running: int = 32,
                 weight_version: int = 0, max_context: Optional[int] = None, max_loras: int = 0, max_lora_rank: int = 64,
                 device: str = "cpu", max_total_tokens: Optional[int] = None, prepack: bool = False,
                 decode_attention: str = "gather", decode_cuda_graph: bool = False, sampler: str = "generator"):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if max_loras and device != "cpu":
            raise ValueError("LoRA serving (serve.max_loras) runs on the embedded engine's CPU path only; use "
                             "serve.device=cpu or SGLang")
        self.device = torch.device(device)
        self.model_path = str(model_path)
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=getattr(torch, dtype)).to(self.device)
        if prepack:  # serve.cpu_prepack (before the adapter hooks: they see the same module call)
            pack_linears(model)
        self.model = model
        self.max_running = max_running
        self.max_context = max_context or getattr(model.config, "max_position_embeddings", 4096)
        # the KV pool (SGLang's max_total_num_tokens); by default room for every request's whole context
        self.max_total_tokens = max_total_tokens or max_running * self.max_context
        if self.max_total_tokens < self.max_context:
            raise ValueError(f"a KV pool of {self.max_total_tokens} tokens cannot hold one request of the context "
                             f"length {self.max_context}")
        self.runner = ModelRunner(model, slots=max_running, pool_tokens=self.max_total_tokens,
                                  decode_attention=decode_attention, cuda_graph=decode_cuda_graph)
        # LoRA (SGLang's --enable-lora): adapters by name, chosen per request; 0 adapters: LoRA is off
        self.adapters = AdapterBank(model, max_loras, max_lora_rank) if max_loras else None
        self.weight_version = weight_version
        self.sampler = sampler  # serve.sampler: where each token's random number comes from
        self.eos_ids = self._eos_ids(model)
        self._waiting: deque[_Running] = deque()
        self._running: list[_Running] = []
        self._controls: deque[Callable[[], None]] = deque()
        self._paused = False
        self._aborts: set[str] = set()
        self._wake = threading.Condition()
        self._stopped = False
        self.steps = 0
        self.requests_total = 0
        self.tokens_total = 0
        self.prompt_tokens_shared = 0  # prompt tokens copied, not computed (requests admitted with the same tokens)
        self._thread = threading.Thread(target=self._loop, name="engine-scheduler", daemon=True)
        self._thread.start()

    @staticmethod
    def _eos_ids(model) -> set[int]:
        ids = model.generation_config.eos_token_id if model.generation_config else None
        ids = ids if ids is not None else model.config.eos_token_id
        return set(ids if isinstance(ids, list) else [ids] if ids is not None else [])

    # ------------------------------------------------------------ public API (any thread)
    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def kv_pool_free_tokens(self) -> int:
        return self.runner.cache.free_tokens

    @property
    def load(self) -> dict[str, int]:
        return {"running": len(self._running), "waiting": len(self._waiting)}

    def submit(self, req: GenerateRequest, on_event: Callable[[dict], None]) -> None:
        """Queue a request; `on_event` is called from the scheduler thread with each update.

        Events: {"type": "token", ...partial result} and finally {"type": "done", ...result}.
        """
        self._check(req)
        adapter = self._acquire_adapter(req.lora_path)
        seed = req.params.sampling_seed if req.params.sampling_seed is not None else int(torch.randint(2**62, (1,)))
        gen = torch.Generator().manual_seed(seed) if self.sampler == "generator" else None
        state = _Running(req, on_event, seed, gen, time.time(), adapter=adapter)
        self.requests_total += 1
        with self._wake:
            self._waiting.append(state)
            self._wake.notify()

    def control(self, fn: Callable[[], Any], timeout_s: float = 600.0) -> Any:
        """Run `fn` on the scheduler thread between two decode steps and return its result."""
        done = threading.Event()
        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["result"] = fn()
            except Exception as e:  # handed back to the caller
                box["error"] = e
            done.set()

        with self._wake:
            self._controls.append(run)
            self._wake.notify()
        if not done.wait(timeout_s):
            raise TimeoutError("the engine did not reach a step boundary in time")
        if "error" in box:
            raise box["error"]
        return box.get("result")

    def update_weights_from_disk(self, path: str, version: Optional[int] = None) -> int:
        """Load HF safetensors from `path` between decode steps; in-flight requests continue."""
        state = _read_safetensors_dir(Path(path))
        return self.control(lambda: self._load_state(state, version))

    def update_weights_from_tensors(self, state: dict[str, torch.Tensor], version: Optional[int] = None) -> int:
        """Load named tensors (any subset of the model's) between decode steps."""
        return self.control(lambda: self._load_state(state, version, partial=True))

    # ------------------------------------------------------------ LoRA adapters (SGLang's endpoints)
    def load_adapter(self, name: str, config: dict, tensors: dict[str, torch.Tensor], source: str = "__tensor__") -> None:
        """Add an adapter; requests may name it from now on. Running requests are not touched."""
        bank = self.lora_bank()
        bank.add(build_adapter(name, config, tensors, self.model, bank.max_rank, source))

    def unload_adapter(self, name: str, timeout_s: float = 600.0) -> None:
        """Refuse new requests for `name` at once; remove it once its in-flight requests are done."""
        bank = self.lora_bank()
        adapter = bank.start_draining(name)
        deadline = time.monotonic() + timeout_s
        while not bank.remove_if_idle(adapter):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the LoRA adapter {name!r} still serves {adapter.in_flight} requests")
            time.sleep(0.01)

    def loaded_adapters(self) -> dict[str, str]:
        return self.adapters.loaded() if self.adapters is not None else {}

    def lora_bank(self) -> AdapterBank:
        if self.adapters is None:
            raise RequestError("LoRA is not enabled on this engine (serve.max_loras, SGLang's --enable-lora)")
        return self.adapters

    def _acquire_adapter(self, name: Optional[str]) -> Optional[Adapter]:
        if name is None:
            return None
        try:
            return self.lora_bank().acquire(name)
        except AdapterError as e:
            raise RequestError(str(e)) from None

    def pause(self, mode: str = "abort") -> None:
        """Stop stepping, as SGLang's /pause_generation does. `abort` (SGLang's default) finishes every
        request now with finish_reason abort; `retract` releases the running requests' KV caches and
        queues them again (they are recomputed after `resume`); `in_place` keeps them in their slots.
        New requests queue meanwhile; none is refused."""
        if mode not in ("abort", "in_place", "retract"):
            raise RequestError(f"pause mode must be abort, in_place or retract, got {mode!r}")

        def do() -> None:
            self._paused = True
            if mode == "abort":
                self._abort({r.req.rid for r in self._running} | {r.req.rid for r in self._waiting})
            elif mode == "retract":
                self._retract_running()

        self.control(do)

    def flush_cache(self) -> bool:
        """SGLang's rule: refused (False) while a request holds KV, or while requests wait and the engine runs.

        There is no prefix cache to drop (see the module doc), so an accepted flush changes nothing."""
        def do() -> bool:
            return not self._running and (self._paused or not self._waiting)

        return self.control(do)

    def resume(self) -> None:
        def do() -> None:
            self._paused = False

        self.control(do)

    @property
    def paused(self) -> bool:
        return self._paused

    def abort(self, rid: str) -> None:
        """Finish a request early (its client went away); takes effect at the next step boundary."""
        with self._wake:
            self._aborts.add(rid)
            self._wake.notify()

    def stop(self) -> None:
        with self._wake:
            self._stopped = True
            self._wake.notify()
        self._thread.join(timeout=10)

    # ------------------------------------------------------------ scheduler thread
    def _check(self, req: GenerateRequest) -> None:
        n = len(req.input_ids)
        if n == 0:
            raise RequestError("input_ids cannot be empty")
        vocab = self.model.config.vocab_size
        if any((not isinstance(t, int)) or t < 0 or t >= vocab for t in req.input_ids):
            raise RequestError(f"input_ids must be integers in [0, {vocab})")
        if n >= self.max_context:
            raise RequestError(f"prompt of {n} tokens exceeds the context length {self.max_context}")
        if req.logprob_start_len > n:
            raise RequestError(f"logprob_start_len ({req.logprob_start_len}) is higher than the number of input tokens ({n})")

    def _load_state(self, state: dict[str, torch.Tensor], version: Optional[int], partial: bool = False) -> int:
        own = self.model.state_dict()
        missing = set() if partial else set(own) - set(state)
        if self.model.config.tie_word_embeddings:
            missing.discard("lm_head.weight")
        unexpected = set(state) - set(own)
        if missing or unexpected:
            raise RequestError(f"weights do not fit the model: missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}")
        for name, tensor in state.items():
            if own[name].shape != tensor.shape:
                raise RequestError(f"{name}: shape {tuple(tensor.shape)} does not fit {tuple(own[name].shape)}")
        with torch.no_grad():
            for name, tensor in state.items():
                own[name].copy_(tensor)
        self._retract_running()  # their caches hold the old weights' keys and values
        self.weight_version = self.weight_version + 1 if version is None else version
        return self.weight_version

    def _retract_running(self) -> None:
        """Release the running requests' slots and queue them first, to be prefilled again (scheduler thread)."""
        running, self._running = [r for r in self._running if r.finish is None], []
        for r in running:
            self.runner.cache.release(r.slot)
            r.slot = -1
            r.retractions += 1
        with self._wake:
            self._waiting.extendleft(reversed(running))

    def _loop(self) -> None:
        while True:
            with self._wake:
                while not (self._stopped or self._controls or (not self._paused and (self._waiting or self._running))):
                    self._wake.wait()
                if self._stopped:
                    break
                controls = list(self._controls)
                self._controls.clear()
                aborts, self._aborts = self._aborts, set()
            if aborts:
                self._abort(aborts)
            for fn in controls:
                fn()
            if not self._paused:
                try:
                    self._step()
                except Exception:  # a bug in one step must not kill serving: fail the requests in it
                    log.exception("engine step failed; aborting the running requests")
                    for r in self._running:
                        if r.finish is None:
                            self._finish(r, {"type": "abort", "message": "internal engine error"})
                    self._running = []
        for r in self._running + list(self._waiting):
            self._finish(r, {"type": "abort", "message": "engine stopped"})

    def _abort(self, rids: set[str]) -> None:
        with self._wake:
            dropped = [r for r in self._waiting if r.req.rid in rids]
            self._waiting = deque(r for r in self._waiting if r.req.rid not in rids)
        for r in dropped + [r for r in self._running if r.req.rid in rids and r.finish is None]:
            self._finish(r, {"type": "abort", "message": "Aborted"})
        self._running = [r for r in self._running if r.finish is None]

    def _step(self) -> None:
        admitted = []
        with self._wake:  # first come, first served: the head waits until its tokens fit in the pool
            while self._waiting and self.runner.cache.fits(self._reserve(self._waiting[0])):
                r = self._waiting.popleft()
                r.slot = self.runner.cache.take(self._reserve(r))
                admitted.append(r)
        decoding = [r for r in self._running if r.finish is None]
        for group in _same_tokens(admitted):
            self._prefill(group)
        if decoding:
            tokens = torch.tensor([r.output_ids[-1] for r in decoding], device=self.device)
            with self._adapters_of(decoding):
                hidden = self.runner.decode(tokens, [r.slot for r in decoding])
            self._sample(decoding, self.runner.logits(hidden))
        self._running = [r for r in self._running if r.finish is None]
        self.steps += 1

    def _prefill(self, group: list[_Running]) -> None:
        """Requests admitted together with the same tokens and adapter (a GRPO group's prompt, a judge's votes): the
        first one's prompt (a retracted one's prompt + output so far) computed once, its keys and values copied
        into the others' pages; then each one's next token."""
        first = group[0]
        ids = first.req.input_ids + first.output_ids
        with self._adapters_of([first]):
            hidden = self.runner.prefill(torch.tensor(ids, device=self.device), first.slot)
        for r in group[1:]:
            self.runner.cache.copy_prefix(first.slot, r.slot, len(ids))
            r.cached_tokens = len(ids)
            self.prompt_tokens_shared += len(ids)
        sampling = []
        for r in group:
            req = r.req
            if not r.output_ids:  # a retracted request's prompt log-probs were taken the first time
                if req.return_logprob and 0 <= req.logprob_start_len < len(req.input_ids):
                    self._prompt_logprobs(r, hidden)
                if req.params.max_new_tokens == 0:
                    self._finish(r, {"type": "length", "length": 0})
                    continue
            self._running.append(r)
            sampling.append(r)
        if sampling:
            self._sample(sampling, self.runner.logits(hidden[-1:]).expand(len(sampling), -1))

    def _reserve(self, r: _Running) -> int:
        """The KV positions a request may fill: its prompt and every token it may still write, within the context."""
        return min(len(r.req.input_ids) + r.req.params.max_new_tokens, self.max_context)

    def _adapters_of(self, batch: list[_Running]):
        if self.adapters is None:
            return contextlib.nullcontext()
        return self.adapters.use([r.adapter for r in batch])

    def _prompt_logprobs(self, r: _Running, hidden: torch.Tensor) -> None:
        """SGLang's layout: entry k is [logprob of x_{s+k} given x_{<s+k}, x_{s+k}, None], entry 0 has no logprob."""
        s, ids = r.req.logprob_start_len, r.req.input_ids
        temperature = r.req.input_logprob_temperature
        logp = torch.log_softmax(self.runner.logits(hidden[s:-1]) / temperature, dim=-1) if s < len(ids) - 1 else None
        targets = torch.tensor(ids[s + 1:], device=self.device)
        values = logp.gather(1, targets[:, None])[:, 0].tolist() if logp is not None else []
        r.input_logprobs = [[None, ids[s], None]] + [[v, t, None] for v, t in zip(values, ids[s + 1:])]
        if r.req.top_logprobs_num > 0:
            r.input_top = [None] + (_tops(logp, [r.req.top_logprobs_num] * len(logp)) if logp is not None else [])

    def _sample(self, batch: list[_Running], logits: torch.Tensor) -> None:
        """One token for each request of the batch: temperatures, filters, draws and top log-probs as batch ops, then
        one copy of the tokens to the host; the rest is each request's bookkeeping."""
        params = [r.req.params for r in batch]
        greedy = torch.tensor([p.greedy for p in params], device=self.device)
        temps = torch.tensor([1.0 if p.greedy else p.temperature for p in params], device=self.device)
        logp = torch.log_softmax(logits / temps[:, None], dim=-1)
        probs = self._filtered(logp, params) if any(map(_filters, params)) else logp.exp()
        picked = torch.where(greedy, logits.argmax(dim=-1), inverse_cdf(probs, self._uniforms(batch)))
        tokens = picked.tolist()
        chosen = logp.gather(1, picked[:, None])[:, 0].tolist()
        tops = _tops(logp, [r.req.top_logprobs_num for r in batch])
        for i, (r, token, lp) in enumerate(zip(batch, tokens, chosen)):
            r.output_ids.append(token)
            self.tokens_total += 1
            r.output_logprobs.append(lp)
            r.versions.append(self._version_of(r))
            if tops[i] is not None:
                r.output_top.append(tops[i])
            r.finish = self._finish_reason(r, token)
            if r.finish is not None:
                self._finish(r, r.finish)
            elif r.req.stream:
                r.on_event({"type": "token", **self.result(r)})

    def _uniforms(self, batch: list[_Running]) -> torch.Tensor:
        """Each request's random number in [0, 1) for its next token (greedy rows draw one too, and ignore it)."""
        if self.sampler == "generator":  # each request's own generator on the host, one call per request
            return torch.stack([torch.rand((), generator=r.generator) for r in batch]).to(self.device)
        seeds = torch.tensor([r.seed for r in batch], dtype=torch.int64, device=self.device)
        counters = torch.tensor([len(r.output_ids) for r in batch], dtype=torch.int64, device=self.device)
        return counter_uniform(seeds, counters)

    def _filtered(self, logp: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
        def column(values: list, dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype, device=self.device)

        return filtered_probs(logp, column([p.top_k for p in params], torch.int64),
                              column([p.top_p for p in params], logp.dtype), column([p.min_p for p in params], logp.dtype))

    def _finish_reason(self, r: _Running, token: int) -> Optional[dict]:
        p = r.req.params
        if not p.ignore_eos and (token in self.eos_ids or token in p.stop_token_ids):
            return {"type": "stop", "matched": token}
        if p.stop:
            text = self.tokenizer.decode(r.output_ids, skip_special_tokens=p.skip_special_tokens)
            for s in p.stop:
                at = text.find(s)
                if at >= 0:
                    r.stop_text_cut = at + (len(s) if p.no_stop_trim else 0)
                    return {"type": "stop", "matched": s}
        if len(r.output_ids) >= p.max_new_tokens:
            return {"type": "length", "length": p.max_new_tokens}
        if len(r.req.input_ids) + len(r.output_ids) >= self.max_context:
            return {"type": "length", "length": len(r.output_ids)}
        return None

    def _version_of(self, r: _Running) -> int:
        """The weight version of a request's next token: its adapter's (`name@vN`), else the base weights'."""
        version = r.adapter.version if r.adapter is not None else None
        return self.weight_version if version is None else version

    def _finish(self, r: _Running, reason: dict) -> None:
        r.finish = reason
        if r.slot >= 0:
            self.runner.cache.release(r.slot)
            r.slot = -1
        r.on_event({"type": "done", **self.result(r)})
        if r.adapter is not None:
            self.adapters.release(r.adapter)
            r.adapter = None

    # ------------------------------------------------------------ results in SGLang's shape
    def result(self, r: _Running) -> dict:
        req, p = r.req, r.req.params
        ids = r.output_ids
        text_ids = ids[:-1] if (r.finish and r.finish.get("type") == "stop" and isinstance(r.finish.get("matched"), int)
                                and not p.no_stop_trim) else ids
        text = self.tokenizer.decode(text_ids, skip_special_tokens=p.skip_special_tokens)
        if r.stop_text_cut is not None:
            text = text[: r.stop_text_cut]
        meta: dict[str, Any] = {
            "id": req.rid,
            "finish_reason": r.finish,
            "prompt_tokens": len(req.input_ids),
            "completion_tokens": len(ids),
            "cached_tokens": r.cached_tokens,
            "num_retractions": r.retractions,
            "weight_version": str(r.versions[-1] if r.versions else self._version_of(r)),
            "weight_versions": _version_spans(r.versions),
            "e2e_latency": time.time() - r.created,
        }
        if req.return_logprob:
            meta["input_token_logprobs"] = r.input_logprobs
            meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(r.output_logprobs, ids)]
            if req.top_logprobs_num > 0:
                meta["input_top_logprobs"] = r.input_top
                meta["output_top_logprobs"] = r.output_top
        return {"text": text, "output_ids": list(ids), "meta_info": meta}


def _same_tokens(admitted: list[_Running]) -> list[list[_Running]]:
    """The admitted requests grouped by (adapter, tokens to prefill), in order of arrival: a group's keys and values
    are the same, so they are computed once."""
    groups: dict[tuple, list[_Running]] = {}
    for r in admitted:
        groups.setdefault((id(r.adapter), tuple(r.req.input_ids), tuple(r.output_ids)), []).append(r)
    return list(groups.values())


def _tops(logp: torch.Tensor, ks: list[int]) -> list[Optional[list[list]]]:
    """Each row's k largest log-probs as SGLang's [logprob, id, None] entries (None where k is 0), one topk for all."""
    kmax = min(max(ks), logp.shape[-1])
    if kmax <= 0:
        return [None] * len(ks)
    values, ids = (t.tolist() for t in logp.topk(kmax, dim=-1))
    return [[[v, i, None] for v, i in zip(values[row][:k], ids[row][:k])] if k > 0 else None
            for row, k in enumerate(ks)]


def _filters(p: SamplingParams) -> bool:
    return (0 < p.top_k < 1 << 30) or p.top_p < 1.0 or p.min_p > 0


def _version_spans(versions: list[int]) -> list[dict]:
    """Per-token versions as SGLang 0.5.23's spans: [{"version", "start", "end"}]."""
    spans: list[dict] = []
    for i, v in enumerate(versions):
        if spans and spans[-1]["version"] == str(v):
            spans[-1]["end"] = i + 1
        else:
            spans.append({"version": str(v), "start": i, "end": i + 1})
    return spans


def _read_safetensors_dir(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise RequestError(f"no *.safetensors files in {path}")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    return state
