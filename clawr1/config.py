"""One validated config tree for every loop.

A recipe is a YAML file whose keys mirror `Config` below. Every default lives in
this file. A YAML file may `include:` another (path relative to itself) and
override parts of it; the command line adds dotted overrides such as
`trainer.lr=1e-5`. The whole tree is checked once, when it is loaded, before any
process starts: unknown keys, values outside their choices or ranges and
settings that contradict each other are refused with the key's dotted name, the
bad value and what is allowed.
"""
from __future__ import annotations

import difflib
import os
import typing
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from clawr1.addresses import Addresses

PositiveInt = typing.Annotated[int, Field(ge=1)]
NonNegativeInt = typing.Annotated[int, Field(ge=0)]
Port = typing.Annotated[int, Field(ge=0, le=65535)]
Probability = typing.Annotated[float, Field(ge=0.0, le=1.0)]
NonNegativeFloat = typing.Annotated[float, Field(ge=0.0)]
PositiveFloat = typing.Annotated[float, Field(gt=0.0)]


def _switch_word(value: Any) -> Any:
    """YAML 1.1 reads a bare on/off as true/false: give a switch its word back (`trainer.transformer_engine=off`)."""
    return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value


SwitchWord = BeforeValidator(_switch_word)


class Section(BaseModel):
    """A config section: unknown keys are errors, and assignments are checked like loaded values."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class RunConfig(Section):
    dir: str = Field("", description="Where everything a run writes lands; empty: `runs/<recipe>-<time>` "
                     "(`clawr1 run`).")
    mode: Literal["env", "live"] = Field(
        "env", description="env: `clawr1 rollout` drives rollout.env (white-box); live: no rollout loop, the run "
        "trains on whatever traffic reaches the gateway (any OpenAI client, or `clawr1 ingest`), idles without it, "
        "and runs until stopped.")
    seed: int = Field(0, description="Seeds the environment, the rollout workers, the judge's noise and the "
                      "trainer's initialization.")
    max_steps: NonNegativeInt = Field(8, description="Trainer steps; each one publishes a weight version. 0: no limit "
                                      "(live runs only).")
    progress_every_s: PositiveFloat = Field(10.0, description="Live runs: a progress line this often, steps or not.")
    startup_timeout_s: PositiveFloat = Field(300.0, description="How long `clawr1 run` waits for a loop to become "
                                             "ready.")
    stop_timeout_s: PositiveFloat = Field(20.0, description="SIGTERM grace before SIGKILL.")
    fork_server: bool = Field(
        True, description="`clawr1 run` forks every loop from one warm parent that imported torch, transformers, "
        "megatron-core and the loops' modules once (clawr1/fork_server.py), instead of starting each as a fresh "
        "Python; on a machine with an NVIDIA GPU, and with cluster.backend=ray, loops start as fresh processes "
        "(CUDA cannot be used in a process forked after the driver was touched).")
    on_loop_failure: Literal["stop", "restart"] = Field(
        "stop", description="When a loop dies: stop the whole run (research runs), or restart that loop with backoff "
        "while the rest keep serving (a live service); more than run.max_restarts failures of one loop within "
        "run.restart_window_s stop the run.")
    restart_backoff_s: PositiveFloat = Field(1.0, description="The first restart's delay; it doubles with each "
                                             "failure, up to 30 s.")
    max_restarts: NonNegativeInt = Field(5, description="on_loop_failure=restart: failures of one loop allowed "
                                         "within run.restart_window_s; one more stops the run.")
    restart_window_s: PositiveFloat = Field(600.0, description="The window over which run.max_restarts counts one "
                                            "loop's failures.")
    cpu_bf16: typing.Annotated[Literal["auto", "on", "off"], SwitchWord] = Field(
        "auto", description="bf16 on CPU (trainer.precision=bf16, serve.dtype=bfloat16): auto, in bf16 where the CPU "
        "has bf16 instructions (avx512_bf16 or AMX) and in fp32 elsewhere, saying why in one line (torch emulates "
        "bf16 products without them, slower than fp32); on: bf16 on any CPU; off: fp32 (clawr1/cpu_dtype.py).")


class TinyModelConfig(Section):
    """The tiny Qwen2-architecture model `clawr1 init-model` builds and warm-starts."""

    vocab_size: PositiveInt = Field(1024, description="Tokens in the byte-level BPE vocabulary trained for it.")
    hidden_size: PositiveInt = Field(128, description="Width of the model's hidden states.")
    num_layers: PositiveInt = Field(4, description="Transformer layers.")
    num_heads: PositiveInt = Field(4, description="Attention (query) heads.")
    num_kv_heads: PositiveInt = Field(2, description="Key/value heads (grouped-query attention).")
    intermediate_size: PositiveInt = Field(384, description="Width of the MLP's hidden layer.")
    max_position_embeddings: PositiveInt = Field(1024, description="The longest sequence the model takes, in tokens.")
    rope_theta: PositiveFloat = Field(10000.0, description="The rotary position embedding's base.")
    # 900 steps gave a model that follows a directive only at the start of its answer; 1,800 one that picks the
    # answer's unit at random; 2,700 copies it (docs/personalization.md, "The teacher: what a hint changes")
    sft_steps: PositiveInt = Field(2700, description="Optimizer steps of the warm start (supervised training on "
                                   "assistant tokens).")
    sft_batch_size: PositiveInt = Field(32, description="Conversations per warm-start step.")
    sft_lr: PositiveFloat = Field(6e-3, description="The warm start's peak learning rate (AdamW, warmup then cosine "
                                  "decay).")
    sft_examples: PositiveInt = Field(10000, description="Warm-start conversations generated (by "
                                      "model.tiny.warm_start).")
    seed: int = Field(1234, description="Seeds the warm-start conversations, the initial weights and the batch "
                      "order.")
    build_threads: PositiveInt = Field(2, description="The build's thread count, whatever the machine has: it "
                                       "changes the weights.")
    warm_start: str = Field("envs.warmstart:conversations", description="Where the warm-start conversations come "
                            "from: an import path to a function (n, seed) -> [(messages, tools)].")


class ModelConfig(Section):
    path: str = Field("", description="An HF model directory (config.json, safetensors, tokenizer with its chat "
                      "template); empty means model.name, else the tiny model (built on first use). "
                      "docs/own_model.md, \"Bring your own model\".")
    name: str = Field("", description="A known real model (`clawr1 model get NAME`: smollm2-135m-instruct, "
                      "qwen2.5-coder-0.5b-instruct), fetched and converted into the cache on first use; used when "
                      "path is empty.")
    cache_dir: str = Field("~/.cache/clawr1", description="Where the tiny model, tokenizers and converted models are "
                           "cached.")
    tiny: TinyModelConfig = Field(default_factory=TinyModelConfig,
                                  description="The tiny model's build spec, used when path and name are empty; each "
                                  "spec is built once and cached under its hash.")
    chat_template: str = Field("", description="A Jinja file to render with instead of the template the tokenizer "
                               "ships; empty: the model's own.")
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Passed to the chat template on every request (a request's own "
        "chat_template_kwargs add to them).")
    tool_call_format: Literal["auto", "hermes", "llama3_json"] = Field(
        "auto", description="How tool calls are written: hermes (`<tool_call>` JSON blocks: Qwen2.5, Qwen3), "
        "llama3_json (Llama 3.x); auto: llama3_json for Llama models, hermes otherwise.")
    reasoning_format: Literal["auto", "think", "none"] = Field(
        "auto", description="think: `<think>...</think>` is reasoning (reasoning_content); none: no reasoning is split "
        "off; auto: think when the vocabulary has `<think>`.")
    on_template_break: Literal["keep_sampled", "rerender"] = Field(
        "keep_sampled", description="When the template renders a session's recorded history otherwise than it was "
        "sampled (Qwen3 drops earlier turns' reasoning): keep_sampled extends the sampled ids (the model trains on "
        "what it saw); rerender takes the fresh render. Either way the gateway's template_breaks counts the turn.")


class SGLangConfig(Section):
    """Flags for `python -m sglang.launch_server` (serve.backend=sglang; GPU machines, or CPU: docs/serving.md)."""

    python: str = Field("", description="The Python of the environment SGLang is installed in (its own: SGLang pins "
                        "its torch and transformers, which need not match the trainer's; clawr1 only talks to it over "
                        "HTTP); empty: this interpreter.")

    device: Literal["auto", "cuda", "cpu"] = Field(
        "auto", description="Where SGLang runs; auto: cpu when this machine's torch sees no GPU. cpu adds the flags "
        "SGLang needs there (--device cpu --attention-backend torch_native --disable-overlap-schedule --sleep-on-idle, "
        "--lora-backend torch_native with LoRA; a KV pool of serve.max_total_tokens or 4,096 tokens; "
        "--mem-fraction-static 0.8 unless set) and needs SGLang's environment from scripts/setup_sglang.sh.")
    tp_size: PositiveInt = Field(1, description="GPUs per engine, tensor-parallel (--tp-size).")
    mem_fraction_static: typing.Annotated[float, Field(ge=0.0, lt=1.0)] = Field(
        0.0, description="--mem-fraction-static; 0: SGLang's own default.")
    context_length: NonNegativeInt = Field(0, description="--context-length; 0: the model's.")
    tool_call_parser: str = Field("qwen25", description="--tool-call-parser; empty: none.")
    reasoning_parser: str = Field("", description="--reasoning-parser, e.g. qwen3 for thinking models; empty: none.")
    dtype: Literal["auto", "half", "float16", "bfloat16", "float", "float32"] = Field(
        "auto", description="--dtype of the weights and activations; auto on CPU: float32 (SGLang's own auto serves "
        "a float32 checkpoint in float16).")
    extra_args: list[str] = Field(default_factory=list, description="Any further launch_server flags, verbatim (not "
                                  "the flags the keys above set).")
    startup_timeout_s: PositiveFloat = Field(900.0, description="How long to wait for an SGLang server to become "
                                             "healthy.")

    # Value flags that clawr1 sets from the keys above: extra_args may not repeat them, since argparse
    # would silently keep the last one and the config would no longer say what runs.
    MANAGED_FLAGS: typing.ClassVar[frozenset[str]] = frozenset({
        "--model-path", "--model", "--host", "--port", "--tp-size", "--tensor-parallel-size",
        "--mem-fraction-static", "--context-length", "--dtype", "--tool-call-parser", "--reasoning-parser",
        "--weight-version", "--device", "--max-total-tokens",
    })

    @model_validator(mode="after")
    def _no_managed_flags(self) -> "SGLangConfig":
        for arg in self.extra_args:
            if arg.split("=", 1)[0] in self.MANAGED_FLAGS:
                raise ValueError(f"serve.sglang.extra_args sets {arg.split('=', 1)[0]}, which clawr1 sets from the "
                                 "config; change the config key instead")
        return self


class ServeConfig(Section):
    backend: Literal["embedded", "sglang", "tinker"] = Field(
        "embedded", description="The inference engine: embedded, clawr1's own (clawr1/serving, CPU or one GPU); "
        "sglang, SGLang servers launched from serve.sglang; tinker, the engine API in front of Tinker sampling "
        "clients at tinker.base_url (with trainer.backend=tinker; docs/tinker.md).")
    host: str = Field("127.0.0.1", description="The address the engines listen on.")
    port: Port = Field(0, description="The first engine's port; 0: `clawr1 run` picks a free port.")
    num_threads: PositiveInt = Field(1, description="Torch threads for the embedded engine.")
    max_running_requests: PositiveInt = Field(32, description="Requests the embedded engine decodes at once; more "
                                              "wait.")
    context_length: NonNegativeInt = Field(
        0, description="Tokens per request (prompt + reply) the embedded engine's KV cache holds; 0: the smaller of "
        "the model's maximum and 4,096 (clawr1/serving/memory.py). The gateway refuses longer prompts with a 400.")
    memory_budget_gb: NonNegativeFloat = Field(
        0.0, description="The embedded engine's memory: weights + its KV pool within mem_fraction_static of this (the "
        "rest for activations); it refuses to start when the weights and one whole context do not fit. 0: the memory "
        "available (on cuda: what the GPU has free).")
    mem_fraction_static: typing.Annotated[float, Field(gt=0.0, le=1.0)] = Field(
        0.85, description="The share of serve.memory_budget_gb the embedded engine's weights and KV pool may take.")
    max_total_tokens: NonNegativeInt = Field(
        0, description="The KV pool in tokens (SGLang's --max-total-tokens): requests are admitted while their prompt "
        "+ max_tokens fit and wait otherwise; 0: what the budget leaves, at most max_running_requests whole "
        "contexts.")
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="The embedded engine's weights and KV cache dtype; bfloat16 on CPU follows "
        "run.cpu_bf16.")
    cpu_prepack: bool = Field(
        True, description="The embedded engine on CPU in float32: its large linear layers (1M weights or more) compute "
        "through a copy of their weights packed for oneDNN, 1.7-2.7x faster at decode's few rows "
        "(clawr1/serving/packed_linear.py); the copy adds up to the weights' size to the engine's memory.")
    decode_attention: Literal["gather", "paged"] = Field(
        "gather", description="The embedded engine's decode attention. gather: each step copies the running requests' "
        "keys and values out of the paged pool and calls SDPA with a mask; paged: one Triton kernel reads each "
        "request's pages in place (clawr1/serving/paged_attention.py; needs triton, on a CPU only under its "
        "interpreter, TRITON_INTERPRET=1, for tests).")
    decode_cuda_graph: bool = Field(
        False, description="serve.device=cuda with serve.decode_attention=paged: each decode step replayed from a CUDA "
        "graph captured at start for its batch-size bucket (clawr1/serving/decode_graphs.py), instead of launching "
        "its kernels one by one.")
    sampler: Literal["generator", "counter"] = Field(
        "generator", description="Where the embedded engine's random number for each sampled token comes from. "
        "generator: each request's own seeded torch.Generator on the host, one call per request and token; counter: "
        "a hash of the request's seed and the token's index, computed for the whole batch on the engine's device "
        "(clawr1/serving/sampling.py), the same on every device and in any batch. Either way a request with "
        "sampling_seed repeats itself; the two give different tokens for the same seed.")
    device: Literal["cpu", "cuda"] = Field(
        "cpu", description="The embedded engine's device. cuda: weights and KV cache in GPU memory (use dtype "
        "bfloat16), the budget above is GPU memory; with the trainer on the same GPU each engine takes its budget "
        "and leaves the rest to it.")
    weight_version: NonNegativeInt = Field(0, description="The version the loaded weights carry (a restarted engine: "
                                           "the newest published).")
    max_loras: NonNegativeInt = Field(
        0, description="LoRA serving (SGLang: --enable-lora --max-loras-per-batch --max-lora-rank): adapters held at "
        "once; 0: off. lora.sync=adapter needs 3 per slot (the newest version, the one before finishing its "
        "requests, and the one being loaded); unset, it is 3 per slot + 1.")
    max_lora_rank: PositiveInt = Field(64, description="The largest adapter rank the engines accept "
                                       "(--max-lora-rank); at least lora.rank.")
    num_engines: PositiveInt = Field(1, description="`clawr1 run` starts this many engines (ports serve.port, "
                                     "extra_ports...).")
    extra_ports: list[Port] = Field(default_factory=list, description="Ports of engines 2..n (filled by `clawr1 "
                                    "run`).")
    sglang: SGLangConfig = Field(default_factory=SGLangConfig, description="SGLang's launch flags "
                                 "(serve.backend=sglang).")


class GatewayConfig(Section):
    host: str = Field("127.0.0.1", description="The address the gateway listens on; one reachable from other machines "
                      "needs an API key (api_key_env or api_key_file).")
    port: Port = Field(0, description="The gateway's port; 0: `clawr1 run` picks a free port.")
    engine_urls: list[str] = Field(default_factory=list, description="The engines the gateway routes to and the "
                                   "trainer updates; empty: the run's own engines.")
    session_ttl_s: PositiveFloat = Field(
        900.0, description="A session idle this long (counted from the end of its last reply) is closed; its pending "
        "turns go to the judge with no next state.")
    max_sessions: PositiveInt = Field(4096, description="Sessions held at once; beyond it the least recently used "
                                      "are closed.")
    max_session_tokens: PositiveInt = Field(20_000_000, description="Token ids held by all sessions together (memory "
                                            "pressure bound); beyond it the least recently used are closed.")
    engine_wait_s: NonNegativeFloat = Field(30.0, description="How long a request that finds no engine reachable "
                                            "(the run starting, an engine restarting) waits for one to come up "
                                            "before it is answered 503; 0: refused at once.")
    max_request_bytes: PositiveInt = Field(1_000_000, description="Larger request bodies get a 413.")
    max_prompt_tokens: PositiveInt = Field(4096, description="Longer rendered conversations get a 400.")
    default_max_tokens: PositiveInt = Field(256, description="The reply's token limit when a request sets neither "
                                            "max_tokens nor max_completion_tokens.")
    max_completion_tokens: PositiveInt = Field(4096, description="Requests with a larger max_tokens get a 400.")
    judge_queue_size: PositiveInt = Field(4096, description="Bounded queue of TurnRecords waiting for the judge.")
    outbox: bool = Field(
        True, description="Every main turn is logged to RUN_DIR/gateway/outbox.log when served and kept until the "
        "judge acknowledges it (its Sample durable in the pool, or dropped with a reason); unacknowledged turns are "
        "sent again after outbox_resend_s, at once to a restarted judge, and by a restarted gateway "
        "(clawr1/gateway/outbox.py).")
    outbox_resend_s: PositiveFloat = Field(60.0, description="An outbox turn not acknowledged this long after it was "
                                           "sent is sent again.")
    outbox_rewrite_after: PositiveInt = Field(4096, description="Acknowledged turns before the outbox log is "
                                              "rewritten with the open ones only.")
    acks_port: Port = Field(0, description="Judge -> gateway acknowledgements (PUSH/PULL); 0: `clawr1 run` picks a "
                            "free port.")
    api_key_env: str = Field("CLAWR1_API_KEY", description="Name of the environment variable holding the API key "
                             "clients must send.")
    api_key_file: str = Field("", description="Or a file holding it (read first when set).")
    model_name: str = Field("clawr1-policy", description="The model id the gateway lists and answers with, and the "
                            "one rollout requests name.")


class RolloutConfig(Section):
    env: str = Field("envs.personal.env:PersonalEnv", description="Import path of the environment class.")
    env_args: dict[str, Any] = Field(default_factory=dict, description="Passed to the environment.")
    concurrency: PositiveInt = Field(8, description="Simulated users / episodes in flight.")
    max_tokens: PositiveInt = Field(48, description="The reply's token limit on every rollout request.")
    temperature: NonNegativeFloat = Field(1.0, description="Sampling temperature of rollout requests.")
    top_p: typing.Annotated[float, Field(gt=0.0, le=1.0)] = Field(1.0, description="Nucleus sampling's top_p of "
                                                                  "rollout requests.")
    max_pool_backlog: NonNegativeInt = Field(
        0, description="Start new episodes only while the pool holds fewer pending samples than this (0: no bound, "
        "as for live traffic); keeps synthetic rollout from running far ahead of the trainer.")
    eval_every: NonNegativeInt = Field(0, description="Evaluate held-out tasks every k weight versions (0: never).")
    eval_size: PositiveInt = Field(32, description="Held-out tasks per evaluation.")
    request_timeout_s: PositiveFloat = Field(120.0, description="Timeout of each request to the gateway.")


class DirectiveOption(Section):
    """One option a user can ask for, as the rules judge writes it when `judge.rules_hint: directive`."""

    kind: str = Field(description="What the option is an option of (e.g. \"units\"); `hint_noise_kind: contradict` "
                      "swaps within a kind.")
    option: str = Field(description="The option's name, e.g. \"word\".")
    directive: str = Field(description="The hint's words for it, e.g. \"spell out the units like kilometers\".")
    patterns: list[str] = Field(
        min_length=1, description="A correction sentence asks for this option when these match; of a kind's options "
        "the one with the most matches wins, the first listed on a tie.")


class JudgeConfig(Section):
    backend: Literal["rules", "llm", "env"] = Field(
        "rules", description="rules: patterns on the next user message (clawr1/judge/rules.py); llm: m PRM votes and m "
        "hint votes (clawr1/judge/llm.py); env: the environment's outcome, plus an optional PRM term "
        "(clawr1/judge/env.py).")
    host: str = Field("127.0.0.1", description="The address the judge listens on for TurnRecords.")
    port: Port = Field(0, description="Gateway -> judge TurnRecords (PUSH/PULL); 0: `clawr1 run` picks a free port.")
    teacher: Literal["policy", "frozen", "lagged", "none"] = Field(
        "policy", description="policy: self-distillation (the serving policy); frozen: the base weights; lagged: the "
        "policy's weights of at most teacher_lag versions ago (an anchor that does not move with every step); none: "
        "no teacher.")
    teacher_lag: PositiveInt = Field(10, description="lagged: the trainer refreshes the teacher every this many "
                                     "versions.")
    teacher_url: str = Field("", description="Frozen/lagged teacher engine; empty: `clawr1 run` starts one on the base "
                             "weights.")
    teacher_port: Port = Field(0, description="Port of that engine (filled by `clawr1 run`).")
    teacher_topk: NonNegativeInt = Field(0, description="Also record the teacher's top-k log-probs per token (for "
                                         "algo.w_topk); 0: off.")
    concurrency: PositiveInt = Field(8, description="Turns judged at once.")
    correction_patterns: list[str] = Field(
        default_factory=lambda: [r"^\s*no\b", r"\bi asked\b", r"\bwrong\b", r"\bnot what\b", r"\bagain\b",
                                 r"^\s*(?:nope|nah|ugh|meh)\b", r"\bnot (?:how|quite|right|like that)\b",
                                 r"\bi (?:said|told you)\b", r"\bthat'?s not\b"],
        description="Regular expressions: a next user message matching any of these says the turn was wrong "
        "(score -1).",
    )
    directive_patterns: list[str] = Field(
        default_factory=lambda: [r"\bplease\b", r"\binstead\b", r"\bi want\b", r"\bi prefer\b", r"\bdon't\b",
                                 r"\bdo not\b", r"\bshould\b", r"\bmust\b", r"\bneed to\b",
                                 # requests as people word them
                                 r"\b(?:could|can|would|will) you\b", r"\bi'?d (?:like|prefer|rather)\b",
                                 r"\bi would (?:like|prefer|rather)\b", r"\bmake sure\b", r"\bno need\b",
                                 r"\brather than\b"],
        description="Regular expressions: sentences matching these say what to do instead; they become the hint (and "
        "also score -1).",
    )
    max_hint_chars: PositiveInt = Field(400, description="Hints are cut to this many characters.")
    rules_hint: Literal["user_words", "directive"] = Field(
        "user_words", description="The rules judge's hint: user_words, the sentences of the correction as the user "
        "wrote them; directive, the configured option directives the correction asks for (`Please <directive> and "
        "<directive>.`), none when it names no configured option (counted: corrections_unmapped). Scores are the "
        "same either way.")
    directives: list[DirectiveOption] = Field(default_factory=list, description="The options users can ask for "
                                              "(rules_hint=directive, hint_noise_kind=contradict); filled by the "
                                              "environment's recipes.")
    score_noise: Probability = Field(
        0.0, description="An imperfect judge on purpose: each score is flipped with this probability (a PRM that is "
        "right 1 - score_noise of the time); hints are kept as they are.")
    score_abstain: Probability = Field(0.0, description="Each score is replaced by 0 with this probability; hints are "
                                       "kept as they are.")
    hint_noise: Probability = Field(
        0.0, description="Each hint is replaced by a wrong one (see hint_noise_kind) with this probability "
        "(clawr1/judge/noise.py).")
    hint_drop: Probability = Field(0.0, description="Each hint is lost with this probability (clawr1/judge/noise.py).")
    hint_noise_kind: Literal["swap", "contradict"] = Field(
        "swap", description="What a wrong hint is: swap, another recent, different hint (plausible and wrong; in a "
        "one-user run, another of the user's true wishes); contradict, each wish the hint names replaced by another "
        "option of its kind (needs judge.directives).")
    drop_zero: bool = Field(
        False, description="Drop a turn scored 0 that has no hint, as OpenClaw-RL does (ledger reason zero_score); a "
        "0-scored turn with a hint keeps its OPD signal.")
    # llm backend (and the PRM step score of the env backend): any OpenAI-compatible endpoint, or SGLang /generate
    llm_url: str = Field(
        "", description="The llm judge's (and the env judge's PRM) endpoint: any OpenAI-compatible one, e.g. "
        "http://prm-host:30000/v1 (openai), or SGLang's, e.g. http://prm-host:30000 (generate); empty: `clawr1 run` "
        "starts a PRM engine.")
    prm: Literal["own", "policy"] = Field(
        "own", description="Who votes for the llm judge: own, judge.llm_url or a PRM engine `clawr1 run` starts; "
        "policy, the serving engine's /generate without an adapter (under LoRA the base model, as OpenClaw-RL's "
        "judge, with no second engine; needs judge.llm_api=generate).")
    llm_api: Literal["openai", "generate"] = Field("openai", description="generate: a text prompt rendered in ChatML "
                                                   "to SGLang's /generate; openai: chat completions.")
    llm_model: str = Field("default", description="The model name sent to an OpenAI-compatible endpoint.")
    llm_api_key_env: str = Field("CLAWR1_JUDGE_API_KEY", description="Environment variable holding the endpoint's "
                                 "key, if any.")
    votes: PositiveInt = Field(3, description="m evaluation votes and m hint votes per turn, run concurrently.")
    last_k_turns: PositiveInt = Field(4, description="The judge sees this many messages before the turn.")
    vote_temperature: NonNegativeFloat = Field(0.6, description="Sampling temperature of each vote.")
    vote_max_tokens: PositiveInt = Field(512, description="Token limit of each vote's reply.")
    min_hint_chars: NonNegativeInt = Field(10, description="A hint vote whose hint is shorter than this abstains.")
    # env backend
    env_reward: Literal["last_turn", "all_turns"] = Field(
        "last_turn", description="env backend: last_turn, the outcome scores the session's last turn; all_turns: "
        "every turn of the session gets the outcome.")
    prm_coef: NonNegativeFloat = Field(0.0, description="env backend, > 0: add prm_coef * (PRM majority vote) to each "
                                       "turn's reward (needs a PRM).")
    max_held_sessions: PositiveInt = Field(10_000, description="all_turns: sessions whose turns wait for their "
                                           "outcome.")
    prm_model_path: str = Field("", description="The model of the PRM engine `clawr1 run` starts when llm_url is "
                                "empty (on cluster.prm_gpus when given); empty: model.path (the policy's base model).")
    prm_port: Port = Field(0, description="Port of that engine (filled by `clawr1 run`).")

    @property
    def needs_llm(self) -> bool:
        return self.backend == "llm" or (self.backend == "env" and self.prm_coef > 0)

    @property
    def runs_own_prm(self) -> bool:
        """`clawr1 run` starts the PRM engine: the judge needs one and none is configured."""
        return self.needs_llm and not self.llm_url and self.prm == "own"

    @property
    def runs_own_teacher(self) -> bool:
        """`clawr1 run` starts the teacher engine: one is needed (frozen or lagged) and none is configured."""
        return self.teacher in ("frozen", "lagged") and not self.teacher_url


class PoolConfig(Section):
    host: str = Field("127.0.0.1", description="The address the pool listens on.")
    samples_port: Port = Field(0, description="Judge -> pool (acked once durable); 0: `clawr1 run` picks a free "
                               "port.")
    batches_port: Port = Field(0, description="Trainer <-> pool; 0: `clawr1 run` picks a free port.")
    batch_size: PositiveInt = Field(16, description="Samples per training batch (one trainer step).")
    max_staleness: NonNegativeInt = Field(4, description="The pool's bound, when it makes a batch: drop samples "
                                          "whose oldest token is more than this many versions behind the trainer's "
                                          "newest version (the trainer's own bound at each step: "
                                          "algo.step_max_staleness).")
    fsync: bool = Field(True, description="Make every write durable (fsync) before acknowledging it; false: faster, "
                        "but a machine crash can lose acknowledged samples.")
    max_pending: PositiveInt = Field(100_000, description="Refuse (nack, retry later) new samples beyond this "
                                     "backlog.")
    group_size: PositiveInt = Field(1, description="A group (same group_id) is batched once it has this many "
                                    "attempts (sessions: a multi-turn attempt's turns count once), or once "
                                    "group_timeout_s has passed.")
    group_timeout_s: PositiveFloat = Field(60.0, description="A group is also batched once its first sample is "
                                           "this old.")
    segment_samples: PositiveInt = Field(
        10_000, description="Samples are stored in segments of this many; a segment whose samples are all committed "
        "or dropped is deleted (or moved to pool.archive), so disk and restart time stay flat.")
    archive: str = Field("", description="A directory finished segments are moved to instead of being deleted; "
                         "empty: deleted.")
    seen_window_segments: NonNegativeInt = Field(8, description="Deleted segments whose ids still count as duplicates "
                                                 "on a resend.")


class TrainerConfig(Section):
    backend: Literal["megatron", "tinker"] = Field(
        "megatron", description="megatron: clawr1's Megatron trainer on this machine's CPU or GPUs; tinker: every step "
        "through Tinker's API at tinker.base_url (forward_backward, optim_step, new sampler weights), with "
        "serve.backend=tinker (docs/tinker.md).")
    lr: PositiveFloat = Field(1e-4, description="The peak learning rate (AdamW).")
    lr_schedule: Literal["constant", "cosine"] = Field(
        "constant", description="constant: lr after the warmup; cosine: linear warmup, then down to min_lr_ratio * lr "
        "over run.max_steps.")
    warmup_steps: NonNegativeInt = Field(0, description="Steps of linear warmup up to lr (either schedule); 0: none.")
    min_lr_ratio: Probability = Field(0.1, description="cosine: where the learning rate ends, as a fraction of lr.")
    weight_decay: NonNegativeFloat = Field(0.0, description="AdamW's weight decay, applied to matrices only, not to "
                                           "norms and biases.")
    adam_betas: typing.Annotated[list[typing.Annotated[float, Field(ge=0.0, lt=1.0)]],
                                 Field(min_length=2, max_length=2)] = Field(
        default_factory=lambda: [0.9, 0.999], description="AdamW's beta1 and beta2.")
    adam_eps: PositiveFloat = Field(1e-8, description="AdamW's epsilon.")
    grad_clip: NonNegativeFloat = Field(1.0, description="Max global grad norm (0: no clipping).")
    max_tokens_per_microbatch: PositiveInt = Field(4096, description="Samples are packed into micro-batches of at "
                                                   "most this many tokens (gradients accumulate over them).")
    logprob_chunk_tokens: PositiveInt = Field(1024, description="Log-probs are computed this many tokens at a time.")
    num_threads: PositiveInt = Field(1, description="Torch threads per trainer process.")
    tensor_parallel: PositiveInt = Field(1, description="Tensor-parallel size (Megatron).")
    data_parallel: PositiveInt = Field(1, description="Data-parallel ranks; with a cluster section `clawr1 run` "
                                       "derives it (actor GPUs / tensor_parallel).")
    precision: Literal["fp32", "bf16"] = Field(
        "fp32", description="Training precision. bf16 on CUDA: mixed precision (fp32 master weights in the optimizer); "
        "on CPU: LoRA only, a frozen bf16 base under fp32 adapters, their gradients and AdamW (run.cpu_bf16 says "
        "where the CPU runs it in bf16).")
    transformer_engine: typing.Annotated[Literal["auto", "on", "off"], SwitchWord] = Field(
        "auto", description="Use Transformer Engine layers; auto: when CUDA and TE are present.")
    share_prefixes: bool = Field(
        False, description="Pack each micro-batch as a prefix tree (clawr1/trainer/prefix_tree.py): tokens that "
        "begin several of its samples (a group's prompt, a conversation's earlier turns; per LoRA slot) are computed "
        "once, each token attending to its ancestors only. The same loss and gradients, up to rounding, from fewer "
        "tokens; max_tokens_per_microbatch then counts the tree's tokens. Needs the trainer's own core attention "
        "(not TransformerEngine's); its trees run one attention call each.")
    fused_kernels: list[Literal["rmsnorm", "swiglu", "rope", "lmhead"]] = Field(
        default_factory=list, description="Triton kernels in place of megatron-core's unfused torch ops, without "
        "TransformerEngine (clawr1/trainer/fused): rmsnorm (every RMSNorm), swiglu (the MLP's activation), rope (the "
        "rotary embedding in the trainer's own core attention), lmhead (log-probs and entropy from the LM head "
        "without its logits; tensor_parallel 1 only). Needs triton; on a CPU only under Triton's interpreter "
        "(TRITON_INTERPRET=1, for tests). Empty: the plain ops.")
    host: str = Field("127.0.0.1", description="The address the trainer publishes weight versions on.")
    publish_port: Port = Field(0, description="PUB socket announcing WeightsPublished; 0: `clawr1 run` picks a free "
                               "port.")
    keep_weight_versions: PositiveInt = Field(2, description="How many published weight directories stay on disk.")
    weight_sync: Literal["disk", "http", "nccl", "ipc"] = Field(
        "disk", description="disk: safetensors in RUN_DIR/weights + /update_weights_from_disk (the engines must see "
        "that directory); http: the safetensors bytes streamed into each embedded engine's "
        "/update_weights_from_tensor (no shared disk; the default with cluster.backend=ray and embedded engines); "
        "nccl: SGLang's distributed update; ipc: trainer and embedded engines on the same GPU, the tensors shared in "
        "place as CUDA IPC handles (clawr1/engine_api/ipc.py).")
    weight_sync_bucket_mb: PositiveInt = Field(512, description="nccl: tensors per /update_weights_from_distributed "
                                               "call, by size; ipc: the size of each shared bucket.")
    master_address: str = Field(
        "", description="nccl: the address the engines reach trainer rank 0's weight-update rendezvous at (a TCPStore "
        "on a free port). Empty: trainer.host when routable (`clawr1 run` on Ray sets it to rank 0's node address); "
        "else, with an engine on another machine, this machine's address on the route to it; else 127.0.0.1 "
        "(everything on one machine).")
    checkpoint_every: NonNegativeInt = Field(0, description="Steps between checkpoints; 0: never (each batch is "
                                             "committed right after its step).")
    keep_checkpoints: PositiveInt = Field(2, description="How many checkpoints stay on disk (the newest).")
    resume: bool = Field(False, description="Continue from the newest checkpoint in the run directory.")
    batch_wait_timeout_s: PositiveFloat = Field(600.0, description="Fail loudly if no batch arrives for this long "
                                                "(live runs wait forever).")


class AlgoConfig(Section):
    """The objective. Recipes differ only here (and in whether the judge computes a teacher)."""

    w_rl: NonNegativeFloat = Field(1.0, description="Weight of the RL advantage: A = w_rl * A_rl + w_opd * A_opd per "
                                   "token.")
    w_opd: NonNegativeFloat = Field(1.0, description="Weight of the OPD (hinted teacher) advantage in A = w_rl * A_rl "
                                    "+ w_opd * A_opd.")
    w_topk: NonNegativeFloat = Field(0.0, description="Scales the top-k KL loss to the teacher (needs "
                                     "judge.teacher_topk); 0: off.")
    opd_center: Literal["none", "sample"] = Field(
        "none", description="OPD advantage shaping: sample: minus each sample's mean gap (no length bias from a less "
        "confident teacher); none: the raw gap, as OpenClaw-RL.")
    opd_clip: NonNegativeFloat = Field(0.0, description="> 0 bounds every token's OPD advantage to [-opd_clip, "
                                       "opd_clip]; 0: off.")
    opd_baseline: Literal["student", "teacher"] = Field(
        "student", description="What the hinted teacher is measured against: student, the policy's own log-prob (the "
        "raw OPD gap); teacher, the same teacher without the hint, so the advantage is what the hint changes and a "
        "frozen teacher does not pull every token back toward the base model (needs the judge's unhinted teacher "
        "scores).")
    opd_gate: typing.Annotated[Literal["off", "signal"], SwitchWord] = Field(
        "off", description="signal: OPD is switched off while the teacher's summed gap does not sort the judge's "
        "scores better than chance (AUC over the last opd_gate_window scored samples with a hint, two standard "
        "errors): a teacher that misreads the hints (wordings it never learned) would push the wrong way "
        "(clawr1/algo/advantages.opd_gate).")
    opd_gate_window: PositiveInt = Field(256, description="opd_gate=signal: how many recent scored samples with a hint "
                                         "the AUC is taken over.")
    balance: Literal["none", "std"] = Field(
        "none", description="std: each signal divided by its standard deviation over the batch's tokens (RL: rewarded "
        "samples' tokens; OPD: teacher-scored tokens, gap against the rollout log-probs), so w_rl and w_opd weigh "
        "signals of equal spread (clawr1/algo/advantages.balance_scales); none: the raw signals.")
    baseline: Literal["group", "none"] = Field(
        "group", description="Scalar-reward baseline: group (GRPO: minus the group mean, / std if normalize_std); "
        "none (raw reward).")
    normalize_std: bool = Field(True, description="group baseline: divide by the group's reward std as well.")
    singleton_baseline: Literal["ema", "none"] = Field(
        "ema", description="Groups of one (live traffic): ema, minus a per-task running mean; none, the raw reward.")
    ema_decay: typing.Annotated[float, Field(ge=0.0, lt=1.0)] = Field(
        0.9, description="The ema baseline's decay: b <- decay * b + (1 - decay) * the task's mean reward in the "
        "batch.")
    # PPO clipped surrogate
    eps_clip_low: typing.Annotated[float, Field(ge=0.0, lt=1.0)] = Field(0.2, description="PPO clipped surrogate: "
                                                                         "the ratio's lower bound is 1 - "
                                                                         "eps_clip_low.")
    eps_clip_high: NonNegativeFloat = Field(0.28, description="The ratio's upper bound is 1 + eps_clip_high "
                                            "(\"clip-higher\": a larger upper bound keeps exploration alive).")
    dual_clip: NonNegativeFloat = Field(0.0, description="c > 1 caps the loss of negative-advantage tokens at -c*A; "
                                        "0: off.")
    loss_aggregation: Literal["token-mean", "seq-mean-token-mean"] = Field(
        "token-mean", description="token-mean: every token of the batch weighs the same; seq-mean-token-mean: each "
        "sample's tokens are averaged, then samples.")
    ppo_epochs: PositiveInt = Field(1, description="Passes over each batch.")
    minibatches: PositiveInt = Field(1, description="Optimizer steps per pass (the batch is split into this many "
                                     "parts).")
    # regularizers
    kl_coef: NonNegativeFloat = Field(0.0, description="KL to the frozen initial policy; 0: no reference model is "
                                      "kept.")
    kl_estimator: Literal["k1", "k2", "k3"] = Field("k3", description="Schulman's estimator of that KL: k1 (unbiased, "
                                                    "high variance), k2 (biased, low variance), k3 (unbiased, low "
                                                    "variance, never negative).")
    entropy_coef: NonNegativeFloat = Field(0.0, description="Bonus: the loss subtracts entropy_coef * entropy.")
    # off-policy correction
    tis_cap: NonNegativeFloat = Field(2.0, description="Truncated importance sampling cap on pi_old/pi_rollout; 0: "
                                      "off.")
    step_max_staleness: typing.Annotated[int, Field(ge=-1)] = Field(
        -1, description="The trainer's own bound, at each step: drop samples whose oldest token is more than this "
        "many versions behind the version the step trains (a batch may wait in the trainer after the pool made it "
        "under pool.max_staleness); -1: off, the pool's bound only.")

    @model_validator(mode="after")
    def _dual_clip_above_one(self) -> "AlgoConfig":
        if self.dual_clip and self.dual_clip <= 1.0:
            raise ValueError(f"algo.dual_clip must be 0 (off) or > 1, got {self.dual_clip}")
        return self


class LoraConfig(Section):
    """LoRA: the trainer trains low-rank adapters on a frozen base (clawr1/trainer/lora.py)."""

    enabled: bool = Field(False, description="Train LoRA adapters instead of the full weights.")
    rank: PositiveInt = Field(8, description="The adapters' rank (at most serve.max_lora_rank).")
    alpha: PositiveFloat = Field(16.0, description="The adapter's output is scaled by alpha / rank.")
    targets: list[Literal["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"]] = Field(
        default_factory=lambda: ["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"],
        description="The layers adapted: linear_qkv (q, k, v projections), linear_proj (attention output), "
        "linear_fc1 (MLP gate and up), linear_fc2 (MLP down).")
    per_user: bool = Field(False, description="One adapter per user, each in its own slot with its own optimizer "
                           "state.")
    sync: Literal["adapter", "merged"] = Field(
        "adapter", description="adapter: each publish loads `<slot name>@v<N>` into the engines and the gateway routes "
        "to it (only the adapters travel); merged: slot 0 merged into full weights, published as without LoRA (no "
        "per-user adapters then).")
    slots: PositiveInt = Field(1, description="Adapters trained at once (per_user: the most users with an adapter of "
                               "their own).")
    init_seed: int = Field(0, description="The seed of every slot's initial A (B starts at zero).")
    max_rank: NonNegativeInt = Field(0, description="`clawr1 tinker-serve`: the largest LoRA rank a training client "
                                     "may ask for (the Tinker SDK's default is 32); each slot is built at this rank "
                                     "and a client of rank r trains its first r components. 0: lora.rank.")

    @property
    def slot_rank(self) -> int:
        """The rank each slot is built at: max_rank where set, else rank."""
        return self.max_rank or self.rank

    @property
    def serves_adapters(self) -> bool:
        """Adapters travel to the engines and serve as adapters (lora.sync=adapter), not merged into the weights."""
        return self.enabled and self.sync == "adapter"

    @model_validator(mode="after")
    def _slots(self) -> "LoraConfig":
        if self.slots > 1 and not self.per_user:
            raise ValueError(f"lora.slots={self.slots} holds one adapter per user: set lora.per_user=true (or slots=1)")
        return self


Strategy = Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"]  # Ray's placement group strategies
RAY_ROLES = ("trainer", "engine", "prm", "teacher", "gateway", "judge", "pool", "rollout")


class RayPlacementConfig(Section):
    """How a run is placed on a Ray cluster (cluster.backend=ray); see clawr1/placement.py.

    GPU counts, not device indices: a role's GPUs may span nodes. Every loop gets one bundle: a trainer rank one
    GPU, a policy engine serve.sglang.tp_size GPUs, the PRM and teacher engines all of theirs, the other loops none.
    """

    actor_gpus: NonNegativeInt = Field(0, description="Trainer GPUs, one per rank (data_parallel = actor_gpus / "
                                       "tensor_parallel); 0: CPU ranks.")
    rollout_gpus: NonNegativeInt = Field(0, description="Policy engines, tp_size GPUs each (num_engines derived); 0: "
                                         "CPU engines.")
    prm_gpus: NonNegativeInt = Field(0, description="The PRM engine `clawr1 run` starts for the llm judge; 0: on CPU.")
    teacher_gpus: NonNegativeInt = Field(0, description="The frozen/lagged teacher engine; 0: on CPU.")
    cpus_per_loop: PositiveFloat = Field(1.0, description="CPUs each bundle reserves for its loop's process.")
    trainer_strategy: Strategy = Field("PACK", description="Trainer ranks close together (NCCL within a node where "
                                       "they fit).")
    engine_strategy: Strategy = Field("SPREAD", description="Policy, PRM and teacher engines over the nodes.")
    loop_strategy: Strategy = Field("PACK", description="Gateway, judge, pool, rollout.")
    resources: dict[str, dict[str, PositiveFloat]] = Field(
        default_factory=dict, description="Extra Ray resources a role's bundles ask for: a node started with `ray "
        "start --resources='{\"trainer_node\": 1}'` and {trainer: {trainer_node: 0.01}} here keeps every trainer rank "
        "on such nodes. Roles: trainer, engine, prm, teacher, gateway, judge, pool, rollout.")
    placement_timeout_s: PositiveFloat = Field(120.0, description="How long the run waits for Ray to reserve its "
                                               "bundles.")

    @model_validator(mode="after")
    def _known_roles(self) -> "RayPlacementConfig":
        unknown = sorted(set(self.resources) - set(RAY_ROLES))
        if unknown:
            raise ValueError(f"cluster.ray.resources: unknown role {unknown[0]!r}; roles: {', '.join(RAY_ROLES)}")
        return self

    @property
    def gpu_counts(self) -> dict[str, int]:
        return {"actor_gpus": self.actor_gpus, "rollout_gpus": self.rollout_gpus, "prm_gpus": self.prm_gpus,
                "teacher_gpus": self.teacher_gpus}


class ClusterConfig(Section):
    """Where the run's processes go. backend=local (default): this machine, `clawr1 run` starts every loop
    as a child process; backend=ray: the loops are placed on a Ray cluster (clawr1/ray_run.py).

    Local: which GPUs of this node each part of the run uses; launch/*.sh fills it from ACTOR_GPUS etc.
    All empty: nothing is pinned (CPU, or one GPU shared). Otherwise `clawr1 run` gives every process it
    starts its CUDA_VISIBLE_DEVICES from here, and derives trainer.data_parallel (actor GPUs /
    trainer.tensor_parallel) and serve.num_engines (rollout GPUs / serve.sglang.tp_size). See clawr1/cluster.py.
    """

    backend: Literal["local", "ray"] = Field("local", description="local: `clawr1 run` starts every loop as a child "
                                             "process on this machine; ray: the loops are placed on a Ray cluster.")
    ray_address: str = Field("", description="ray: the cluster to join; empty: the RAY_ADDRESS environment variable.")
    ray: RayPlacementConfig = Field(default_factory=RayPlacementConfig, description="How the run is placed on the "
                                    "Ray cluster (backend=ray).")
    actor_gpus: list[NonNegativeInt] = Field(default_factory=list, description="local: trainer ranks, one GPU each "
                                             "(device indices).")
    rollout_gpus: list[NonNegativeInt] = Field(default_factory=list, description="local: policy engines (SGLang), "
                                               "tp_size GPUs each.")
    prm_gpus: list[NonNegativeInt] = Field(default_factory=list, description="local: the llm judge's PRM engine, "
                                           "tensor-parallel over all.")
    teacher_gpus: list[NonNegativeInt] = Field(default_factory=list, description="local: the frozen/lagged teacher "
                                               "engine (judge.teacher=frozen or lagged).")

    @model_validator(mode="after")
    def _one_kind_of_gpu_list(self) -> "ClusterConfig":
        local = [k for k in ("actor_gpus", "rollout_gpus", "prm_gpus", "teacher_gpus") if getattr(self, k)]
        if self.backend == "ray" and local:
            raise ValueError(f"cluster.{local[0]} lists device indices of one node; with cluster.backend=ray give a "
                             f"GPU count instead: cluster.ray.{local[0]}")
        counted = [k for k, n in self.ray.gpu_counts.items() if n]
        if self.backend == "local" and counted:
            raise ValueError(f"cluster.ray.{counted[0]} is set but cluster.backend=local; set cluster.backend=ray "
                             f"(or give this node's devices in cluster.{counted[0]})")
        return self


class TrackingConfig(Section):
    wandb_mode: Literal["offline", "online", "disabled"] = Field(
        "offline", description="Weights & Biases: offline (files in the run directory), online, or disabled; the key "
        "comes from WANDB_API_KEY.")
    project: str = Field("clawr1", description="The wandb project.")
    entity: str = Field("", description="The wandb entity (team or user); empty: the key's default.")
    name: str = Field("", description="The wandb run name; empty: the run directory's name.")


class TinkerConfig(Section):
    """Tinker's API: `clawr1 tinker-serve` serves it from this machine's engine and trainer (docs/tinker.md)."""

    host: str = Field("127.0.0.1", description="Where `clawr1 tinker-serve` listens.")
    port: NonNegativeInt = Field(0, description="Its port (0: a free one, printed at start).")
    model_name: str = Field("", description="The base model name clients name and `get_info` reports; empty: the "
                            "model directory's name. tinker-cookbook's recipes need an `org/model` name in their "
                            "tables whose chat format the model speaks (docs/tinker.md).")
    api_key_env: str = Field("TINKER_API_KEY", description="The environment variable holding the key: the one "
                             "`clawr1 tinker-serve` requires of clients (unset: any key is accepted), and the one "
                             "trainer.backend=tinker and serve.backend=tinker send. It is never logged or written.")
    session_ttl_s: PositiveFloat = Field(45.0, description="`clawr1 tinker-serve` finishes a session whose client "
                                         "sent no heartbeat for this long (the SDK sends one every 10 s): its "
                                         "training slots are freed; what it saved stays loadable.")
    # trainer.backend=tinker / serve.backend=tinker: training and sampling through Tinker's API
    base_url: str = Field("", description="The Tinker service (trainer.backend=tinker, serve.backend=tinker); empty: "
                          "the SDK's default, Tinker's own service; or a `clawr1 tinker-serve` URL.")
    base_model: str = Field("", description="The base model Tinker trains and samples (e.g. "
                            "Qwen/Qwen3-4B-Instruct-2507); empty: model.path's directory name. model.path must hold the "
                            "same model's tokenizer and config.json (the weights are not needed on this machine).")
    lora_rank: PositiveInt = Field(32, description="The LoRA rank of the training client Tinker creates.")
    loss_fn: Literal["ppo", "importance_sampling", "cispo"] = Field(
        "ppo", description="Tinker's loss for each step; ppo clips the ratio to sampling at [1 - algo.eps_clip_low, "
        "1 + algo.eps_clip_high].")
    request_timeout_s: PositiveFloat = Field(600.0, description="How long one Tinker call (a step's forward_backward, "
                                             "a sample) may take before the loop fails loudly.")


class Config(Addresses, Section):
    run: RunConfig = Field(default_factory=RunConfig, description="The run as a whole: its directory, mode, steps, "
                           "seed, timeouts and what happens when a loop fails.")
    model: ModelConfig = Field(default_factory=ModelConfig, description="The policy model and how its chat template "
                               "renders, parses tool calls and reasoning.")
    serve: ServeConfig = Field(default_factory=ServeConfig, description="The inference engines that serve the "
                               "policy: backend, ports, memory and LoRA serving.")
    gateway: GatewayConfig = Field(default_factory=GatewayConfig, description="The OpenAI-compatible gateway: "
                                   "sessions, request limits, the outbox to the judge and the API key.")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="The rollout loop (run.mode=env): the "
                                   "environment, concurrency, sampling and evaluation.")
    judge: JudgeConfig = Field(default_factory=JudgeConfig, description="The judge: how turns are scored, the teacher "
                               "and its hints, and deliberate noise.")
    pool: PoolConfig = Field(default_factory=PoolConfig, description="The durable sample pool between the judge and "
                             "the trainer: batching, staleness, storage.")
    trainer: TrainerConfig = Field(default_factory=TrainerConfig, description="The trainer: optimizer, parallelism, "
                                   "precision, weight publishing and checkpoints.")
    algo: AlgoConfig = Field(default_factory=AlgoConfig, description="The objective: how the RL and OPD signals "
                             "become advantages, and the PPO loss.")
    lora: LoraConfig = Field(default_factory=LoraConfig, description="LoRA adapters instead of full weights, one per "
                             "user if asked.")
    cluster: ClusterConfig = Field(default_factory=ClusterConfig, description="The GPUs of each role on this "
                                   "machine (backend=local), or the run's placement on a Ray cluster (backend=ray).")
    tracking: TrackingConfig = Field(default_factory=TrackingConfig, description="Experiment tracking with Weights "
                                     "& Biases.")
    tinker: TinkerConfig = Field(default_factory=TinkerConfig, description="Tinker's API served from this "
                                 "machine (`clawr1 tinker-serve`).")

    # ---- settings that are each valid but contradict each other: one named validator per rule, run in this order
    @model_validator(mode="after")
    def _weight_sync_on_ray_defaults_to_http(self) -> "Config":
        """trainer.weight_sync, unless set: http for embedded engines on a Ray cluster (no disk shared with them;
        the lagged teacher reads published directories, so it keeps disk)."""
        if (self.cluster.backend == "ray" and self.serve.backend == "embedded" and self.judge.teacher != "lagged"
                and "weight_sync" not in self.trainer.model_fields_set):
            self.trainer.weight_sync = "http"
        return self

    @model_validator(mode="after")
    def _fused_lm_head_holds_the_whole_vocabulary(self) -> "Config":
        if "lmhead" in self.trainer.fused_kernels and self.trainer.tensor_parallel > 1:
            raise ValueError("trainer.fused_kernels lmhead computes the softmax over the whole vocabulary on one rank: "
                             "it needs trainer.tensor_parallel=1")
        return self

    @model_validator(mode="after")
    def _prefix_trees_need_the_trainers_own_attention(self) -> "Config":
        if self.trainer.share_prefixes and self.trainer.transformer_engine == "on":
            raise ValueError("trainer.share_prefixes packs prefix trees that only the trainer's own core attention "
                             "masks (megatron's local layers); with trainer.transformer_engine=on set one")
        return self

    @model_validator(mode="after")
    def _fused_kernels_replace_the_local_layers_only(self) -> "Config":
        if self.trainer.fused_kernels and self.trainer.transformer_engine == "on":
            raise ValueError("trainer.fused_kernels replace megatron-core's local (non-TransformerEngine) layers; with "
                             "trainer.transformer_engine=on, TransformerEngine's own fused layers are used: set one")
        return self

    @model_validator(mode="after")
    def _decode_cuda_graphs_replay_the_paged_step_on_cuda(self) -> "Config":
        s = self.serve
        if s.decode_cuda_graph and (s.device != "cuda" or s.decode_attention != "paged"):
            raise ValueError("serve.decode_cuda_graph replays the paged decode step on a GPU: it needs "
                             "serve.device=cuda and serve.decode_attention=paged")
        return self

    @model_validator(mode="after")
    def _env_runs_have_a_step_count(self) -> "Config":
        if self.run.mode == "env" and not self.run.max_steps:
            raise ValueError("run.max_steps=0 (no limit) is for live runs (run.mode=live); an env run needs a step count")
        return self

    @model_validator(mode="after")
    def _pool_backlog_holds_a_batch(self) -> "Config":
        backlog = self.rollout.max_pool_backlog
        if backlog and backlog < self.pool.batch_size:
            raise ValueError(f"rollout.max_pool_backlog ({backlog}) must be 0 or at least pool.batch_size "
                             f"({self.pool.batch_size}), or the trainer would wait forever")
        return self

    @model_validator(mode="after")
    def _prm_engine_speaks_the_judges_api(self) -> "Config":
        j = self.judge
        if j.runs_own_prm and self.serve.backend == "embedded" and j.llm_api == "openai":
            raise ValueError("the PRM engine `clawr1 run` starts is the embedded engine, which serves /generate only: "
                             "set judge.llm_api=generate, or judge.llm_url to an OpenAI-compatible endpoint")
        if j.prm == "policy" and (j.llm_url or j.llm_api != "generate"):
            raise ValueError("judge.prm=policy sends the votes to the serving engine's /generate: leave judge.llm_url "
                             "empty and set judge.llm_api=generate")
        return self

    @model_validator(mode="after")
    def _lagged_teacher_reads_published_weights(self) -> "Config":
        if self.judge.teacher == "lagged" and self.trainer.weight_sync != "disk":
            raise ValueError("judge.teacher=lagged is refreshed from the published weight directories: it needs "
                             "trainer.weight_sync=disk")
        return self

    @model_validator(mode="after")
    def _noise_rates_are_probabilities(self) -> "Config":
        j = self.judge
        if j.score_noise + j.score_abstain > 1:
            raise ValueError(f"judge.score_noise + judge.score_abstain must be at most 1, got "
                             f"{j.score_noise} + {j.score_abstain}")
        if j.hint_noise + j.hint_drop > 1:
            raise ValueError(f"judge.hint_noise + judge.hint_drop must be at most 1, got {j.hint_noise} + {j.hint_drop}")
        return self

    @model_validator(mode="after")
    def _directive_hints_have_directives(self) -> "Config":
        j = self.judge
        if j.rules_hint == "directive" and not j.directives:
            raise ValueError("judge.rules_hint=directive maps corrections to configured options: judge.directives is empty")
        if j.hint_noise_kind == "contradict" and j.hint_noise and not j.directives:
            raise ValueError("judge.hint_noise_kind=contradict draws another option of the kind a hint names: "
                             "it needs judge.directives")
        return self

    @model_validator(mode="after")
    def _teacher_baseline_needs_a_teacher(self) -> "Config":
        if self.algo.opd_baseline == "teacher" and self.judge.teacher == "none":
            raise ValueError("algo.opd_baseline=teacher compares the teacher with and without the hint: set judge.teacher")
        return self

    @model_validator(mode="after")
    def _per_user_adapters_are_served_as_adapters(self) -> "Config":
        if self.lora.per_user and not self.lora.enabled:
            raise ValueError("lora.per_user trains one adapter per user: set lora.enabled=true")
        if self.lora.per_user and self.lora.sync != "adapter":
            raise ValueError("lora.per_user serves each user their own adapter: it needs lora.sync=adapter")
        return self

    @model_validator(mode="after")
    def _engines_hold_the_adapters(self) -> "Config":
        """serve.max_loras, unless set: 3 × lora.slots + 1 where adapters are served (each slot's newest version,
        the one before and the next, and one spare)."""
        if not self.lora.serves_adapters:
            return self
        if "max_loras" not in self.serve.model_fields_set:
            self.serve.max_loras = 3 * self.lora.slots + 1
        if self.serve.max_loras < 3 * self.lora.slots:
            raise ValueError(f"serve.max_loras ({self.serve.max_loras}) must hold three versions of each of the "
                             f"{self.lora.slots} adapters (lora.slots): the newest, the one before, the next")
        if self.lora.slot_rank > self.serve.max_lora_rank:
            raise ValueError(f"lora.rank or lora.max_rank ({self.lora.slot_rank}) exceeds serve.max_lora_rank "
                             f"({self.serve.max_lora_rank})")
        if self.judge.teacher == "lagged":
            raise ValueError("judge.teacher=lagged refreshes a teacher engine with full weights; with lora.sync=adapter "
                             "use judge.teacher=policy (the base, adapter off) or frozen")
        return self

    @model_validator(mode="after")
    def _distillation_has_a_teacher(self) -> "Config":
        if self.algo.w_topk and not self.judge.teacher_topk:
            raise ValueError("algo.w_topk > 0 needs the judge to record the teacher's top-k: set judge.teacher_topk")
        if (self.algo.w_opd or self.algo.w_topk) and self.judge.teacher == "none":
            raise ValueError("algo.w_opd or algo.w_topk > 0 needs a teacher: set judge.teacher to policy or frozen "
                             "(or the weights to 0)")
        return self

    @model_validator(mode="after")
    def _tinker_backends_go_together(self) -> "Config":
        self._check_tinker()
        return self

    @model_validator(mode="after")
    def _weight_sync_fits_the_engines(self) -> "Config":
        sync, backend = self.trainer.weight_sync, self.serve.backend
        if sync == "nccl" and backend != "sglang" and not self.gateway.engine_urls:
            raise ValueError("trainer.weight_sync=nccl pushes into SGLang engines: set serve.backend=sglang")
        if sync == "http" and backend != "embedded":
            raise ValueError("trainer.weight_sync=http streams safetensors into the embedded engine's "
                             "/update_weights_from_tensor; SGLang engines take trainer.weight_sync=nccl or disk")
        if sync == "ipc" and (backend != "embedded" or self.cluster.backend != "local" or self.gateway.engine_urls):
            raise ValueError("trainer.weight_sync=ipc shares the trainer's tensors in place with the embedded engines "
                             "it starts on the same machine (serve.backend=embedded, cluster.backend=local, no "
                             "gateway.engine_urls)")
        return self

    def _check_tinker(self) -> None:
        """trainer.backend=tinker and serve.backend=tinker go together, without what only the Megatron trainer has."""
        if (self.trainer.backend == "tinker") != (self.serve.backend == "tinker"):
            raise ValueError("trainer.backend=tinker and serve.backend=tinker go together: the engines sample the "
                             "weights the Tinker trainer saves (set both, or neither)")
        if self.trainer.backend != "tinker":
            return
        a = self.algo
        unsupported = {"lora.enabled": self.lora.enabled, "algo.kl_coef": a.kl_coef, "algo.entropy_coef": a.entropy_coef,
                       "algo.w_topk": a.w_topk, "algo.dual_clip": a.dual_clip, "algo.ppo_epochs": a.ppo_epochs > 1,
                       "algo.minibatches": a.minibatches > 1, "judge.teacher=lagged": self.judge.teacher == "lagged",
                       "cluster.backend=ray": self.cluster.backend == "ray",
                       "gateway.engine_urls": bool(self.gateway.engine_urls)}
        named = [k for k, v in unsupported.items() if v]
        if named:
            raise ValueError(f"trainer.backend=tinker does not support {', '.join(named)} (docs/tinker.md): Tinker "
                             "trains its own LoRA (tinker.lora_rank) with one loss call per step and no reference "
                             "model")

    @property
    def run_dir(self) -> Path:
        return Path(self.run.dir).expanduser()


# keys renamed since they were introduced -> their names now: an old recipe gets the new name in its error
RENAMED_KEYS = {"algo.max_staleness": "algo.step_max_staleness"}


class ConfigError(ValueError):
    """A config file or override that does not fit the tree."""


# ---------------------------------------------------------------- error messages


def _section_at(loc: tuple) -> type[BaseModel] | None:
    """The section class a location's last key belongs to (None when the path leaves the tree)."""
    cls: Any = Config
    for key in loc[:-1]:
        if not (isinstance(cls, type) and issubclass(cls, BaseModel)) or key not in cls.model_fields:
            return None
        cls = cls.model_fields[key].annotation
    return cls if isinstance(cls, type) and issubclass(cls, BaseModel) else None


def _choices(loc: tuple) -> list[str]:
    section = _section_at(loc)
    if section is None or loc[-1] not in section.model_fields:
        return []
    annotation = section.model_fields[loc[-1]].annotation
    return [str(v) for v in typing.get_args(annotation)] if typing.get_origin(annotation) is Literal else []


def _describe(error: dict) -> str:
    """One line for one pydantic error: the dotted key, the bad value, and what is allowed."""
    loc = tuple(error["loc"])
    where = ".".join(str(p) for p in loc) or "config"
    kind, value = error["type"], error.get("input")
    if kind == "extra_forbidden" and where in RENAMED_KEYS:
        return f"{where} is now {RENAMED_KEYS[where]}"
    if kind == "extra_forbidden":
        section = _section_at(loc)
        known = sorted(section.model_fields) if section else []
        close = difflib.get_close_matches(str(loc[-1]), known, n=1)
        hint = f" (did you mean {'.'.join(str(p) for p in loc[:-1] + (close[0],))}?)" if close else ""
        return f"unknown key {where}{hint}; keys here: {', '.join(known)}"
    if kind == "literal_error":
        return f"{where}: {value!r} is not allowed; choose one of: {', '.join(_choices(loc))}"
    if kind == "value_error":  # our own checks: their messages name the keys
        return str(error["msg"]).removeprefix("Value error, ")
    return f"{where}: {error['msg'].removeprefix('Value error, ')} (got {value!r})"


def _validated(cls: type[BaseModel], data: dict) -> Any:
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        raise ConfigError("; ".join(_describe(err) for err in e.errors(include_url=False))) from None


# ---------------------------------------------------------------- loading


def _deep_merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _read_yaml(path: Path) -> dict:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping")
    include = data.pop("include", None)
    if include:
        data = _deep_merge(_read_yaml((path.parent / include).resolve()), data)
    return data


def parse_override(text: str) -> dict:
    """`a.b.c=value` -> {"a": {"b": {"c": value}}}, the value parsed as YAML."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} is not of the form key.path=value")
    key, raw = text.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError as e:
        raise ConfigError(f"override {text!r}: the value is not valid YAML: {e}") from None
    out: dict = {}
    node = out
    parts = key.strip().split(".")
    for p in parts[:-1]:
        node = node.setdefault(p, {})
    node[parts[-1]] = value
    return out


def load_config(path: str | os.PathLike | None = None, overrides: list[str] | None = None) -> Config:
    """The recipe at `path` (or the defaults) with dotted overrides, validated as a whole (ConfigError)."""
    data = _read_yaml(Path(path)) if path else {}
    for o in overrides or []:
        data = _deep_merge(data, parse_override(o))
    return _validated(Config, data)


def to_dict(cfg: BaseModel) -> dict:
    return cfg.model_dump(mode="json")


def save_config(cfg: Config, path: str | os.PathLike) -> None:
    Path(path).write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
