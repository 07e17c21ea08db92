"""GPU partition: validation against the recipe, derived process counts, CUDA_VISIBLE_DEVICES per process."""
from __future__ import annotations

import re
import socket

import pytest

from clawr1.cluster import apply_partition, visible_devices
from clawr1.config import ConfigError, load_config
from clawr1.supervisor import Supervisor, _refresh_master_port
from clawr1.ports import assign_free_ports
from tests.conftest import REPO


def cluster_config(*overrides: str):
    return load_config(REPO / "recipes/combined/cluster.yaml", ["model.path=/models/qwen3-4b", "run.dir=runs/x",
                                                         "cluster.actor_gpus=[0,1,2,3]", "cluster.rollout_gpus=[4,5]",
                                                         "cluster.prm_gpus=[6,7]", *overrides])


def test_partition_derives_data_parallel_and_engine_count():
    cfg = apply_partition(cluster_config())
    assert (cfg.trainer.data_parallel, cfg.serve.num_engines) == (4, 2)
    cfg = apply_partition(cluster_config("trainer.tensor_parallel=2", "serve.sglang.tp_size=2"))
    assert (cfg.trainer.data_parallel, cfg.serve.num_engines) == (2, 1)


def test_every_process_sees_only_its_own_gpus():
    cfg = assign_free_ports(apply_partition(cluster_config()))
    env = {loop.name: loop.env.get("CUDA_VISIBLE_DEVICES") for wave in Supervisor(cfg).plan() for loop in wave}
    assert env == {"pool": "", "serve": "4", "serve-1": "5", "prm": "6,7", "judge": "", "gateway": "",
                   "trainer-0": "0,1,2,3", "trainer-1": "0,1,2,3", "trainer-2": "0,1,2,3", "trainer-3": "0,1,2,3",
                   "rollout": ""}
    prm = next(l for w in Supervisor(cfg).plan() for l in w if l.name == "prm")
    assert "model.path=/models/qwen3-4b" in prm.args and "serve.sglang.tp_size=2" in prm.args
    assert cfg.prm_url == f"http://127.0.0.1:{cfg.judge.prm_port}/v1"


def test_no_partition_pins_nothing():
    cfg = load_config(REPO / "recipes/combined/cpu.yaml")
    assert visible_devices(cfg, "trainer") is None and visible_devices(cfg, "none") is None
    assert apply_partition(cfg).trainer.data_parallel == 1


@pytest.mark.parametrize("overrides, message", [
    (["cluster.rollout_gpus=[3,4]"], "GPU 3 is in both cluster.actor_gpus and cluster.rollout_gpus"),
    (["trainer.tensor_parallel=3"], "positive multiple of trainer.tensor_parallel=3"),
    (["serve.sglang.tp_size=4"], "positive multiple of serve.sglang.tp_size=4"),
    (["cluster.prm_gpus=[]"], "starts a PRM engine; give it GPUs in cluster.prm_gpus"),
    (["judge.llm_url=http://prm:30000/v1"], "cluster.prm_gpus is set but this recipe starts no PRM engine"),
    (["judge.teacher=frozen"], "starts a TEACHER engine; give it GPUs in cluster.teacher_gpus"),
    (["cluster.actor_gpus=[-1]"], "cluster.actor_gpus.0: Input should be greater than or equal to 0 (got -1)"),
])
def test_a_partition_that_does_not_fit_is_refused_by_name(overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        apply_partition(cluster_config(*overrides))  # refused at load or by the partition check


def test_cpu_prm_engine_needs_the_generate_api():
    with pytest.raises(ConfigError, match="judge.llm_api=generate"):
        load_config(REPO / "recipes/combined/cpu.yaml", ["judge.backend=llm"])
    apply_partition(load_config(REPO / "recipes/combined/cpu.yaml", ["judge.backend=llm", "judge.llm_api=generate"]))


def test_trainer_ranks_get_one_rendezvous_port_picked_when_they_start():
    cfg = assign_free_ports(apply_partition(cluster_config()))
    first, trainers = Supervisor(cfg).plan()
    trainers = [loop for loop in trainers if loop.name.startswith("trainer")]
    planned = trainers[0].env["MASTER_PORT"]
    taken = socket.socket()
    taken.bind(("127.0.0.1", int(planned)))  # something took the planned port before the trainers started
    try:
        _refresh_master_port(first)
        assert all("MASTER_PORT" not in loop.env for loop in first)
        _refresh_master_port(trainers)
        ports = {loop.env["MASTER_PORT"] for loop in trainers}
        assert len(trainers) == 4 and len(ports) == 1 and ports != {planned}
    finally:
        taken.close()
