"""`clawr1 run`: start every loop of a recipe as a local process, watch them, stop them all.

Each loop runs as `python -m clawr1.cli <loop> --config RUN_DIR/config.yaml`
in its own process group, with its output in RUN_DIR/logs/<loop>.log, and dies
with the supervisor even on kill -9 (PR_SET_PDEATHSIG). Without a GPU it is forked
from the fork server (run.fork_server, clawr1/fork_server.py), which imported what
the loops share once; it is then the same command in /proc, with the same log and
exit code. The run ends when the
trainer finishes its steps (exit 0), when any loop dies (exit 1, naming it),
or on Ctrl-C/SIGTERM (exit 130). With run.on_loop_failure=restart (live runs)
a dead loop is restarted with backoff instead, and the run stops only when one
loop fails more than run.max_restarts times within run.restart_window_s. A live
run (run.mode=live) has no rollout loop: it trains on whatever reaches the
gateway until stopped. In every case
every process the run started is stopped, producers before consumers (trainer
and rollout, then gateway, then judge, then pool and engines), so the trainer
can checkpoint and commit and queued turns reach the pool: SIGTERM to each
group, then SIGKILL once the grace period is over. The Ray supervisor (clawr1/ray_run.py) shares this
skeleton: clawr1/run_skeleton.py.
"""
from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable, Optional

import httpx

from clawr1.cluster import apply_partition, visible_devices
from clawr1.config import Config, save_config
from clawr1.ports import assign_free_ports, free_port
from clawr1.engine_api.versions import newest_weights
from clawr1.fork_client import ForkedProcess, ForkServer, ForkServerGone, uses_fork_server
from clawr1.run_skeleton import Driver, LoopFailed, RunSkeleton, stop_stages
from clawr1.runtime import ready_file, start_process, stop_processes
from clawr1.tracking import MetricsWriter


@dataclass
class Loop:
    name: str
    command: str  # the clawr1 subcommand
    env: dict[str, str]
    ready: Callable[[], bool]
    args: tuple[str, ...] = ()  # config overrides for this process only
    proc: Optional[subprocess.Popen | ForkedProcess] = None
    log_path: Optional[Path] = None

    @property
    def unit(self) -> str:
        """What restarts together: every trainer rank (one process group for torch.distributed), else the loop."""
        return "trainer" if self.name.startswith("trainer") else self.name


_health_client: Optional[httpx.Client] = None


def _http_ok(url: str) -> Callable[[], bool]:
    def check() -> bool:
        global _health_client
        if _health_client is None:  # one client for every poll: each new one loads the CA bundle (0.1-0.3 CPU-s)
            _health_client = httpx.Client(timeout=2, trust_env=False)
        try:
            return _health_client.get(url).status_code == 200
        except httpx.HTTPError:
            return False
    return check


def _file_exists(path: Path) -> Callable[[], bool]:
    return path.exists


def _tail(path: Optional[Path], lines: int = 15) -> str:
    if path is None or not path.exists():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def _refresh_master_port(wave: list[Loop]) -> None:
    """A new free port for the trainers' rendezvous, picked just before they start: the one picked at plan
    time can be taken by then, e.g. as the local end of a connection the first wave opened."""
    if any("MASTER_PORT" in loop.env for loop in wave):
        port = str(free_port())
        for loop in wave:
            if "MASTER_PORT" in loop.env:
                loop.env["MASTER_PORT"] = port


