"""`clawr1 run` with cluster.backend=ray on a two-node Ray cluster on this machine (ray.cluster_utils.Cluster).

Each node declares 4 fake GPUs and a custom resource naming it (node1, node2), so the recipe can pin the
trainer to node 1 and the engine to node 2. Every loop writes RUN_DIR/state/<loop>.where.json at start (its pid,
parent, node and CUDA_VISIBLE_DEVICES), which is how the tests see where each process ran and find every process
of the run afterwards: by the PIDs learned, never by name.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, pid_alive
from tests.e2e.test_run import descendants, trainer_records

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow

ON_TWO_NODES = ("cluster.backend=ray", "cluster.ray.actor_gpus=1", "cluster.ray.rollout_gpus=1",
                "cluster.ray.cpus_per_loop=0.5", "cluster.ray.resources={trainer: {node1: 1}, engine: {node2: 1}}",
                "rollout.eval_every=0", "judge.teacher=policy")  # the placed loops, without a teacher engine
LOOPS = {"pool", "serve", "judge", "gateway", "trainer", "rollout"}


@dataclass
class TestCluster:
    address: str
    node_ids: dict[str, str]  # node1 / node2 -> Ray node id


def cluster_pids(cluster) -> set[int]:
    """Every process of the Ray cluster itself (GCS, raylets, agents, workers) and their descendants."""
    roots = {info.process.pid for node in [cluster.head_node, *cluster.worker_nodes]
             for infos in node.all_processes.values() for info in infos}
    return roots | {d for pid in roots for d in descendants(pid)}


@pytest.fixture(scope="module")
def ray_cluster(tiny_model):
    from ray.cluster_utils import Cluster

    saved = os.environ.get("RAY_ADDRESS")
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 3, "num_gpus": 4, "resources": {"node1": 10}})
    pids: set[int] = set()
    try:
        cluster.add_node(num_cpus=3, num_gpus=4, resources={"node2": 10})
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False)  # the test's own view: nodes, placement groups
        ids = {name: n["NodeID"] for n in ray.nodes() for name in ("node1", "node2") if name in n["Resources"]}
        yield TestCluster(cluster.address, ids)
    finally:
        ray.shutdown()
        pids = cluster_pids(cluster)
        cluster.shutdown()
        if saved is None:
            os.environ.pop("RAY_ADDRESS", None)
        else:
            os.environ["RAY_ADDRESS"] = saved
    assert wait_gone(pids, 30) == set(), "Ray cluster processes left running"


def wait_gone(pids: set[int], timeout: float) -> set[int]:
    deadline = time.monotonic() + timeout
    while (alive := {p for p in pids if pid_alive(p)}) and time.monotonic() < deadline:
        time.sleep(0.2)
    return alive


def start_run(cluster: TestCluster, run_dir: Path, *overrides: str) -> tuple[subprocess.Popen, Path]:
    out = run_dir.with_name(run_dir.name + ".out")
    with open(out, "w") as f:
        proc = subprocess.Popen([sys.executable, "-m", "clawr1.cli", "run", "recipes/combined/cpu.yaml",
                                 f"run.dir={run_dir}", *ON_TWO_NODES, *overrides],
                                cwd=REPO, stdout=f, stderr=subprocess.STDOUT,
                                env={**os.environ, "RAY_ADDRESS": cluster.address, "PYTHONUNBUFFERED": "1"})
    return proc, out


def whereabouts(run_dir: Path) -> dict[str, dict]:
    return {p.name.removesuffix(".where.json"): json.loads(p.read_text())
            for p in (run_dir / "state").glob("*.where.json")}


class RunProcesses:
    """Every process of a run seen while it runs: each loop's process, its parent (the Ray actor) and their
    descendants; and what each parent was (its command line, read from /proc)."""

    def __init__(self):
        self.pids: set[int] = set()
        self.parents: dict[str, str] = {}

    def look(self, run_dir: Path) -> None:
        for loop, w in whereabouts(run_dir).items():
            self.pids |= {w["pid"], w["ppid"]} | descendants(w["ppid"])
            if loop not in self.parents:
                try:
                    self.parents[loop] = Path(f"/proc/{w['ppid']}/cmdline").read_text().replace("\0", " ")
                except OSError:
                    pass


def watch(proc: subprocess.Popen, run_dir: Path, seen: RunProcesses, until=lambda: False, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while proc.poll() is None and not until():
        seen.look(run_dir)
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.3)


def run_placement_groups(run_dir: Path) -> dict[str, str]:
    """This run's placement groups (named clawr1-<run dir>-...) and their states."""
    return {pg["name"]: pg["state"] for pg in ray.util.placement_group_table().values()
            if pg["name"].startswith(f"clawr1-{run_dir.name}-")}


