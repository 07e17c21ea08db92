"""One typed config tree for every loop.

A recipe is a YAML file whose keys mirror `Config` below. Every default lives in
this file. A YAML file may `include:` another (path relative to itself) and
override parts of it; the command line adds dotted overrides such as
`trainer.lr=1e-5`. Unknown keys are errors, not silently ignored.
"""
from __future__ import annotations

import dataclasses
import os
import socket
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


@dataclass
class RunConfig:
    dir: str = ""  # everything a run writes lands here; empty: runs/<recipe>-<time> (clawr1 run)
    seed: int = 0
    max_steps: int = 8  # trainer steps; each one publishes a weight version
    startup_timeout_s: float = 300.0  # how long `clawr1 run` waits for a loop to become ready
    stop_timeout_s: float = 20.0  # SIGTERM grace before SIGKILL


@dataclass
class TinyModelConfig:
    """The tiny Qwen2-architecture model `clawr1 init-model` builds and warm-starts."""

    vocab_size: int = 1024
    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 384
    max_position_embeddings: int = 1024
    rope_theta: float = 10000.0
    sft_steps: int = 900
    sft_batch_size: int = 32
    sft_lr: float = 6e-3
    sft_examples: int = 6000
    seed: int = 1234


@dataclass
class ModelConfig:
    path: str = ""  # an HF model directory; empty means the tiny model (built on first use)
    cache_dir: str = "~/.cache/clawr1"  # where the tiny model is cached
    tiny: TinyModelConfig = field(default_factory=TinyModelConfig)


@dataclass
class SGLangConfig:
    """Flags for `python -m sglang.launch_server` (serve.backend=sglang, GPU machines)."""

    tp_size: int = 1
    mem_fraction_static: float = 0.0  # 0: SGLang's own default
    context_length: int = 0  # 0: the model's
    tool_call_parser: str = "qwen25"
    reasoning_parser: str = ""  # e.g. qwen3 for thinking models; empty: none
    dtype: str = "auto"
    extra_args: list[str] = field(default_factory=list)  # any further launch_server flags, verbatim
    startup_timeout_s: float = 900.0


@dataclass
class ServeConfig:
    backend: str = "embedded"  # embedded | sglang
    host: str = "127.0.0.1"
    port: int = 0  # 0: `clawr1 run` picks a free port
    num_threads: int = 1  # torch threads for the embedded engine
    max_running_requests: int = 32
    dtype: str = "float32"
    num_engines: int = 1  # `clawr1 run` starts this many engines (ports serve.port, extra_ports...)
    extra_ports: list[int] = field(default_factory=list)  # ports of engines 2..n (filled by `clawr1 run`)
    sglang: SGLangConfig = field(default_factory=SGLangConfig)


@dataclass
class GatewayConfig:
    host: str = "127.0.0.1"
    port: int = 0
    engine_urls: list[str] = field(default_factory=list)  # empty: the run's own engine
    session_ttl_s: float = 900.0
    max_sessions: int = 4096
    max_session_tokens: int = 20_000_000  # token ids held by all sessions together (memory pressure bound)
    max_request_bytes: int = 1_000_000
    max_prompt_tokens: int = 4096
    default_max_tokens: int = 256
    max_completion_tokens: int = 4096  # larger max_tokens requests get a 400
    judge_queue_size: int = 4096  # bounded queue of TurnRecords waiting for the judge
    api_key_env: str = "CLAWR1_API_KEY"  # name of the environment variable holding the key
    api_key_file: str = ""  # or a file holding it
    model_name: str = "clawr1-policy"


@dataclass
class RolloutConfig:
    env: str = "envs.personal.env:PersonalEnv"  # import path of the environment class
    env_args: dict[str, Any] = field(default_factory=dict)  # passed to the environment
    concurrency: int = 8  # simulated users / episodes in flight
    max_tokens: int = 48
    temperature: float = 1.0
    top_p: float = 1.0
    # start new episodes only while the pool holds fewer pending samples than this (0: no bound, as for
    # live traffic); keeps synthetic rollout from running far ahead of the trainer
    max_pool_backlog: int = 0
    eval_every: int = 0  # evaluate held-out tasks every k weight versions (0: never)
    eval_size: int = 32
    request_timeout_s: float = 120.0