class Supervisor(RunSkeleton):
    """Every loop a local process (see the module's text); `driver` as in RunSkeleton."""

    def __init__(self, cfg: Config, echo: Callable[[str], None] = print, driver: Optional[Driver] = None):
        super().__init__(cfg, echo, driver)
        self.loops: list[Loop] = []
        self.config_path = cfg.run_dir / "config.yaml"
        self.pending_restarts: dict[str, tuple[float, list[Loop]]] = {}  # unit -> (when, its loops)
        self.fork_server: Optional[ForkServer] = None
        self.forks_loops = uses_fork_server(cfg.run.fork_server)  # else each loop is a fresh Python

    # ------------------------------------------------------------ plan
    def plan(self) -> list[list[Loop]]:
        """Loops in start waves: each wave starts once the previous one is ready."""
        cfg = self.cfg
        wave1 = [
            Loop("pool", "pool", _gpu_env(cfg, "none"), _file_exists(ready_file(cfg, "pool"))),
            *self._engines(),
            Loop("judge", "judge", _gpu_env(cfg, "none"), _file_exists(ready_file(cfg, "judge"))),
            Loop("gateway", "gateway", _gpu_env(cfg, "none"), _http_ok(f"{cfg.gateway_url}/health")),
        ]
        world = cfg.trainer.tensor_parallel * cfg.trainer.data_parallel
        master_port = str(free_port())
        trainers = [
            Loop("trainer" if world == 1 else f"trainer-{r}", "train",
                 {"RANK": str(r), "WORLD_SIZE": str(world), "LOCAL_RANK": str(r), "MASTER_ADDR": "127.0.0.1",
                  "MASTER_PORT": master_port, **_gpu_env(cfg, "trainer")},
                 _file_exists(ready_file(cfg, "trainer")) if r == 0 else (lambda: True))
            for r in range(world)
        ]
        wave2 = trainers
        if cfg.run.mode == "env":
            wave2 = wave2 + [Loop("rollout", "rollout", _gpu_env(cfg, "none"), _file_exists(ready_file(cfg, "rollout")))]
        return [wave1, wave2]

    def _engines(self) -> list[Loop]:
        """The policy engines (unless they run elsewhere), and the PRM and frozen-teacher engines the judge needs."""
        cfg = self.cfg
        host = cfg.serve.host
        loops = []
        if not cfg.gateway.engine_urls:
            ports = [cfg.serve.port, *cfg.serve.extra_ports]
            loops = [Loop("serve" if i == 0 else f"serve-{i}", "serve", _gpu_env(cfg, "engine", i),
                          _http_ok(f"http://{host}:{p}/health"), args=(f"serve.port={p}",)) for i, p in enumerate(ports)]
        if cfg.judge.runs_own_teacher:  # frozen: the base weights, never updated; lagged: refreshed by the trainer
            port = cfg.judge.teacher_port
            loops.append(Loop("teacher", "serve", _gpu_env(cfg, "teacher"), _http_ok(f"http://{host}:{port}/health"),
                              args=(f"serve.port={port}", *_engine_tp(cfg.cluster.teacher_gpus))))
        if cfg.judge.runs_own_prm:
            port = cfg.judge.prm_port
            loops.append(Loop("prm", "serve", _gpu_env(cfg, "prm"), _http_ok(f"http://{host}:{port}/health"),
                              args=(f"serve.port={port}", f"model.path={cfg.judge.prm_model_path or cfg.model.path}",
                                    *_engine_tp(cfg.cluster.prm_gpus))))
        return loops

    def describe(self) -> str:
        """What `clawr1 run --dry-run` prints: every process, its GPUs and its command."""
        start = ("forked from the fork server (run.fork_server)" if self.forks_loops
                 else "each a fresh Python")
        lines = [f"run directory: {self.cfg.run_dir}", f"loops start: {start}"]
        for wave, loops in enumerate(self.plan(), 1):
            for loop in loops:
                gpus = loop.env.get("CUDA_VISIBLE_DEVICES", "-") or "none"
                cmd = " ".join(["clawr1", loop.command, "--config", str(self.config_path), *loop.args])
                lines.append(f"wave {wave}  {loop.name:<10} gpus={gpus:<8} {cmd}")
        return "\n".join(lines)

    # ------------------------------------------------------------ run
    def _start_loops(self) -> Config:
        save_config(self.cfg, self.config_path)
        for wave in self.plan():
            _refresh_master_port(wave)
            for loop in wave:
                loop.args = self._start_args(loop)
                self._start(loop)
            self._wait_ready(wave)
        return self.cfg

    def _up_line(self) -> str:
        cfg = self.cfg
        if cfg.run.mode == "live":
            limit = f"{cfg.run.max_steps} steps" if cfg.run.max_steps else "until stopped (Ctrl-C)"
            return (f"[run] live: training on the traffic that reaches the gateway, {limit} "
                    f"(logs in {cfg.run_dir / 'logs'})")
        return f"[run] all loops up; training {cfg.run.max_steps} steps (logs in {cfg.run_dir / 'logs'})"

    def _start(self, loop: Loop) -> None:
        loop.log_path = self.cfg.run_dir / "logs" / f"{loop.name}.log"
        env = {**os.environ, **loop.env, "PYTHONUNBUFFERED": "1", "CLAWR1_LOOP_NAME": loop.name}
        args = [loop.command, "--config", str(self.config_path), *loop.args]
        if self.forks_loops:
            try:
                loop.proc = self._fork_server().spawn(args, env, loop.log_path)
            except ForkServerGone as e:
                raise LoopFailed(f"loop '{loop.name}' could not start: {e}") from None
        else:
            loop.proc = start_process([sys.executable, "-m", "clawr1.cli", *args], loop.log_path, env)
        if loop not in self.loops:
            self.loops.append(loop)

    def _fork_server(self) -> ForkServer:
        """The running fork server, started (again, if it died) and preloaded first (clawr1/fork_server.py)."""
        if self.fork_server is None or not self.fork_server.alive():
            self.fork_server = ForkServer(self.cfg.run_dir / "logs" / "fork_server.log",
                                          {**os.environ, "PYTHONUNBUFFERED": "1"})
            try:
                ready = self.fork_server.wait_ready(self.cfg.run.startup_timeout_s)
            except ForkServerGone as e:
                raise LoopFailed(f"{e}\n{_tail(self.fork_server.log_path)}") from None
            self.echo(f"[run] fork server up (pid {self.fork_server.proc.pid}): {ready['ready']} modules imported "
                      f"once for every loop in {ready['cpu_s']:.1f} CPU-s")
        return self.fork_server

    def _check_alive(self) -> None:
        for loop in self.loops:
            rc = loop.proc.poll()
            if rc is not None and not (loop.name.startswith("trainer") and rc == 0):
                raise LoopFailed(f"loop '{loop.name}' exited with code {rc}; last lines of {loop.log_path}:\n{_tail(loop.log_path)}")

    def _wait_ready(self, wave: list[Loop]) -> None:
        deadline = time.monotonic() + self.cfg.run.startup_timeout_s
        waiting = list(wave)
        while waiting:
            self._check_alive()
            waiting = [loop for loop in waiting if not loop.ready()]
            if time.monotonic() > deadline:
                raise LoopFailed(f"loop(s) {', '.join(l.name for l in waiting)} not ready after {self.cfg.run.startup_timeout_s:.0f}s")
            time.sleep(0.3)

    # ------------------------------------------------------------ restarts (run.on_loop_failure=restart)
    def _supervise(self) -> None:
        """Stop the run when a loop died (on_loop_failure=stop); else schedule the dead loops' restarts and make
        those that are due."""
        if self.cfg.run.on_loop_failure == "stop":
            self._check_alive()
            return
        now = time.monotonic()
        for loop in self.loops:
            rc = loop.proc.poll()
            if rc is None or (loop.unit == "trainer" and rc == 0) or loop.unit in self.pending_restarts:
                continue
            self._schedule_restart(loop, rc, now)
        for unit, (when, loops) in list(self.pending_restarts.items()):
            if now >= when:
                del self.pending_restarts[unit]
                self._restart(loops)

    def _schedule_restart(self, dead: Loop, rc: int, now: float) -> None:
        delay = self.restart_policy.failed(dead.unit, now)
        cause = f"killed by {signal.Signals(-rc).name}" if rc < 0 else (_tail(dead.log_path, 1) or "no output").strip()
        self.echo(f"[run] loop '{dead.unit}' exited with code {rc} ({cause}); restarting it in {delay:.1f}s "
                  f"(restart {self.restart_policy.restarts[dead.unit]}; the other loops keep running)")
        unit = [loop for loop in self.loops if loop.unit == dead.unit]
        stop_processes([loop.proc for loop in unit if loop.proc.poll() is None], self.cfg.run.stop_timeout_s)
        self.pending_restarts[dead.unit] = (now + delay, unit)

    def _restart(self, loops: list[Loop]) -> None:
        _refresh_master_port(loops)
        for loop in loops:
            loop.args = self._restart_args(loop)
            self._start(loop)
        self.echo(f"[run] restarted '{loops[0].unit}' (pid {', '.join(str(l.proc.pid) for l in loops)})")
        MetricsWriter(self.cfg.run_dir, "supervisor").log({"restarted": loops[0].unit, **{
            f"restarts_{unit}": n for unit, n in self.restart_policy.restarts.items()}})

    def _start_args(self, loop: Loop) -> tuple[str, ...]:
        """A resumed run's (--resume) policy engines start as restarted ones do, on the newest published weights
        (the trainer resumes from its checkpoint by trainer.resume); every other loop as planned."""
        return self._restart_args(loop) if self.cfg.trainer.resume and loop.command == "serve" else loop.args

    def _restart_args(self, loop: Loop) -> tuple[str, ...]:
        """A trainer resumes from its newest checkpoint and the pool's cursor; a policy engine loads the newest
        published weights under their version."""
        args = tuple(a for a in loop.args if not a.startswith(("trainer.resume=", "model.path=", "serve.weight_version=")))
        if loop.command == "train":
            return (*args, "trainer.resume=true")
        if loop.command == "serve" and loop.name.startswith("serve"):
            newest = newest_weights(self.cfg.run_dir / "weights")
            if newest is not None:
                return (*args, f"model.path={newest[0]}", f"serve.weight_version={newest[1]}")
        return args

    def _trainers_done(self) -> bool:
        return all(loop.proc.poll() == 0 for loop in self.loops if loop.name.startswith("trainer"))

    def _runs_rollout(self) -> bool:
        return self.cfg.run.mode == "env"

    def _rollout_has(self, path: Path) -> bool:
        return path.exists()

    def _check_alive_after_training(self) -> None:
        for loop in self.loops:
            if not loop.name.startswith("trainer") and loop.proc.poll() is not None:
                raise LoopFailed(f"loop '{loop.name}' exited with code {loop.proc.returncode} during the final evaluation")

    def stop_all(self) -> None:
        """Stop the loops in STOP_ORDER, each stage SIGTERM then wait; SIGKILL what is left when the grace is over."""
        deadline = time.monotonic() + self.cfg.run.stop_timeout_s
        for stage in stop_stages([l for l in self.loops if l.proc]):
            killed = stop_processes([l.proc for l in stage], max(0.0, deadline - time.monotonic()))
            for loop in stage:
                if loop.proc in killed:
                    self.echo(f"[run] {loop.name} did not stop in time; killed it")
        if self.fork_server is not None:
            self.fork_server.stop(max(1.0, deadline - time.monotonic()))


