"""`clawr1 run` on a Ray cluster (cluster.backend=ray): the same loop processes, placed on the cluster's nodes.

The driver (the `clawr1 run` process) joins an existing cluster (cluster.ray_address, else RAY_ADDRESS); it
never starts or stops one. It reserves one bundle per loop in three placement groups (clawr1/placement.py) and
starts a LoopHost actor on each bundle. A host picks free ports on its node and reports the node's address; the
driver then writes the config every loop reads (each loop binds on its own node's address and finds the others
by theirs), and sends it as text to every host, which writes it into the run directory on its node and starts
`python -m clawr1.cli <loop> --config RUN_DIR/config.yaml` as a child process in its own process group, with
CUDA_VISIBLE_DEVICES from the GPUs Ray gave the actor.

The run has the local supervisor's skeleton (clawr1/run_skeleton.py): it ends when the trainer is done (exit 0),
on Ctrl-C/SIGTERM (130), or when a loop fails (1): its process exits, its actor dies or its node is lost, and the
message names the loop and the node (run.on_loop_failure=restart is not supported here yet). However it ends, every host stops its process group (producers first, as the local supervisor does),
every actor is killed and the placement groups are removed. Actors and groups belong to the driver's Ray job,
so Ray removes them too if the driver itself is killed; a host's child dies with its actor (PR_SET_PDEATHSIG).
"""
from __future__ import annotations

import os
import secrets
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import httpx
import ray
import yaml
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from clawr1 import placement
from clawr1.config import Config, save_config, to_dict
from clawr1.ports import free_port
from clawr1.placement import LoopSpec, Node, PlacementRefused
from clawr1.run_skeleton import Driver, LoopFailed, RunSkeleton, stop_stages
from clawr1.runtime import ready_file, start_process, stop_processes, write_atomically

ReadyCheck = Optional[tuple[str, str]]  # ("http", url) | ("file", path) | None: ready once started


class ClusterUnavailable(PlacementRefused):
    """No Ray cluster to join."""


