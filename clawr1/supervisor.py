"""`clawr1 run`: start every loop of a recipe as a local process, watch them, stop them all.

Each loop runs as `python -m clawr1.cli <loop> --config RUN_DIR/config.yaml`
in its own process group, with its output in RUN_DIR/logs/<loop>.log, and dies
with the supervisor even on kill -9 (PR_SET_PDEATHSIG). The run ends when the
trainer finishes its steps (exit 0), when any loop dies (exit 1, naming it),
or on Ctrl-C/SIGTERM (exit 130). With run.on_loop_failure=restart (live runs)
a dead loop is restarted with backoff instead, and the run stops only when one
loop fails more than run.max_restarts times within run.restart_window_s. A live
run (run.mode=live) has no rollout loop: it trains on whatever reaches the
gateway until stopped. In every case
every process the run started is stopped, producers before consumers (trainer
and rollout, then gateway, then judge, then pool and engines), so the trainer
can checkpoint and commit and queued turns reach the pool: SIGTERM to each
group, then SIGKILL once the grace period is over.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Protocol, TypeVar

import httpx

from clawr1.cluster import apply_partition, visible_devices
from clawr1.config import Config, assign_free_ports, free_port, save_config
from clawr1.engine_api.client import final_weight_version
from clawr1.engine_api.lora import published_adapters
from clawr1.runtime import ready_file, start_process, stop_processes
from clawr1.tracking import MetricsTail, MetricsWriter, RunStatus

STOP_ORDER = ("rollout", "trainer", "gateway", "judge")  # then everything else (pool, engines)


class LoopFailed(RuntimeError):
    pass


@dataclass
class Loop:
    name: str
    command: str  # the clawr1 subcommand
    env: dict[str, str]
    ready: Callable[[], bool]
    args: tuple[str, ...] = ()  # config overrides for this process only
    proc: Optional[subprocess.Popen] = None
    log_path: Optional[Path] = None

    @property
    def unit(self) -> str:
        """What restarts together: every trainer rank (one process group for torch.distributed), else the loop."""
        return "trainer" if self.name.startswith("trainer") else self.name


def _http_ok(url: str) -> Callable[[], bool]:
    def check() -> bool:
        try:
            return httpx.get(url, timeout=2).status_code == 200
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


def newest_weights(weights_dir: Path) -> Optional[tuple[Path, int]]:
    """The newest complete published weight directory (vNNNNNN) and its version, if any."""
    versions = [(int(d.name[1:]), d) for d in weights_dir.glob("v*") if d.name[1:].isdigit() and d.is_dir()]
    if not versions:
        return None
    version, path = max(versions)
    return path, version


class RestartPolicy:
    """run.on_loop_failure=restart: when each dead loop comes back (backoff doubling up to 30 s), and when a loop
    has failed too often within the window to go on."""

    MAX_BACKOFF_S = 30.0

    def __init__(self, backoff_s: float, max_restarts: int, window_s: float):
        self.backoff_s, self.max_restarts, self.window_s = backoff_s, max_restarts, window_s
        self.failures: dict[str, list[float]] = {}
        self.restarts: dict[str, int] = {}

    def failed(self, unit: str, now: float) -> float:
        """Record a failure of `unit`; the delay before its restart (LoopFailed when it failed too often)."""
        recent = [t for t in self.failures.get(unit, []) if now - t < self.window_s] + [now]
        self.failures[unit] = recent
        if len(recent) > self.max_restarts:
            raise LoopFailed(f"loop '{unit}' failed {len(recent)} times within {self.window_s:.0f}s "
                             f"(run.max_restarts={self.max_restarts}); stopping the run")
        self.restarts[unit] = self.restarts.get(unit, 0) + 1
        return min(self.backoff_s * 2 ** (len(recent) - 1), self.MAX_BACKOFF_S)


class Supervisor:
    """`driver`, if given, runs in a thread once every loop is up (e.g. `clawr1 ingest` sending a file); it returns
    a check that says when the run has done with what it sent, and the run then ends (exit 0)."""

    def __init__(self, cfg: Config, echo: Callable[[str], None] = print,
                 driver: Optional[Callable[[], Callable[[], bool]]] = None):
        self.cfg = cfg
        self.echo = echo
        self.loops: list[Loop] = []
        self.config_path = cfg.run_dir / "config.yaml"
        self.driver = driver
        self._driver_thread: Optional[threading.Thread] = None
        self._driver_result: dict = {}
        r = cfg.run
        self.restart_policy = RestartPolicy(r.restart_backoff_s, r.max_restarts, r.restart_window_s)
        self.pending_restarts: dict[str, tuple[float, list[Loop]]] = {}  # unit -> (when, its loops)

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
        lines = [f"run directory: {self.cfg.run_dir}"]
        for wave, loops in enumerate(self.plan(), 1):
            for loop in loops:
                gpus = loop.env.get("CUDA_VISIBLE_DEVICES", "-") or "none"
                cmd = " ".join(["clawr1", loop.command, "--config", str(self.config_path), *loop.args])
                lines.append(f"wave {wave}  {loop.name:<10} gpus={gpus:<8} {cmd}")
        return "\n".join(lines)

    # ------------------------------------------------------------ run
    def run(self) -> int:
        cfg = self.cfg
        (cfg.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        save_config(cfg, self.config_path)
        self.progress = ProgressPrinter(cfg, self.echo)  # from here on: this run's records
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            for wave in self.plan():
                _refresh_master_port(wave)
                for loop in wave:
                    self._start(loop)
                self._wait_ready(wave)
            self.echo(f"[run] ready: OpenAI base URL {cfg.gateway_url}/v1")
            if cfg.run.mode == "live":
                limit = f"{cfg.run.max_steps} steps" if cfg.run.max_steps else "until stopped (Ctrl-C)"
                self.echo(f"[run] live: training on the traffic that reaches the gateway, {limit} "
                          f"(logs in {cfg.run_dir / 'logs'})")
            else:
                self.echo(f"[run] all loops up; training {cfg.run.max_steps} steps (logs in {cfg.run_dir / 'logs'})")
            self._start_driver()
            return self._watch()
        except LoopFailed as e:
            self.echo(f"[run] FAILED: {e}")
            return 1
        except KeyboardInterrupt:
            self.echo("[run] interrupted; stopping every loop")
            return 130
        finally:
            self.stop_all()
            self._report_restarts()
            self._report_ledger()
            for s, h in previous.items():
                signal.signal(s, h)

    def _on_signal(self, signum, _frame) -> None:
        raise KeyboardInterrupt

    def _start(self, loop: Loop) -> None:
        loop.log_path = self.cfg.run_dir / "logs" / f"{loop.name}.log"
        env = {**os.environ, **loop.env, "PYTHONUNBUFFERED": "1", "CLAWR1_LOOP_NAME": loop.name}
        command = [sys.executable, "-m", "clawr1.cli", loop.command, "--config", str(self.config_path), *loop.args]
        loop.proc = start_process(command, loop.log_path, env)
        if loop not in self.loops:
            self.loops.append(loop)

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

    def _start_driver(self) -> None:
        if self.driver is None:
            return

        def run() -> None:
            try:
                self._driver_result["done"] = self.driver()
            except Exception as e:  # reported by _watch, which stops the run
                self._driver_result["error"] = e

        self._driver_thread = threading.Thread(target=run, name="driver", daemon=True)
        self._driver_thread.start()

    def _driver_finished(self) -> bool:
        """Whether the driver is done and the run has handed on what it sent (LoopFailed if it failed)."""
        if self._driver_thread is None or self._driver_thread.is_alive():
            return False
        if "error" in self._driver_result:
            raise LoopFailed(f"{self._driver_result['error']}")
        return self._driver_result["done"]()

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

    def _report_ledger(self) -> None:
        """The balance of served main turns, from the gateway outbox's last record (after every loop stopped)."""
        gateway = RunStatus(self.cfg.run_dir).refresh().latest.get("gateway", {})
        if "outbox_served" in gateway:
            self.echo(f"[run] {ledger_line(gateway)}")

    def _report_restarts(self) -> None:
        restarts = self.restart_policy.restarts
        if restarts:
            self.echo(f"[run] restarts: {', '.join(f'{unit} {n}' for unit, n in sorted(restarts.items()))}")

    def _watch(self) -> int:
        progress = self.progress
        trainers = [l for l in self.loops if l.name.startswith("trainer")]
        while True:
            progress.poll()
            self._supervise()
            if all(t.proc.poll() == 0 for t in trainers) or self._driver_finished():
                progress.poll()
                return self._finish()
            time.sleep(0.5)

    def _finish(self) -> int:
        cfg = self.cfg
        if cfg.run.mode == "env" and cfg.rollout.eval_every:
            done = ready_file(cfg, "rollout").with_suffix(".done")
            deadline = time.monotonic() + 600
            while not done.exists() and time.monotonic() < deadline:
                self._check_alive_except_trainers()
                time.sleep(0.5)
            self.progress.poll()  # the final evaluation's line
        summary = {"steps": cfg.run.max_steps, "run_dir": str(cfg.run_dir)}
        summary.update(final_weight_version(cfg.engine_urls[0]))
        summary.update(published_adapters(cfg))
        (cfg.run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
        self.echo(f"[run] done: {summary}")
        return 0

    def _check_alive_except_trainers(self) -> None:
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


class Named(Protocol):
    name: str


L = TypeVar("L", bound=Named)


def ledger_line(gateway: dict) -> str:
    """"ledger: N served main turns = S samples + D dropped (reasons) + F in flight (balanced)"."""
    acked = {k.removeprefix("outbox_acked_"): int(v) for k, v in gateway.items() if k.startswith("outbox_acked_")}
    samples = acked.pop("sample", 0)
    served, in_flight = int(gateway["outbox_served"]), int(gateway["outbox_open"])
    dropped = sum(acked.values())
    reasons = ", ".join(f"{reason} {n}" for reason, n in sorted(acked.items())) or "none"
    balanced = "balanced" if served == samples + dropped + in_flight else "NOT balanced"
    return (f"ledger: {served} served main turns = {samples} samples in the pool + {dropped} dropped ({reasons}) "
            f"+ {in_flight} in flight ({balanced})")


def stop_stages(loops: list[L]) -> list[list[L]]:
    """Producers before the loops they feed, so each can hand over what it holds before its consumer goes."""
    def stage(loop: L) -> int:
        return next((i for i, prefix in enumerate(STOP_ORDER) if loop.name.startswith(prefix)), len(STOP_ORDER))
    stages: dict[int, list[L]] = {}
    for loop in loops:
        stages.setdefault(stage(loop), []).append(loop)
    return [stages[k] for k in sorted(stages)]


def _gpu_env(cfg: Config, role: str, index: int = 0) -> dict[str, str]:
    devices = visible_devices(cfg, role, index)
    return {} if devices is None else {"CUDA_VISIBLE_DEVICES": devices}


def _engine_tp(gpus: list[int]) -> tuple[str, ...]:
    """A side engine (PRM, teacher) is tensor-parallel over all its GPUs."""
    return (f"serve.sglang.tp_size={len(gpus)}",) if gpus else ()


class ProgressPrinter:
    """Prints one line per trainer step and per evaluation as the metrics arrive; in a live run also a
    line every run.progress_every_s with what was served, judged and trained, steps or not."""

    def __init__(self, cfg: Config, echo: Callable[[str], None]):
        self.echo = echo
        self.tail = MetricsTail(cfg.run_dir)  # a resumed run: only new records
        self.status = RunStatus(cfg.run_dir) if cfg.run.mode == "live" else None
        self.every_s = cfg.run.progress_every_s
        self.next_live_line = time.monotonic() + self.every_s

    def poll(self) -> None:
        for r in self.tail.poll():
            if r.get("loop") == "trainer" and "pg_loss" in r:
                self.echo(
                    f"[train] step {r['step']:>3} | version {r['version']} | samples {r['samples']} | "
                    f"reward {r['reward_mean']:+.2f} | hint rate {r['hint_rate']:.2f} | "
                    f"loss {r['pg_loss']:+.4f} | entropy {r.get('entropy', 0.0):.3f} | {r['tokens_per_s']:.0f} tok/s | "
                    f"staleness {r['staleness_mean']:.1f}")
            elif r.get("loop") == "rollout" and "eval_metric" in r:
                name = r["eval_metric"]
                self.echo(f"[eval]  version {r['eval_version']} | {name.replace('_', ' ')} {r[name]:.3f}")
        if self.status is not None and time.monotonic() >= self.next_live_line:
            self.next_live_line = time.monotonic() + self.every_s
            self.echo(self.live_line())

    def live_line(self) -> str:
        s = self.status.refresh()
        reward = s.get("trainer", "reward_mean")

        def n(loop: str, key: str) -> int:
            return int(s.get(loop, key) or 0)
        return (f"[live]  served {n('gateway', 'main_turns')} turns | ingested {n('gateway', 'ingested_turns')} | "
                f"judged {n('judge', 'judged')} | samples {n('pool', 'received')} | pool pending {n('pool', 'pending')} | "
                f"steps {n('trainer', 'step')} | version {n('trainer', 'version')} | "
                f"reward {'-' if reward is None else f'{reward:+.2f}'}")


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
    return cfg if on_ray else assign_free_ports(cfg)


def make_supervisor(cfg: Config, echo: Callable[[str], None] = print) -> Supervisor:
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