def _gpu_env(cfg: Config, role: str, index: int = 0) -> dict[str, str]:
    devices = visible_devices(cfg, role, index)
    return {} if devices is None else {"CUDA_VISIBLE_DEVICES": devices}


def _engine_tp(gpus: list[int]) -> tuple[str, ...]:
    """A side engine (PRM, teacher) is tensor-parallel over all its GPUs."""
    return (f"serve.sglang.tp_size={len(gpus)}",) if gpus else ()


def prepare(cfg: Config, recipe: Path, overwrite: bool, resume: bool = False, dry_run: bool = False) -> Config:
    """Check the GPU partition, pick the run directory and free ports; refuse to mix two runs in one directory.
    A dry run touches no directory."""
    import shutil

    apply_partition(cfg)
    if not cfg.run.dir:
        if resume:
            raise SystemExit("--resume needs the run directory: add run.dir=RUN_DIR")
        cfg.run.dir = str(Path("runs") / f"{recipe.parent.name}-{recipe.stem}-{time.strftime('%Y%m%d-%H%M%S')}")
    on_ray = cfg.cluster.backend == "ray"
    if on_ray:  # every node writes into the same path; ports are chosen on the nodes
        cfg.run.dir = str(cfg.run_dir.resolve())
    if dry_run:
        return cfg if on_ray else assign_free_ports(cfg)
    run_dir = cfg.run_dir
    refuse_if_in_use(run_dir)
    if resume:
        if not (run_dir / "pool").is_dir():
            raise SystemExit(f"--resume: {run_dir} holds no earlier run (no pool/ directory)")
        cfg.trainer.resume = True
        shutil.rmtree(run_dir / "state", ignore_errors=True)  # readiness markers of the earlier run
    elif run_dir.exists() and any(run_dir.iterdir()):
        if not overwrite:
            raise SystemExit(f"run directory {run_dir} is not empty; choose another run.dir=..., "
                             f"pass --resume to continue it, or --overwrite to replace it")
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    hold_run_lock(run_dir)
    return cfg if on_ray else assign_free_ports(cfg)


