"""The placement plan of a run on a Ray cluster (cluster.backend=ray), without Ray.

Every loop process gets one bundle: a trainer rank one GPU (or none on CPU), a
policy engine serve.sglang.tp_size GPUs, the PRM and teacher engines theirs,
gateway, judge, pool and rollout none; each bundle also reserves
cluster.ray.cpus_per_loop CPUs and the role's extra resources. Bundles form
three placement groups, each with its strategy: the trainer ranks, the engines,
the other loops.

`assign` says which node each bundle fits on, given the nodes' resources (for
`--dry-run`, and to refuse a plan that cannot fit before anything starts); Ray
makes the final choice when clawr1/ray_run.py creates the groups.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from clawr1.cluster import bundle_gpus
from clawr1.config import Config

GROUP_OF_ROLE = {"trainer": "trainer", "engine": "engines", "prm": "engines", "teacher": "engines",
                 "gateway": "loops", "judge": "loops", "pool": "loops", "rollout": "loops"}


@dataclass(frozen=True)
class LoopSpec:
    """One process of the run: `clawr1 <command>`, its bundle's role, its start wave."""

    name: str
    command: str
    role: str
    wave: int
    rank: int = -1  # trainer ranks only


@dataclass
class Bundle:
    loop: LoopSpec
    gpus: int
    cpus: float
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def resources(self) -> dict[str, float]:
        """The bundle as Ray takes it."""
        return {"CPU": self.cpus, **({"GPU": float(self.gpus)} if self.gpus else {}), **self.extra}


@dataclass
class Group:
    name: str  # trainer | engines | loops
    strategy: str
    bundles: list[Bundle]


@dataclass(frozen=True)
class Node:
    node_id: str
    ip: str
    resources: dict[str, float]

    @property
    def label(self) -> str:
        return f"{self.node_id[:8]} ({self.ip})"


class PlacementRefused(RuntimeError):
    """The run cannot be placed on a Ray cluster (`clawr1 run` exits 2 with the message)."""


class PlanDoesNotFit(PlacementRefused):
    """The run's bundles cannot all be placed on the cluster's nodes."""


def run_loops(cfg: Config) -> list[LoopSpec]:
    """Every process of the run, named as the local supervisor names them."""
    loops = [LoopSpec("pool", "pool", "pool", 1)]
    if not cfg.gateway.engine_urls:
        loops += [LoopSpec("serve" if i == 0 else f"serve-{i}", "serve", "engine", 1) for i in range(cfg.serve.num_engines)]
    if cfg.judge.runs_own_teacher:
        loops.append(LoopSpec("teacher", "serve", "teacher", 1))
    if cfg.judge.runs_own_prm:
        loops.append(LoopSpec("prm", "serve", "prm", 1))
    loops += [LoopSpec("judge", "judge", "judge", 1), LoopSpec("gateway", "gateway", "gateway", 1)]
    world = cfg.trainer.tensor_parallel * cfg.trainer.data_parallel
    loops += [LoopSpec("trainer" if world == 1 else f"trainer-{r}", "train", "trainer", 2, rank=r) for r in range(world)]
    if cfg.run.mode == "env":
        loops.append(LoopSpec("rollout", "rollout", "rollout", 2))
    return loops


def bundle_groups(cfg: Config, loops: list[LoopSpec]) -> list[Group]:
    r = cfg.cluster.ray
    strategy = {"trainer": r.trainer_strategy, "engines": r.engine_strategy, "loops": r.loop_strategy}
    groups = {name: Group(name, strategy[name], []) for name in ("trainer", "engines", "loops")}
    for loop in loops:
        bundle = Bundle(loop, bundle_gpus(cfg, loop.role), r.cpus_per_loop, dict(r.resources.get(loop.role, {})))
        groups[GROUP_OF_ROLE[loop.role]].bundles.append(bundle)
    return [g for g in groups.values() if g.bundles]


# ---------------------------------------------------------------- fitting bundles on nodes
def _fits(need: dict[str, float], free: dict[str, float]) -> bool:
    return all(free.get(k, 0.0) + 1e-9 >= v for k, v in need.items())


def _take(need: dict[str, float], free: dict[str, float]) -> None:
    for k, v in need.items():
        free[k] = free.get(k, 0.0) - v


def _after_all(needs: list[dict[str, float]], free: dict[str, float]) -> Optional[dict[str, float]]:
    """What a node has left once it holds every bundle of `needs`; None if they do not all fit."""
    left = dict(free)
    for need in needs:
        if not _fits(need, left):
            return None
        _take(need, left)
    return left


def _fmt(resources: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:g}" for k, v in sorted(resources.items()))