@dataclass
class JudgeConfig:
    backend: str = "rules"  # rules | llm | env
    host: str = "127.0.0.1"
    port: int = 0  # gateway -> judge TurnRecords (PUSH/PULL)
    teacher: str = "policy"  # policy (self-distillation) | frozen | none
    teacher_url: str = ""  # frozen teacher engine; empty with teacher=frozen: `clawr1 run` starts one on the base weights
    teacher_port: int = 0  # port of that engine (filled by `clawr1 run`)
    teacher_topk: int = 0  # also record the teacher's top-k log-probs per token (for algo.w_topk); 0: off
    concurrency: int = 8
    # a next user message matching any of these says the turn was wrong (score -1)
    correction_patterns: list[str] = field(
        default_factory=lambda: [r"^\s*no\b", r"\bi asked\b", r"\bwrong\b", r"\bnot what\b", r"\bagain\b"]
    )
    # sentences matching these say what to do instead; they become the hint (and also score -1)
    directive_patterns: list[str] = field(
        default_factory=lambda: [r"\bplease\b", r"\binstead\b", r"\bi want\b", r"\bi prefer\b", r"\bdon't\b",
                                 r"\bdo not\b", r"\bshould\b", r"\bmust\b", r"\bneed to\b"]
    )
    max_hint_chars: int = 400
    # llm backend (and the PRM step score of the env backend): any OpenAI-compatible endpoint, or SGLang /generate
    llm_url: str = ""  # e.g. http://prm-host:30000/v1 (openai) or http://prm-host:30000 (generate)
    llm_api: str = "openai"  # openai | generate (text prompt rendered in ChatML)
    llm_model: str = "default"
    llm_api_key_env: str = "CLAWR1_JUDGE_API_KEY"  # environment variable holding the endpoint's key, if any
    votes: int = 3  # m evaluation votes and m hint votes per turn, run concurrently
    last_k_turns: int = 4  # the judge sees this many messages before the turn
    vote_temperature: float = 0.6
    vote_max_tokens: int = 512
    min_hint_chars: int = 10
    # env backend
    env_reward: str = "last_turn"  # last_turn | all_turns (every turn of the session gets the outcome)
    prm_coef: float = 0.0  # > 0: add prm_coef * (PRM majority vote) to each turn's reward (needs llm_url)
    max_held_sessions: int = 10_000  # all_turns: sessions whose turns wait for their outcome
    # with llm_url empty, `clawr1 run` starts a PRM engine itself (on cluster.prm_gpus when given)
    prm_model_path: str = ""  # the PRM engine's model; empty: model.path (the policy's base model)
    prm_port: int = 0  # port of that engine (filled by `clawr1 run`)

    @property
    def needs_llm(self) -> bool:
        return self.backend == "llm" or (self.backend == "env" and self.prm_coef > 0)

    @property
    def runs_own_prm(self) -> bool:
        """`clawr1 run` starts the PRM engine: the judge needs one and none is configured."""
        return self.needs_llm and not self.llm_url

    @property
    def runs_own_teacher(self) -> bool:
        """`clawr1 run` starts the frozen teacher engine: one is needed and none is configured."""
        return self.teacher == "frozen" and not self.teacher_url


@dataclass
class PoolConfig:
    host: str = "127.0.0.1"
    samples_port: int = 0  # judge -> pool (acked once durable)
    batches_port: int = 0  # trainer <-> pool
    batch_size: int = 16
    max_staleness: int = 4  # drop samples whose oldest token is older than this many versions
    fsync: bool = True
    max_pending: int = 100_000  # refuse (nack) new samples beyond this backlog
    group_size: int = 1  # a group (same group_id) is batched once it has this many samples...
    group_timeout_s: float = 60.0  # ...or once its first sample is this old