_held_locks: dict[Path, IO[str]] = {}  # run directory -> its open lock file, held until this process exits


def refuse_if_in_use(run_dir: Path) -> None:
    """SystemExit naming the other `clawr1 run` whose lock RUN_DIR/run.lock holds (two runs would mix their
    pools, weights and ports, and --overwrite would delete a live run's directory)."""
    lock = run_dir / "run.lock"
    if run_dir.resolve() in _held_locks or not lock.exists():
        return
    with open(lock) as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = f.read().strip() or "unknown"
            raise SystemExit(f"run directory {run_dir} is in use by another clawr1 run (pid {owner}); stop it "
                             f"first, or choose another run.dir=...") from None
        fcntl.flock(f, fcntl.LOCK_UN)


def hold_run_lock(run_dir: Path) -> None:
    """Take RUN_DIR/run.lock (flock, released by the kernel when this process exits, even on kill -9)."""
    if run_dir.resolve() in _held_locks:
        return
    f = open(run_dir / "run.lock", "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:  # another run took it between the check and here
        f.close()
        refuse_if_in_use(run_dir)
        raise
    f.truncate(0)
    f.write(f"{os.getpid()}\n")
    f.flush()
    _held_locks[run_dir.resolve()] = f


def make_supervisor(cfg: Config, echo: Callable[[str], None] = print) -> RunSkeleton:
    """The local supervisor, or with cluster.backend=ray the Ray one (clawr1/ray_run.py, the only module that
    imports Ray); both have describe() and run()."""
    if cfg.cluster.backend == "ray":
        try:
            from clawr1.ray_run import RaySupervisor
        except ModuleNotFoundError as e:
            if e.name != "ray":
                raise
            raise SystemExit("cluster.backend=ray needs Ray in this environment (and the same version on every "
                             "node): pip install -e .[cluster]") from None
        return RaySupervisor(cfg, echo)
    return Supervisor(cfg, echo)