def _check_totals(groups: list[Group], nodes: list[Node]) -> None:
    """The clearest refusal first: a resource the whole cluster has too little of, per role."""
    need: dict[str, dict[str, float]] = {}
    for group in groups:
        for b in group.bundles:
            for k, v in b.resources.items():
                need.setdefault(k, {}).setdefault(b.loop.role, 0.0)
                need[k][b.loop.role] += v
    for resource, by_role in sorted(need.items(), key=lambda kv: ("GPU", "CPU").index(kv[0]) if kv[0] in ("GPU", "CPU") else 2):
        total, have = sum(by_role.values()), sum(n.resources.get(resource, 0.0) for n in nodes)
        if total > have + 1e-9:
            parts = " + ".join(f"{role} {v:g}" for role, v in by_role.items())
            per_node = ", ".join(f"node {n.label}: {n.resources.get(resource, 0.0):g}" for n in nodes)
            raise PlanDoesNotFit(f"the run does not fit the Ray cluster: it needs {total:g} {resource} ({parts}) and "
                                 f"the cluster has {have:g} ({per_node or 'no nodes'})")


def _place_group(group: Group, nodes: list[Node], free: dict[str, dict[str, float]]) -> dict[str, Node]:
    """Ray's strategies, approximately: PACK on one node if the whole group fits there, else as few as possible;
    SPREAD over the nodes in turn; STRICT_* or nothing."""
    needs = [b.resources for b in group.bundles]
    if group.strategy in ("PACK", "STRICT_PACK"):
        for node in nodes:
            left = _after_all(needs, free[node.node_id])
            if left is not None:
                free[node.node_id] = left
                return {b.loop.name: node for b in group.bundles}
        if group.strategy == "STRICT_PACK":
            raise PlanDoesNotFit(f"placement group {group.name} (STRICT_PACK) needs one node with "
                                 f"{_fmt(_sum(needs))}; no node has that much")
    placed: dict[str, Node] = {}
    used: dict[str, int] = {n.node_id: 0 for n in nodes}
    for bundle in group.bundles:
        candidates = [n for n in nodes if _fits(bundle.resources, free[n.node_id])]
        if group.strategy == "STRICT_SPREAD":
            candidates = [n for n in candidates if not used[n.node_id]]
        if group.strategy in ("SPREAD", "STRICT_SPREAD"):
            candidates.sort(key=lambda n: used[n.node_id])
        if not candidates:
            left = "; ".join(f"node {n.label}: {_fmt(free[n.node_id])}" for n in nodes)
            raise PlanDoesNotFit(f"bundle {bundle.loop.name} ({_fmt(bundle.resources)}) of placement group "
                                 f"{group.name} ({group.strategy}) fits on no node; what is left: {left}")
        node = candidates[0]
        _take(bundle.resources, free[node.node_id])
        used[node.node_id] += 1
        placed[bundle.loop.name] = node
    return placed


def _sum(needs: list[dict[str, float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for n in needs:
        for k, v in n.items():
            out[k] = out.get(k, 0.0) + v
    return out


def assign(groups: list[Group], nodes: list[Node]) -> dict[str, Node]:
    """Loop name -> the node its bundle fits on; PlanDoesNotFit, naming what is missing, if one does not."""
    _check_totals(groups, nodes)
    free = {n.node_id: dict(n.resources) for n in nodes}
    placed: dict[str, Node] = {}
    for group in groups:
        placed.update(_place_group(group, nodes, free))
    return placed


def describe(groups: list[Group], nodes: list[Node], placed: dict[str, Node], address: str) -> str:
    """The plan `clawr1 run --dry-run` prints on a Ray cluster: nodes, bundles (role, GPUs, CPUs, node), totals."""
    number = {n.node_id: i for i, n in enumerate(nodes, 1)}
    lines = [f"Ray cluster {address}: {len(nodes)} node(s)"]
    for n in nodes:
        lines.append(f"node {number[n.node_id]}  id {n.node_id[:8]}  ip {n.ip}  {_fmt(_shown(n.resources))}")
    lines.append("placement (where each bundle fits; Ray makes the final choice):")
    gpus_by_role: dict[str, int] = {}
    for g in groups:
        for i, b in enumerate(g.bundles):
            node = placed[b.loop.name]
            extra = f"  {_fmt(b.extra)}" if b.extra else ""
            lines.append(f"bundle {f'{g.name}[{i}]':<11} {g.strategy:<13} {b.loop.name:<10} role={b.loop.role:<8} "
                         f"gpus={b.gpus} cpus={b.cpus:g}{extra}  -> node {number[node.node_id]} ({node.ip})")
            gpus_by_role[b.loop.role] = gpus_by_role.get(b.loop.role, 0) + b.gpus
    total = sum(gpus_by_role.values())
    have = sum(n.resources.get("GPU", 0.0) for n in nodes)
    parts = " + ".join(f"{role} {n}" for role, n in gpus_by_role.items() if n) or "none"
    lines.append(f"GPUs: {parts} = {total} of {have:g} in the cluster")
    return "\n".join(lines)


def _shown(resources: dict[str, float]) -> dict[str, float]:
    """A node's resources without Ray's bookkeeping entries (memory, node:IP, ...)."""
    return {k: v for k, v in resources.items()
            if not k.startswith("node:") and k not in ("memory", "object_store_memory")}
