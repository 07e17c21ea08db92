"""`clawr1 serve`: the embedded engine over HTTP (or SGLang, or the engine API in front of Tinker)."""
from __future__ import annotations

import logging
from pathlib import Path

import torch
import uvicorn

from clawr1.cluster import is_partitioned
from clawr1.config import Config
from clawr1.cpu_dtype import cpu_dtype
from clawr1.runtime import freeze_startup_objects, setup_logging
from clawr1.engine_api.lora import adapter_name, read_current
from clawr1.serving.adapters import AdapterError, read_peft_dir
from clawr1.serving.engine import Engine, RequestError
from clawr1.serving.packed_linear import prepacked_dtype_ok
from clawr1.serving.memory import (GIB, EngineMemoryError, EnginePlan, check_colocation, plan_engine, size_pool,
                                   trainer_bytes)
from clawr1.serving.server import create_app
from clawr1.model_path import resolve_model_path

log = logging.getLogger("clawr1.serve")


def load_published_adapters(engine: Engine, adapters_dir: Path) -> None:
    """A restarted engine of a run that publishes LoRA adapters takes the newest ones back (RUN_DIR/adapters)."""
    current = read_current(adapters_dir)
    if current is None:
        return
    version = current["version"]
    for slot in current["slots"]:
        where = adapters_dir / f"v{version:06d}" / f"slot{slot}"
        try:
            config, tensors = read_peft_dir(str(where))
            engine.load_adapter(adapter_name(slot, version), config, tensors, source=str(where))
        except (AdapterError, RequestError) as e:
            log.warning("could not load the published adapter %s: %s", where, e)
    log.info("loaded the published adapters of version %d: %s", version, sorted(engine.loaded_adapters()))


def engines_beside_trainer(cfg: Config) -> int:
    """How many embedded engines share the trainer's GPU: on one machine without a device partition every
    process uses the first GPU; with a partition (cluster.*_gpus, disjoint) none does."""
    if cfg.serve.device != "cuda" or cfg.cluster.backend != "local" or is_partitioned(cfg):
        return 0
    return cfg.serve.num_engines + int(cfg.judge.runs_own_teacher) + int(cfg.judge.runs_own_prm)


def check_memory(cfg: Config, path: Path, plan: EnginePlan) -> EnginePlan:
    """The plan with its KV pool sized within serve.memory_budget_gb; beside the trainer, all engines' budgets and
    the trainer within the card."""
    s = cfg.serve
    engines = engines_beside_trainer(cfg)
    if engines and not s.memory_budget_gb:
        raise EngineMemoryError("the engine shares the GPU with the trainer: set serve.memory_budget_gb, the GPU "
                                "memory each engine takes (the trainer gets the rest)")
    plan = size_pool(plan, s.memory_budget_gb, s.device, s.mem_fraction_static, s.max_total_tokens)
    if not engines:
        return plan
    t = cfg.trainer
    need = trainer_bytes(path, t.precision, t.max_tokens_per_microbatch, t.logprob_chunk_tokens)
    check_colocation(int(s.memory_budget_gb * GIB), engines, need, torch.cuda.get_device_properties(0).total_memory)
    return plan


def engine_dtype(cfg: Config) -> str:
    """serve.dtype, but float32 where bfloat16 on this CPU falls back (run.cpu_bf16), saying why."""
    if cfg.serve.dtype != "bfloat16" or cfg.serve.device != "cpu":
        return cfg.serve.dtype
    dtype, why = cpu_dtype(torch.bfloat16, cfg.run.cpu_bf16)
    if why:
        log.warning("engine: %s", why)
    return "bfloat16" if dtype == torch.bfloat16 else "float32"


def main(cfg: Config) -> int:
    setup_logging("serve")
    if cfg.serve.backend == "tinker":  # before the weights are looked for: a Tinker run's model.path needs none
        from clawr1.serving.tinker_client_engine import serve_tinker

        return serve_tinker(cfg)
    path = resolve_model_path(cfg.model)
    if cfg.serve.backend == "sglang":
        from clawr1.serving.sglang import serve_sglang

        return serve_sglang(cfg, str(path))
    torch.set_num_threads(cfg.serve.num_threads)
    s = cfg.serve
    dtype = engine_dtype(cfg)
    prepack = s.cpu_prepack and prepacked_dtype_ok(getattr(torch, dtype), torch.device(s.device))
    plan = plan_engine(path, dtype, s.max_running_requests, s.context_length, prepacked=prepack)
    try:
        plan = check_memory(cfg, path, plan)
    except EngineMemoryError as e:
        log.error("%s", e)
        return 2
    engine = Engine(path, dtype=dtype, max_running=s.max_running_requests, max_context=plan.context,
                    weight_version=s.weight_version, max_loras=s.max_loras, max_lora_rank=s.max_lora_rank,
                    device=s.device, max_total_tokens=plan.pool_tokens, prepack=prepack,
                    decode_attention=s.decode_attention, decode_cuda_graph=s.decode_cuda_graph,
                    sampler=s.sampler)
    log.info("engine on %s serving %s on %s (up to %d requests of up to %d tokens; weights %.2f GiB + a KV pool of "
             "%d tokens, %.2f GiB)", cfg.engine_url, path, s.device, plan.slots, plan.context,
             plan.weights_bytes / GIB, plan.pool_tokens, plan.kv_cache_bytes / GIB)
    if s.max_loras:
        load_published_adapters(engine, cfg.run_dir / "adapters")
    freeze_startup_objects()
    try:
        uvicorn.run(create_app(engine), host=cfg.serve.host, port=cfg.serve.port, log_level="warning", loop="uvloop", http="httptools",
                timeout_keep_alive=75)  # longer than clients keep idle connections: no reuse-vs-close race
    finally:
        engine.stop()
    return 0