@dataclass
class TrainerConfig:
    lr: float = 1e-4
    lr_schedule: str = "constant"  # constant | cosine (linear warmup, then cosine down to min_lr_ratio * lr)
    warmup_steps: int = 0
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0  # applied to matrices only, not to norms and biases
    adam_betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    adam_eps: float = 1e-8
    grad_clip: float = 1.0  # max global grad norm (0: no clipping)
    max_tokens_per_microbatch: int = 4096
    logprob_chunk_tokens: int = 1024  # log-probs are computed this many tokens at a time
    num_threads: int = 1
    tensor_parallel: int = 1
    data_parallel: int = 1
    precision: str = "fp32"  # fp32 | bf16 (bf16 needs CUDA)
    transformer_engine: str = "auto"  # auto (use it when CUDA and TE are present) | on | off
    host: str = "127.0.0.1"
    publish_port: int = 0  # PUB socket announcing WeightsPublished
    keep_weight_versions: int = 2  # how many published weight directories stay on disk
    weight_sync: str = "disk"  # disk (safetensors + /update_weights_from_disk) | nccl (SGLang distributed update)
    weight_sync_bucket_mb: int = 512  # nccl: tensors per /update_weights_from_distributed call, by size
    checkpoint_every: int = 0  # steps between checkpoints; 0: never (each batch is committed right after its step)
    keep_checkpoints: int = 2
    resume: bool = False  # continue from the newest checkpoint in the run directory
    batch_wait_timeout_s: float = 600.0  # fail loudly if no batch arrives for this long


@dataclass
class AlgoConfig:
    """The objective. Recipes differ only here (and in whether the judge computes a teacher)."""

    # weights of the three signals: A = w_rl * A_rl + w_opd * A_opd per token; w_topk scales the top-k KL loss
    w_rl: float = 1.0
    w_opd: float = 1.0
    w_topk: float = 0.0
    # scalar-reward baseline: group (GRPO: minus the group mean, / std if normalize_std) | none (raw reward)
    baseline: str = "group"
    normalize_std: bool = True
    singleton_baseline: str = "ema"  # groups of one (live traffic): ema (per-task running mean) | none
    ema_decay: float = 0.9
    # PPO clipped surrogate
    eps_clip_low: float = 0.2
    eps_clip_high: float = 0.28  # "clip-higher": a larger upper bound keeps exploration alive
    dual_clip: float = 0.0  # c > 1 caps the loss of negative-advantage tokens at -c*A; 0: off
    loss_aggregation: str = "token-mean"  # token-mean | seq-mean-token-mean
    ppo_epochs: int = 1  # passes over each batch
    minibatches: int = 1  # optimizer steps per pass (the batch is split into this many parts)
    # regularizers
    kl_coef: float = 0.0  # KL to the frozen initial policy; 0: no reference model is kept
    kl_estimator: str = "k3"  # k1 | k2 | k3
    entropy_coef: float = 0.0  # bonus: the loss subtracts entropy_coef * entropy
    # off-policy correction
    tis_cap: float = 2.0  # truncated importance sampling cap on pi_old/pi_rollout; 0: off
    max_staleness: int = -1  # the trainer also drops samples older than this many versions; -1: leave it to the pool
    temperature: float = 1.0  # must equal the sampling temperature the log-probs were taken at


@dataclass
class ClusterConfig:
    """Which GPUs of this node each part of the run uses; launch/*.sh fills it from ACTOR_GPUS etc.

    All empty: nothing is pinned (CPU, or one GPU shared). Otherwise `clawr1 run` gives every process it
    starts its CUDA_VISIBLE_DEVICES from here, and derives trainer.data_parallel (actor GPUs /
    trainer.tensor_parallel) and serve.num_engines (rollout GPUs / serve.sglang.tp_size). See clawr1/cluster.py.
    """

    actor_gpus: list[int] = field(default_factory=list)  # trainer ranks, one GPU each
    rollout_gpus: list[int] = field(default_factory=list)  # policy engines (SGLang), tp_size GPUs each
    prm_gpus: list[int] = field(default_factory=list)  # the PRM engine of the llm judge, tensor-parallel over all
    teacher_gpus: list[int] = field(default_factory=list)  # the frozen teacher engine (judge.teacher=frozen)


@dataclass
class TrackingConfig:
    wandb_mode: str = "offline"  # offline | online | disabled; the key comes from WANDB_API_KEY
    project: str = "clawr1"
    entity: str = ""
    name: str = ""


