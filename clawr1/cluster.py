"""GPU partition: which processes of a run get which GPUs.

One node (cluster.backend=local): `launch/*.sh` turns NUM_GPUS, ACTOR_GPUS,
ROLLOUT_GPUS and PRM_GPUS into the `cluster` section (consecutive device
indices: actor first, then rollout, then PRM). `apply_partition` checks that it
adds up and derives the process counts from it; `visible_devices` says what
CUDA_VISIBLE_DEVICES each process gets. With the section empty (CPU) nothing is
pinned and nothing is derived.

A Ray cluster (cluster.backend=ray): GPU counts per role (`cluster.ray`), which
`apply_partition` checks against the recipe and turns into process counts the
same way; `bundle_gpus` says how many GPUs each loop's bundle holds, and Ray
picks the devices (clawr1/placement.py, clawr1/ray_run.py).
"""
from __future__ import annotations

from typing import Optional

from clawr1.config import Config, ConfigError


def is_partitioned(cfg: Config) -> bool:
    c = cfg.cluster
    return bool(c.actor_gpus or c.rollout_gpus or c.prm_gpus or c.teacher_gpus)


def _check_disjoint(groups: dict[str, list[int]]) -> None:
    owner: dict[int, str] = {}
    for name, gpus in groups.items():
        for g in gpus:
            if g in owner:
                raise ConfigError(f"GPU {g} is in both cluster.{owner[g]} and cluster.{name}")
            owner[g] = name


def apply_partition(cfg: Config) -> Config:
    """Validate the cluster section against the recipe and derive data_parallel and num_engines from it."""
    if cfg.cluster.backend == "ray":
        return _apply_ray_counts(cfg)
    if not is_partitioned(cfg):
        return cfg
    c = cfg.cluster
    _check_disjoint({"actor_gpus": c.actor_gpus, "rollout_gpus": c.rollout_gpus, "prm_gpus": c.prm_gpus,
                     "teacher_gpus": c.teacher_gpus})
    tp = cfg.trainer.tensor_parallel
    if not c.actor_gpus or len(c.actor_gpus) % tp:
        raise ConfigError(f"cluster.actor_gpus has {len(c.actor_gpus)} GPUs; the trainer needs a positive multiple "
                          f"of trainer.tensor_parallel={tp}")
    cfg.trainer.data_parallel = len(c.actor_gpus) // tp
    if cfg.gateway.engine_urls:
        if c.rollout_gpus:
            raise ConfigError("cluster.rollout_gpus is set but gateway.engine_urls points at engines run elsewhere")
    else:
        engine_tp = cfg.serve.sglang.tp_size
        if not c.rollout_gpus or len(c.rollout_gpus) % engine_tp:
            raise ConfigError(f"cluster.rollout_gpus has {len(c.rollout_gpus)} GPUs; the policy engines need a "
                              f"positive multiple of serve.sglang.tp_size={engine_tp}")
        cfg.serve.num_engines = len(c.rollout_gpus) // engine_tp
    for needed, gpus, what in ((cfg.judge.runs_own_prm, c.prm_gpus, "prm_gpus"),
                               (cfg.judge.runs_own_teacher, c.teacher_gpus, "teacher_gpus")):
        if needed and not gpus:
            raise ConfigError(f"this recipe starts a {what[:-5].upper()} engine; give it GPUs in cluster.{what} "
                              f"(or point the judge at an engine run elsewhere)")
        if gpus and not needed:
            raise ConfigError(f"cluster.{what} is set but this recipe starts no {what[:-5].upper()} engine "
                              f"(judge.backend={cfg.judge.backend}, judge.teacher={cfg.judge.teacher})")
    return cfg


def _devices(gpus: list[int]) -> str:
    return ",".join(str(g) for g in gpus)


def visible_devices(cfg: Config, role: str, index: int = 0) -> Optional[str]:
    """CUDA_VISIBLE_DEVICES for one process: role is trainer | engine | prm | teacher | none (a CPU-only loop,
    which then sees no GPU); None: leave the variable alone (no partition).

    Every trainer rank sees all actor GPUs and picks its own by LOCAL_RANK (NCCL
    wants peers visible); engine `index` sees its tp_size GPUs.
    """
    if not is_partitioned(cfg):
        return None
    c = cfg.cluster
    if role == "trainer":
        return _devices(c.actor_gpus)
    if role == "engine":
        tp = cfg.serve.sglang.tp_size
        return _devices(c.rollout_gpus[index * tp:(index + 1) * tp])
    if role == "prm":
        return _devices(c.prm_gpus)
    if role == "teacher":
        return _devices(c.teacher_gpus)
    if role == "none":
        return ""
    raise ValueError(f"unknown role {role!r}")


def _apply_ray_counts(cfg: Config) -> Config:
    """The Ray backend's GPU counts: the same rules as one node's device lists, without device indices.
    A count of 0 puts that role on CPU (only the embedded engine can serve there)."""
    r = cfg.cluster.ray
    tp = cfg.trainer.tensor_parallel
    if r.actor_gpus:
        if r.actor_gpus % tp:
            raise ConfigError(f"cluster.ray.actor_gpus={r.actor_gpus} is not a multiple of trainer.tensor_parallel={tp}")
        cfg.trainer.data_parallel = r.actor_gpus // tp
    engine_tp = cfg.serve.sglang.tp_size
    if cfg.gateway.engine_urls and r.rollout_gpus:
        raise ConfigError("cluster.ray.rollout_gpus is set but gateway.engine_urls points at engines run elsewhere")
    if r.rollout_gpus:
        if r.rollout_gpus % engine_tp:
            raise ConfigError(f"cluster.ray.rollout_gpus={r.rollout_gpus} is not a multiple of "
                              f"serve.sglang.tp_size={engine_tp}")
        cfg.serve.num_engines = r.rollout_gpus // engine_tp
    sglang = cfg.serve.backend == "sglang"
    for needed, count, what in ((not cfg.gateway.engine_urls, r.rollout_gpus, "rollout_gpus"),
                                (cfg.judge.runs_own_prm, r.prm_gpus, "prm_gpus"),
                                (cfg.judge.runs_own_teacher, r.teacher_gpus, "teacher_gpus")):
        if needed and sglang and not count:
            raise ConfigError(f"SGLang engines need GPUs: set cluster.ray.{what}")
        if count and not needed:
            raise ConfigError(f"cluster.ray.{what} is set but this recipe starts no such engine")
    return cfg


def bundle_gpus(cfg: Config, role: str) -> int:
    """GPUs in one loop's bundle on a Ray cluster: role is trainer (per rank) | engine | prm | teacher | any
    CPU-only loop."""
    r = cfg.cluster.ray
    if role == "trainer":
        return 1 if r.actor_gpus else 0
    if role == "engine":
        return cfg.serve.sglang.tp_size if r.rollout_gpus else 0
    return {"prm": r.prm_gpus, "teacher": r.teacher_gpus}.get(role, 0)