# ---------------------------------------------------------------- on each node
class LoopHost:
    """A Ray actor that runs one loop's process on its node, and answers for it."""

    def __init__(self, name: str):
        self.name = name
        self.proc: Optional[subprocess.Popen] = None
        self.exit_code: Optional[int] = None
        self.exited = threading.Event()

    def where(self, wanted_ports: list[int]) -> dict:
        """This node's id and address, the actor's pid, the GPUs Ray assigned, and the loop's ports: those the
        config fixes, and a free one on this node for each 0."""
        ip = ray.util.get_node_ip_address()
        return {"node_id": ray.get_runtime_context().get_node_id(), "ip": ip, "pid": os.getpid(),
                "gpu_ids": [str(g) for g in ray.get_gpu_ids()], "ports": _ports(ip, wanted_ports)}

    def start(self, command: str, args: list[str], env: dict[str, str], run_dir: str, config_text: str,
              cwd: str) -> int:
        """Write the run's config on this node and start the loop's process; returns its pid."""
        config_path = Path(run_dir) / "config.yaml"
        write_atomically(config_path, config_text)
        argv = [sys.executable, "-m", "clawr1.cli", command, "--config", str(config_path), *args]
        full_env = {**os.environ, **env, "PYTHONUNBUFFERED": "1", "CLAWR1_LOOP_NAME": self.name,
                    "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in ray.get_gpu_ids()),
                    "CLAWR1_NODE_ID": ray.get_runtime_context().get_node_id(),
                    "CLAWR1_NODE_IP": ray.util.get_node_ip_address()}
        log_path = Path(run_dir) / "logs" / f"{self.name}.log"
        workdir = Path(cwd) if Path(cwd).is_dir() else Path(run_dir)
        started = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            # The child dies with the thread that started it (PR_SET_PDEATHSIG), so this thread lives as long as it.
            try:
                self.proc = start_process(argv, log_path, full_env, cwd=workdir)
            except BaseException as e:  # handed to start's caller
                failure.append(e)
                started.set()
                return
            started.set()
            self.exit_code = self.proc.wait()
            self.exited.set()

        threading.Thread(target=run, name=f"{self.name}-process", daemon=True).start()
        started.wait()
        if failure:
            raise failure[0]
        return self.proc.pid

    def wait(self) -> int:
        """Blocks until the loop's process exits; its return code (negative: killed by that signal)."""
        self.exited.wait()
        return self.exit_code

    def ready(self, check: ReadyCheck) -> bool:
        if check is None:
            return True
        kind, target = check
        if kind == "file":
            return Path(target).exists()
        try:
            return httpx.get(target, timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def exists(self, path: str) -> bool:
        return Path(path).exists()

    def tail(self, path: str, lines: int = 15) -> str:
        p = Path(path)
        return "\n".join(p.read_text(errors="replace").splitlines()[-lines:]) if p.exists() else ""

    def stop(self, grace_s: float) -> bool:
        """SIGTERM the process group, SIGKILL what is left after grace_s; whether it had to be killed."""
        if self.proc is None:
            return False
        return bool(stop_processes([self.proc], grace_s))


def _ports(host: str, wanted: list[int]) -> list[int]:
    """`wanted` with each 0 replaced by a distinct free port on `host` (ports.free_port: below the ephemeral range)."""
    chosen: list[int] = []
    for p in wanted:
        chosen.append(p or free_port(host, avoid=[*wanted, *chosen]))
    return chosen


# ---------------------------------------------------------------- the driver
@dataclass
class Placed:
    """One loop of the run: its spec, its actor, where the actor landed, and how its process is doing."""

    spec: LoopSpec
    actor: Any
    node: Node
    actor_pid: int
    gpu_ids: list[str]
    ports: list[int]
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    exit_ref: Any = None  # LoopHost.wait's result once the process runs
    exit_code: Optional[int] = None

    @property
    def name(self) -> str:
        return self.spec.name

    def url(self) -> str:
        return f"http://{self.node.ip}:{self.ports[0]}"


class RaySupervisor(RunSkeleton):
    """`clawr1 run` with cluster.backend=ray: the run's skeleton (clawr1/run_skeleton.py), the loops on Ray."""

    refusals = (PlacementRefused,)

    def __init__(self, cfg: Config, echo: Callable[[str], None] = print, driver: Optional[Driver] = None):
        super().__init__(cfg, echo, driver)
        self.specs = placement.run_loops(cfg)
        self.groups = placement.bundle_groups(cfg, self.specs)
        self.pgs: list[PlacementGroup] = []
        self.placed: list[Placed] = []
        self.final: Optional[Config] = None  # the config with every loop's address, once the hosts reported

    # ------------------------------------------------------------ plan
    def describe(self) -> str:
        """The placement plan on the cluster (PlanDoesNotFit if it cannot fit) and every process's command."""
        address = self._connect()
        try:
            nodes = _alive_nodes()
            plan = placement.describe(self.groups, nodes, placement.assign(self.groups, nodes), address)
        finally:
            ray.shutdown()
        config = self.cfg.run_dir / "config.yaml"
        commands = [f"wave {s.wave}  {s.name:<10} clawr1 {s.command} --config {config}" for s in self.specs]
        return "\n".join([plan, *commands])

    def _connect(self) -> str:
        address = self.cfg.cluster.ray_address or os.environ.get("RAY_ADDRESS", "")
        if not address:
            raise ClusterUnavailable("cluster.backend=ray needs a running Ray cluster: set RAY_ADDRESS or "
                                     "cluster.ray_address (start one with `ray start --head`, see docs/cluster.md)")
        try:
            ray.init(address=address, log_to_driver=False, logging_level="warning")
        except ConnectionError as e:
            raise ClusterUnavailable(f"cannot join the Ray cluster at {address}: {_first_line(e)}") from None
        return address

    # ------------------------------------------------------------ run
    def _start_loops(self) -> Config:
        if self.cfg.run.on_loop_failure == "restart":
            self.echo("[run] run.on_loop_failure=restart is not supported on Ray yet: a dead loop stops this run")
        self._connect()
        self._reserve()
        self._place_hosts()
        self.final = self._addressed()
        save_config(self.final, self.cfg.run_dir / "config.yaml")
        for wave in (1, 2):
            self._start_wave(wave)
        return self.final

    def _up_line(self) -> str:
        nodes = len({p.node.node_id for p in self.placed})
        return (f"[run] all loops up on {nodes} node(s); training {self.cfg.run.max_steps or 'until stopped'} steps "
                f"(logs in {self.cfg.run_dir / 'logs'})")

    def _reserve(self) -> None:
        """Check the plan against the nodes, then reserve every bundle (LoopFailed if Ray cannot in time)."""
        placement.assign(self.groups, _alive_nodes())
        run_id = f"{self.cfg.run_dir.name}-{secrets.token_hex(3)}"
        self.pgs = [placement_group([b.resources for b in g.bundles], strategy=g.strategy, name=f"clawr1-{run_id}-{g.name}")
                    for g in self.groups]
        timeout = self.cfg.cluster.ray.placement_timeout_s
        ready, _ = ray.wait([pg.ready() for pg in self.pgs], num_returns=len(self.pgs), timeout=timeout)
        if len(ready) < len(self.pgs):
            raise LoopFailed(f"Ray did not reserve the run's bundles within {timeout:.0f}s "
                             f"(cluster.ray.placement_timeout_s); other jobs may hold the resources")

    def _place_hosts(self) -> None:
        """One LoopHost per bundle; each reports where it landed and the ports it chose there."""
        host_cls = ray.remote(LoopHost)
        actors = []
        for group, pg in zip(self.groups, self.pgs):
            for index, bundle in enumerate(group.bundles):
                strategy = PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=index)
                actor = host_cls.options(num_cpus=bundle.cpus, num_gpus=bundle.gpus, max_concurrency=8,
                                         scheduling_strategy=strategy).remote(bundle.loop.name)
                actors.append((bundle.loop, actor))
        reports = self._get([a.where.remote(_wanted_ports(self.cfg, spec)) for spec, a in actors],
                            "reporting where it runs")
        for (spec, actor), r in zip(actors, reports):
            node = Node(r["node_id"], r["ip"], {})
            self.placed.append(Placed(spec, actor, node, r["pid"], r["gpu_ids"], r["ports"]))

    def _get(self, refs: list, what: str, timeout: Optional[float] = None) -> list:
        timeout = self.cfg.run.startup_timeout_s if timeout is None else timeout
        try:
            return ray.get(refs, timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            raise LoopFailed(f"a loop's Ray actor took over {timeout:.0f}s {what}") from None
        except ray.exceptions.RayError as e:
            raise LoopFailed(f"a loop's Ray actor failed {what}: {_first_line(e)}") from None

    def _addressed(self) -> Config:
        """The config every loop reads: each loop's address is its node's, its ports those its host chose."""
        cfg = self.cfg.model_copy(deep=True)
        one = {p.spec.role: p for p in self.placed}
        engines = [p for p in self.placed if p.spec.role == "engine"]
        pool, judge, gateway = one["pool"], one["judge"], one["gateway"]
        cfg.pool.host, (cfg.pool.samples_port, cfg.pool.batches_port) = pool.node.ip, pool.ports
        cfg.judge.host, cfg.judge.port = judge.node.ip, judge.ports[0]
        cfg.gateway.host, (cfg.gateway.port, cfg.gateway.acks_port) = gateway.node.ip, gateway.ports
        if engines:
            cfg.gateway.engine_urls = [p.url() for p in engines]
            cfg.serve.host, cfg.serve.port = engines[0].node.ip, engines[0].ports[0]
        if "teacher" in one:
            cfg.judge.teacher_url = one["teacher"].url()
        if "prm" in one:
            cfg.judge.llm_url = one["prm"].url() + ("/v1" if cfg.judge.llm_api == "openai" else "")
        lead = next(p for p in self.placed if p.spec.role == "trainer" and p.spec.rank == 0)
        cfg.trainer.host, cfg.trainer.publish_port = lead.node.ip, lead.ports[0]
        world = sum(p.spec.role == "trainer" for p in self.placed)
        secrets_env = self._secrets_env()
        for p in self.placed:
            p.args = _own_args(self.cfg, p)
            p.env = dict(secrets_env)
            if p.spec.role == "trainer":  # each rank sees only its own GPU, hence LOCAL_RANK 0
                p.env.update(RANK=str(p.spec.rank), WORLD_SIZE=str(world), LOCAL_RANK="0",
                             MASTER_ADDR=lead.node.ip, MASTER_PORT=str(lead.ports[1]))
        return cfg

    def _secrets_env(self) -> dict[str, str]:
        """What a loop on another node cannot read from ours: the gateway's API key (it binds beyond loopback, so it
        needs one; made for the run when none is set) and the keys of services the config names."""
        cfg = self.cfg
        env = {k: os.environ[k] for k in (cfg.judge.llm_api_key_env, "WANDB_API_KEY") if os.environ.get(k)}
        if cfg.gateway.api_key_file:  # read on the gateway's and rollout's nodes
            return env
        key = os.environ.get(cfg.gateway.api_key_env)
        if not key:
            key = secrets.token_urlsafe(24)
            path = cfg.run_dir / "api_key"
            path.touch(mode=0o600)
            path.write_text(key + "\n")
            self.echo(f"[run] the gateway's API key for this run is in {path}")
        env[cfg.gateway.api_key_env] = key
        return env

    def _ready_check(self, p: Placed) -> ReadyCheck:
        role, cfg = p.spec.role, self.final
        if role in ("engine", "teacher", "prm"):
            return ("http", f"{p.url()}/health")
        if role == "gateway":
            return ("http", f"{cfg.gateway_url}/health")
        if role == "trainer" and p.spec.rank != 0:
            return None
        return ("file", str(ready_file(cfg, role)))

    def _start_wave(self, wave: int) -> None:
        loops = [p for p in self.placed if p.spec.wave == wave]
        text = yaml.safe_dump(to_dict(self.final), sort_keys=False)
        run_dir, cwd = str(self.cfg.run_dir), os.getcwd()
        self._get([p.actor.start.remote(p.spec.command, p.args, p.env, run_dir, text, cwd) for p in loops],
                  "starting its loop")
        for p in loops:
            p.exit_ref = p.actor.wait.remote()
        deadline = time.monotonic() + self.cfg.run.startup_timeout_s
        waiting = loops
        while waiting:
            self._check_alive()
            answers = self._get([p.actor.ready.remote(self._ready_check(p)) for p in waiting], "checking readiness")
            waiting = [p for p, ok in zip(waiting, answers) if not ok]
            if waiting and time.monotonic() > deadline:
                raise LoopFailed(f"loop(s) {', '.join(p.name for p in waiting)} not ready after "
                                 f"{self.cfg.run.startup_timeout_s:.0f}s")
            time.sleep(0.3 if waiting else 0)

    # ------------------------------------------------------------ watch
    def _check_alive(self, trainers_may_finish: bool = True) -> None:
        """LoopFailed naming the loop and its node if a process exited (a trainer may finish with 0), its actor
        died or its node was lost."""
        running = {p.exit_ref: p for p in self.placed if p.exit_ref is not None and p.exit_code is None}
        if not running:
            return
        done, _ = ray.wait(list(running), num_returns=len(running), timeout=0)
        for ref in done:
            p = running[ref]
            try:
                p.exit_code = ray.get(ref)
            except ray.exceptions.RayError as e:
                raise LoopFailed(self._lost(p, e)) from None
            if not (trainers_may_finish and p.spec.role == "trainer" and p.exit_code == 0):
                log = self.cfg.run_dir / "logs" / f"{p.name}.log"
                raise LoopFailed(f"loop '{p.name}' on node {p.node.label} exited with code {p.exit_code}; "
                                 f"last lines of {log}:\n{self._tail(p, log)}")

    def _lost(self, p: Placed, error: Exception) -> str:
        """Why a loop's actor is gone: its node was lost, or the actor itself died."""
        deadline = time.monotonic() + 5  # Ray may take a moment to mark a node dead
        while time.monotonic() < deadline:
            alive = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
            if p.node.node_id not in alive:
                return f"loop '{p.name}' on node {p.node.label}: the node was lost"
            time.sleep(0.5)
        return f"loop '{p.name}' on node {p.node.label}: its Ray actor (pid {p.actor_pid}) died: {_first_line(error)}"

    def _tail(self, p: Placed, log: Path) -> str:
        try:
            return ray.get(p.actor.tail.remote(str(log)), timeout=10)
        except ray.exceptions.RayError:
            return ""

    def _supervise(self) -> None:
        self._check_alive()

    def _trainers_done(self) -> bool:
        return all(p.exit_code == 0 for p in self.placed if p.spec.role == "trainer")

    def _runs_rollout(self) -> bool:
        return any(p.spec.role == "rollout" for p in self.placed)

    def _rollout_has(self, path: Path) -> bool:
        rollout = next(p for p in self.placed if p.spec.role == "rollout")
        return ray.get(rollout.actor.exists.remote(str(path)))

    def _check_alive_after_training(self) -> None:
        self._check_alive()

    def _summary_extra(self) -> dict[str, Any]:
        return {"nodes": {p.name: p.node.label for p in self.placed}}

    # ------------------------------------------------------------ stop
    def stop_all(self) -> None:
        """Every host stops its process group, producers first; then the actors and placement groups go."""
        if not ray.is_initialized():
            return
        try:
            deadline = time.monotonic() + self.cfg.run.stop_timeout_s
            for stage in stop_stages([p for p in self.placed if p.exit_ref is not None]):
                grace = max(0.0, deadline - time.monotonic())
                refs = [p.actor.stop.remote(grace) for p in stage]
                for p, ref in zip(stage, refs):
                    try:
                        if ray.get(ref, timeout=grace + 15):
                            self.echo(f"[run] {p.name} did not stop in time; killed it")
                    except ray.exceptions.RayError:
                        pass  # its actor is gone, and its process with it
            for p in self.placed:
                ray.kill(p.actor, no_restart=True)
            for pg in self.pgs:
                remove_placement_group(pg)
        finally:
            ray.shutdown()


def _wanted_ports(cfg: Config, spec: LoopSpec) -> list[int]:
    """The ports a loop binds, as the config gives them (0: chosen on its node)."""
    if spec.role == "engine":
        fixed = [cfg.serve.port, *cfg.serve.extra_ports]
        index = int(spec.name.partition("-")[2] or 0)
        return [fixed[index] if index < len(fixed) else 0]
    return {"pool": [cfg.pool.samples_port, cfg.pool.batches_port], "judge": [cfg.judge.port],
            "gateway": [cfg.gateway.port, cfg.gateway.acks_port], "teacher": [cfg.judge.teacher_port], "prm": [cfg.judge.prm_port],
            "trainer": [cfg.trainer.publish_port, 0] if spec.rank == 0 else []}.get(spec.role, [])


def _own_args(cfg: Config, p: Placed) -> list[str]:
    """Overrides for one process only: an engine serves on its own node's address and port."""
    if p.spec.role not in ("engine", "teacher", "prm"):
        return []
    args = [f"serve.host={p.node.ip}", f"serve.port={p.ports[0]}"]
    gpus = {"prm": cfg.cluster.ray.prm_gpus, "teacher": cfg.cluster.ray.teacher_gpus}.get(p.spec.role, 0)
    if gpus:  # a side engine is tensor-parallel over all its GPUs
        args.append(f"serve.sglang.tp_size={gpus}")
    if p.spec.role == "prm":
        args.append(f"model.path={cfg.judge.prm_model_path or cfg.model.path}")
    return args


def _alive_nodes() -> list[Node]:
    return [Node(n["NodeID"], n["NodeManagerAddress"], dict(n["Resources"])) for n in ray.nodes() if n["Alive"]]


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