@dataclass
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    serve: ServeConfig = field(default_factory=ServeConfig)
    gateway: GatewayConfig = field(default_factory=GatewayConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    pool: PoolConfig = field(default_factory=PoolConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)

    # ---- derived addresses, so every loop finds every other from the same tree ----
    @property
    def run_dir(self) -> Path:
        return Path(self.run.dir).expanduser()

    @property
    def engine_url(self) -> str:
        return f"http://{self.serve.host}:{self.serve.port}"

    @property
    def engine_urls(self) -> list[str]:
        """Every engine the gateway routes to and the trainer updates: configured, or the run's own."""
        own = [self.engine_url] + [f"http://{self.serve.host}:{p}" for p in self.serve.extra_ports]
        return list(self.gateway.engine_urls) or own

    @property
    def teacher_engine_url(self) -> str:
        """Where the judge scores hint-enhanced prompts."""
        if self.judge.teacher == "frozen":
            return self.judge.teacher_url or f"http://{self.serve.host}:{self.judge.teacher_port}"
        return self.engine_urls[0]

    @property
    def prm_url(self) -> str:
        """Where the llm judge asks for votes: the configured endpoint, or the PRM engine the run starts."""
        if self.judge.llm_url:
            return self.judge.llm_url
        if not self.judge.prm_port:
            return ""
        base = f"http://{self.serve.host}:{self.judge.prm_port}"
        return base + "/v1" if self.judge.llm_api == "openai" else base

    @property
    def gateway_url(self) -> str:
        return f"http://{self.gateway.host}:{self.gateway.port}"

    @property
    def pool_samples_addr(self) -> str:
        return f"tcp://{self.pool.host}:{self.pool.samples_port}"

    @property
    def pool_batches_addr(self) -> str:
        return f"tcp://{self.pool.host}:{self.pool.batches_port}"

    @property
    def publish_addr(self) -> str:
        return f"tcp://{self.trainer.host}:{self.trainer.publish_port}"

    @property
    def judge_turns_addr(self) -> str:
        return f"tcp://{self.judge.host}:{self.judge.port}"


class ConfigError(ValueError):
    """A config file or override that does not fit the tree."""


def _convert(value: Any, annotation: Any, where: str) -> Any:
    origin = typing.get_origin(annotation)
    if dataclasses.is_dataclass(annotation):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        return _build(annotation, value, where)
    if annotation is Any:
        return value
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        (item_type,) = typing.get_args(annotation) or (Any,)
        return [_convert(v, item_type, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        return dict(value)
    if annotation is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if annotation is float and isinstance(value, str):  # YAML 1.1 reads "1e-5" as a string
        try:
            return float(value)
        except ValueError:
            pass
    if annotation in (int, float, str, bool):
        if not isinstance(value, annotation) or (annotation is int and isinstance(value, bool)):
            raise ConfigError(f"{where}: expected {annotation.__name__}, got {value!r}")
        return value
    return value


def _build(cls: type, data: dict, where: str = "") -> Any:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"unknown config key(s) {', '.join((where + '.' if where else '') + k for k in unknown)}")
    kwargs = {k: _convert(v, hints[k], f"{where}.{k}" if where else k) for k, v in data.items()}
    return cls(**kwargs)


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
    value = yaml.safe_load(raw) if raw != "" else ""
    out: dict = {}
    node = out
    parts = key.strip().split(".")
    for p in parts[:-1]:
        node = node.setdefault(p, {})
    node[parts[-1]] = value
    return out


def load_config(path: str | os.PathLike | None = None, overrides: list[str] | None = None) -> Config:
    data = _read_yaml(Path(path)) if path else {}
    for o in overrides or []:
        data = _deep_merge(data, parse_override(o))
    return _build(Config, data)


def to_dict(cfg: Config) -> dict:
    return dataclasses.asdict(cfg)


def save_config(cfg: Config, path: str | os.PathLike) -> None:
    Path(path).write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def assign_free_ports(cfg: Config) -> Config:
    """Give every port left at 0 a free one, so a whole run can start on a busy machine."""
    for section, name in [
        (cfg.serve, "port"), (cfg.gateway, "port"), (cfg.pool, "samples_port"),
        (cfg.pool, "batches_port"), (cfg.trainer, "publish_port"), (cfg.judge, "port"),
    ]:
        if getattr(section, name) == 0:
            setattr(section, name, free_port())
    while len(cfg.serve.extra_ports) < cfg.serve.num_engines - 1:
        cfg.serve.extra_ports.append(free_port())
    if cfg.judge.runs_own_teacher and not cfg.judge.teacher_port:
        cfg.judge.teacher_port = free_port()
    if cfg.judge.runs_own_prm and not cfg.judge.prm_port:
        cfg.judge.prm_port = free_port()
    return cfg