def test_loops_run_where_placed_and_weights_reach_the_engine_over_http(ray_cluster, tmp_path):
    run_dir = tmp_path / "placed"
    proc, out = start_run(ray_cluster, run_dir, "run.max_steps=3")
    seen = RunProcesses()
    watch(proc, run_dir, seen)
    text = out.read_text()
    assert proc.returncode == 0, text
    assert [r["step"] for r in trainer_records(run_dir)] == [1, 2, 3]

    where = whereabouts(run_dir)
    assert set(where) == LOOPS
    assert where["trainer"]["node_id"] == ray_cluster.node_ids["node1"]
    assert where["serve"]["node_id"] == ray_cluster.node_ids["node2"]
    assert where["trainer"]["cuda_visible_devices"] in {"0", "1", "2", "3"}  # one fake GPU each, from Ray
    assert where["serve"]["cuda_visible_devices"] in {"0", "1", "2", "3"}
    assert {where[n]["cuda_visible_devices"] for n in LOOPS - {"trainer", "serve"}} == {""}
    assert all(seen.parents[n].startswith("ray::LoopHost") for n in LOOPS), seen.parents  # each a Ray actor's child

    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    node_ip = where["serve"]["node_ip"]
    assert node_ip != "127.0.0.1" and cfg["gateway"]["host"] == cfg["pool"]["host"] == where["gateway"]["node_ip"]
    assert cfg["gateway"]["engine_urls"] == [f"http://{node_ip}:{cfg['serve']['port']}"]
    assert cfg["trainer"]["weight_sync"] == "http"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["engine_weight_version"] == 3  # every version arrived over HTTP...
    assert not (run_dir / "weights").exists()  # ...and no weights directory was written for the engine to read
    assert f"[run] ready: OpenAI base URL http://{where['gateway']['node_ip']}:{cfg['gateway']['port']}/v1" in text
    assert re.search(r"^\[run\] ledger: \d+ served main turns = ", text, re.M), text  # the run skeleton's report

    assert seen.pids and wait_gone(seen.pids, 10) == set()
    assert set(run_placement_groups(run_dir).values()) == {"REMOVED"}


def test_a_dead_actor_stops_the_run_naming_loop_and_node(ray_cluster, tmp_path):
    run_dir = tmp_path / "killed"
    proc, out = start_run(ray_cluster, run_dir, "run.max_steps=1000")
    seen = RunProcesses()
    watch(proc, run_dir, seen, until=lambda: bool(trainer_records(run_dir)), timeout=240)
    assert proc.poll() is None, out.read_text()
    judge = whereabouts(run_dir)["judge"]
    os.kill(judge["ppid"], signal.SIGKILL)  # the judge's Ray actor
    watch(proc, run_dir, seen, timeout=90)
    text = out.read_text()
    assert proc.returncode == 1, text
    assert re.search(rf"FAILED: loop 'judge' on node {judge['node_id'][:8]} \({re.escape(judge['node_ip'])}\): "
                     rf"its Ray actor \(pid {judge['ppid']}\) died", text), text
    assert wait_gone(seen.pids, 10) == set()
    assert set(run_placement_groups(run_dir).values()) == {"REMOVED"}


def test_ctrl_c_stops_every_actor_and_process(ray_cluster, tmp_path):
    run_dir = tmp_path / "interrupted"
    proc, out = start_run(ray_cluster, run_dir, "run.max_steps=1000")
    seen = RunProcesses()
    watch(proc, run_dir, seen, until=lambda: (run_dir / "state" / "rollout.ready").exists(), timeout=240)
    seen.look(run_dir)
    assert set(whereabouts(run_dir)) == LOOPS
    proc.send_signal(signal.SIGINT)
    watch(proc, run_dir, seen, timeout=90)
    assert proc.returncode == 130, out.read_text()
    assert wait_gone(seen.pids, 10) == set()
    assert set(run_placement_groups(run_dir).values()) == {"REMOVED"}


def launch_dry_run(cluster: TestCluster, tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    path = f"{Path(sys.executable).parent}:/usr/bin:/bin"
    return subprocess.run(["bash", "launch/combined.sh", "--dry-run", "cluster.ray.cpus_per_loop=0.5"], cwd=REPO,
                          capture_output=True, text=True, timeout=120,
                          env={"PATH": path, "HOME": os.environ.get("HOME", str(tmp_path)), "RAY_ADDRESS": cluster.address,
                               "MODEL_PATH": "/models/qwen3-4b", "RUN_DIR": str(tmp_path / "run"), **env})


def test_launch_dry_run_prints_a_plan_that_adds_up_and_refuses_one_that_does_not_fit(ray_cluster, tmp_path):
    out = launch_dry_run(ray_cluster, tmp_path)
    assert out.returncode == 0, out.stderr
    bundles = re.findall(r"^bundle \S+\s+\S+\s+(\S+)\s+role=(\S+)\s+gpus=(\d+) .*-> node (\d+)", out.stdout, re.M)
    by_role: dict[str, int] = {}
    by_node: dict[str, int] = {}
    for _loop, role, gpus, node in bundles:
        by_role[role] = by_role.get(role, 0) + int(gpus)
        by_node[node] = by_node.get(node, 0) + int(gpus)
    assert by_role == {"trainer": 4, "engine": 2, "prm": 2, "pool": 0, "judge": 0, "gateway": 0, "rollout": 0}
    assert by_node == {"1": 4, "2": 4}  # 4 fake GPUs per node, all used, none twice
    assert "GPUs: trainer 4 + engine 2 + prm 2 = 8 of 8 in the cluster" in out.stdout
    assert not (tmp_path / "run").exists()

    too_big = launch_dry_run(ray_cluster, tmp_path, ACTOR_GPUS="8")
    assert too_big.returncode == 2
    assert "the run does not fit the Ray cluster: it needs 12 GPU (trainer 8 + engine 2 + prm 2) and the cluster has 8" \
        in too_big.stderr, too_big.stderr
    assert "bundle" not in too_big.stdout
