"""Placement on a Ray cluster without Ray: bundles per loop, GPU counts from the config, fitting on nodes, refusals."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from clawr1 import placement
from clawr1.cluster import apply_partition
from clawr1.config import ConfigError, load_config
from clawr1.placement import Node, PlanDoesNotFit
from tests.conftest import REPO


def ray_config(*overrides: str):
    return apply_partition(load_config(REPO / "recipes/combined/cluster.yaml", [
        "model.path=/models/qwen3-4b", "run.dir=runs/x", "cluster.backend=ray", "cluster.ray.actor_gpus=4",
        "cluster.ray.rollout_gpus=2", "cluster.ray.prm_gpus=2", *overrides]))


def nodes(*gpus: int, cpus: float = 8, **extra: dict) -> list[Node]:
    return [Node(f"node{i}" + "0" * 40, f"10.0.0.{i}", {"CPU": cpus, "GPU": g, **extra.get(f"n{i}", {})})
            for i, g in enumerate(gpus, 1)]


def test_one_bundle_per_loop_sized_by_its_role():
    cfg = ray_config()
    groups = placement.bundle_groups(cfg, placement.run_loops(cfg))
    got = {g.name: (g.strategy, [(b.loop.name, b.gpus) for b in g.bundles]) for g in groups}
    assert got == {
        "trainer": ("PACK", [("trainer-0", 1), ("trainer-1", 1), ("trainer-2", 1), ("trainer-3", 1)]),
        "engines": ("SPREAD", [("serve", 1), ("serve-1", 1), ("prm", 2)]),
        "loops": ("PACK", [("pool", 0), ("judge", 0), ("gateway", 0), ("rollout", 0)]),
    }
    assert (cfg.trainer.data_parallel, cfg.serve.num_engines) == (4, 2)
    assert groups[0].bundles[0].resources == {"CPU": 1.0, "GPU": 1.0}
    assert groups[2].bundles[0].resources == {"CPU": 1.0}


def test_counts_follow_tensor_parallel_sizes():
    cfg = ray_config("trainer.tensor_parallel=2", "serve.sglang.tp_size=2", "cluster.ray.rollout_gpus=4")
    groups = placement.bundle_groups(cfg, placement.run_loops(cfg))
    assert [b.gpus for b in groups[0].bundles] == [1, 1, 1, 1] and cfg.trainer.data_parallel == 2
    assert [(b.loop.name, b.gpus) for b in groups[1].bundles] == [("serve", 2), ("serve-1", 2), ("prm", 2)]


def test_a_plan_is_placed_on_nodes_that_hold_it():
    cfg = ray_config()
    groups = placement.bundle_groups(cfg, placement.run_loops(cfg))
    placed = placement.assign(groups, nodes(4, 4))
    gpus_per_node: dict[str, int] = {}
    for g in groups:
        for b in g.bundles:
            gpus_per_node[placed[b.loop.name].ip] = gpus_per_node.get(placed[b.loop.name].ip, 0) + b.gpus
    assert gpus_per_node == {"10.0.0.1": 4, "10.0.0.2": 4}
    assert {placed[f"trainer-{r}"].ip for r in range(4)} == {"10.0.0.1"}  # PACK: the ranks together
    text = placement.describe(groups, nodes(4, 4), placed, "head:6379")
    assert "GPUs: trainer 4 + engine 2 + prm 2 = 8 of 8 in the cluster" in text
    assert re.search(r"bundle engines\[2\]\s+SPREAD\s+prm\s+role=prm\s+gpus=2 cpus=1  -> node 2 \(10.0.0.2\)", text)


@pytest.mark.parametrize("overrides, node_gpus, message", [
    ((), (4, 2), "it needs 8 GPU (trainer 4 + engine 2 + prm 2) and the cluster has 6 (node node1000 (10.0.0.1): 4, "
                 "node node2000 (10.0.0.2): 2)"),
    (("cluster.ray.trainer_strategy=STRICT_PACK", "cluster.ray.actor_gpus=6"), (4, 4, 4),
     "placement group trainer (STRICT_PACK) needs one node with CPU 6, GPU 6"),
    (("cluster.ray.engine_strategy=STRICT_SPREAD",), (8,), "bundle serve-1 (CPU 1, GPU 1) of placement group engines "
                                                           "(STRICT_SPREAD) fits on no node"),
    (("cluster.ray.resources={trainer: {trainer_node: 0.01}}",), (4, 4), "it needs 0.04 trainer_node (trainer 0.04) "
                                                                         "and the cluster has 0"),
])
def test_a_plan_that_does_not_fit_is_refused_naming_what_is_missing(overrides, node_gpus, message):
    cfg = ray_config(*overrides)
    with pytest.raises(PlanDoesNotFit, match=re.escape(message)):
        placement.assign(placement.bundle_groups(cfg, placement.run_loops(cfg)), nodes(*node_gpus, cpus=16))


def test_custom_resources_pin_a_role_to_its_nodes():
    cfg = ray_config("cluster.ray.resources={trainer: {trainer_node: 0.01}}")
    placed = placement.assign(placement.bundle_groups(cfg, placement.run_loops(cfg)),
                              nodes(4, 4, n2={"trainer_node": 1}))
    assert {placed[f"trainer-{r}"].ip for r in range(4)} == {"10.0.0.2"}


@pytest.mark.parametrize("overrides, message", [
    (["cluster.backend=ray", "cluster.actor_gpus=[0,1]"], "cluster.actor_gpus lists device indices of one node; with "
                                                          "cluster.backend=ray give a GPU count instead"),
    (["cluster.ray.actor_gpus=2"], "cluster.ray.actor_gpus is set but cluster.backend=local"),
    (["cluster.ray.resources={judges: {a: 1}}"], "cluster.ray.resources: unknown role 'judges'"),
    (["cluster.backend=ray", "cluster.ray.trainer_strategy=TIGHT"], "cluster.ray.trainer_strategy: 'TIGHT' is not "
                                                                    "allowed; choose one of: PACK, SPREAD"),
    (["serve.backend=sglang", "trainer.weight_sync=http"], "trainer.weight_sync=http streams safetensors into the "
                                                           "embedded engine"),
])
def test_cluster_keys_are_validated_by_name(overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(REPO / "recipes/combined/cpu.yaml", overrides)


@pytest.mark.parametrize("overrides, message", [
    (["cluster.ray.actor_gpus=3", "trainer.tensor_parallel=2"], "cluster.ray.actor_gpus=3 is not a multiple of "
                                                                 "trainer.tensor_parallel=2"),
    (["cluster.ray.rollout_gpus=0"], "SGLang engines need GPUs: set cluster.ray.rollout_gpus"),
    (["cluster.ray.prm_gpus=0"], "SGLang engines need GPUs: set cluster.ray.prm_gpus"),
    (["judge.llm_url=http://prm:30000/v1"], "cluster.ray.prm_gpus is set but this recipe starts no such engine"),
])
def test_gpu_counts_that_contradict_the_recipe_are_refused(overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        ray_config(*overrides)


def test_the_ray_backend_pushes_weights_over_http_unless_told_otherwise():
    on_ray = load_config(REPO / "recipes/combined/cpu.yaml", ["cluster.backend=ray"])
    assert on_ray.trainer.weight_sync == "http"
    assert load_config(REPO / "recipes/combined/cpu.yaml", ["cluster.backend=ray", "trainer.weight_sync=disk"]).trainer.weight_sync == "disk"
    assert load_config(REPO / "recipes/combined/cpu.yaml").trainer.weight_sync == "disk"
    assert ray_config().trainer.weight_sync == "disk"  # the cluster recipes say disk (SGLang engines)


def test_the_local_backend_never_imports_ray(tmp_path):
    code = ("import sys; from clawr1.cli import main; "
            f"rc = main(['run', 'recipes/combined/cpu.yaml', 'run.dir={tmp_path}/run', '--dry-run']); "
            "assert rc == 0 and 'ray' not in sys.modules, sorted(m for m in sys.modules if 'ray' in m)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "wave 1  pool" in out.stdout
