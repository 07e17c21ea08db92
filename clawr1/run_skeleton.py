"""What the local supervisor (clawr1/supervisor.py) and the Ray one (clawr1/ray_run.py) share: the run's
skeleton. `RunSkeleton.run` starts every loop, watches them until the trainer is done (exit 0), the driver has
finished (0), a loop fails (1) or Ctrl-C/SIGTERM comes (130); however it ends, every loop is stopped, producers
before consumers (`stop_stages`), and the restarts and the ledger of served main turns are reported. The
summary (summary.json) is written once the final evaluation is in. A backend says how its loops start, are
checked and stop; this module imports neither backend.
"""
from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional, Protocol, TypeVar

from clawr1.config import Config
from clawr1.engine_api.client import final_weight_version
from clawr1.engine_api.lora import published_adapters
from clawr1.runtime import ready_file
from clawr1.tracking import MetricsTail, RunStatus

STOP_ORDER = ("rollout", "trainer", "gateway", "judge")  # then everything else (pool, engines)
FINAL_EVALUATION_TIMEOUT_S = 3600  # as long as any evaluation: 8 users x 16 questions of a 0.5B model on 2 busy cores
# took over 10 minutes

Driver = Callable[[], Callable[[], bool]]


class LoopFailed(RuntimeError):
    pass


class Named(Protocol):
    name: str


L = TypeVar("L", bound=Named)


def stop_stages(loops: list[L]) -> list[list[L]]:
    """Producers before the loops they feed, so each can hand over what it holds before its consumer goes."""
    def stage(loop: L) -> int:
        return next((i for i, prefix in enumerate(STOP_ORDER) if loop.name.startswith(prefix)), len(STOP_ORDER))
    stages: dict[int, list[L]] = {}
    for loop in loops:
        stages.setdefault(stage(loop), []).append(loop)
    return [stages[k] for k in sorted(stages)]


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


class RunSkeleton:
    """One run of every loop, whatever starts them. `driver`, if given, runs in a thread once every loop is up
    (e.g. `clawr1 ingest` sending a file); it returns a check that says when the run has done with what it sent,
    and the run then ends (exit 0). A backend whose `_start_loops` raises one of `refusals` ends the run with 2."""

    refusals: tuple[type[Exception], ...] = ()

    def __init__(self, cfg: Config, echo: Callable[[str], None] = print, driver: Optional[Driver] = None):
        self.cfg = cfg
        self.echo = echo
        self.driver = driver
        self._driver_thread: Optional[threading.Thread] = None
        self._driver_result: dict = {}
        r = cfg.run
        self.restart_policy = RestartPolicy(r.restart_backoff_s, r.max_restarts, r.restart_window_s)

    # ------------------------------------------------------------ the backend's part
    def _start_loops(self) -> Config:
        """Start every loop, wave by wave, each ready before the next (LoopFailed if one is not); the config the
        loops read, with their addresses."""
        raise NotImplementedError

    def _up_line(self) -> str:
        """What the run says once every loop is up."""
        raise NotImplementedError

    def _supervise(self) -> None:
        """Called while the run goes on: LoopFailed when a loop's failure ends the run."""
        raise NotImplementedError

    def _trainers_done(self) -> bool:
        raise NotImplementedError

    def _runs_rollout(self) -> bool:
        raise NotImplementedError

    def _rollout_has(self, path: Path) -> bool:
        """Whether `path` exists where the rollout loop runs."""
        raise NotImplementedError

    def _check_alive_after_training(self) -> None:
        """LoopFailed if a loop other than the finished trainers exited."""
        raise NotImplementedError

    def _summary_extra(self) -> dict[str, Any]:
        return {}

    def stop_all(self) -> None:
        """Stop every loop the run started, in `stop_stages`, within run.stop_timeout_s."""
        raise NotImplementedError

    # ------------------------------------------------------------ the skeleton
    def run(self) -> int:
        cfg = self.cfg
        (cfg.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        self.progress = ProgressPrinter(cfg, self.echo)  # from here on: this run's records
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            addressed = self._start_loops()
            self.echo(f"[run] ready: OpenAI base URL {addressed.gateway_url}/v1")
            self.echo(self._up_line())
            self._start_driver()
            return self._watch(addressed)
        except self.refusals as e:
            self.echo(f"[run] {e}")
            return 2
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

    def _watch(self, addressed: Config) -> int:
        while True:
            self.progress.poll()
            self._supervise()
            if self._trainers_done() or self._driver_finished():
                self.progress.poll()
                return self._finish(addressed)
            time.sleep(0.5)

    def _finish(self, cfg: Config) -> int:
        if self._runs_rollout() and cfg.rollout.eval_every:  # the final evaluation
            self.echo(f"[run] training done; waiting for the final evaluation (at most "
                      f"{FINAL_EVALUATION_TIMEOUT_S // 60} min)")
            done = ready_file(cfg, "rollout").with_suffix(".done")
            deadline = time.monotonic() + FINAL_EVALUATION_TIMEOUT_S
            while not self._rollout_has(done) and time.monotonic() < deadline:
                self._check_alive_after_training()
                time.sleep(0.5)
            self.progress.poll()  # the final evaluation's line
        summary: dict[str, Any] = {"steps": cfg.run.max_steps, "run_dir": str(cfg.run_dir), **self._summary_extra()}
        summary.update(final_weight_version(cfg.engine_urls[0]))
        summary.update(published_adapters(cfg))
        (cfg.run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
        self.echo(f"[run] done: {summary}")
        return 0

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

    def _report_ledger(self) -> None:
        """The balance of served main turns, from the gateway outbox's last record (after every loop stopped)."""
        gateway = RunStatus(self.cfg.run_dir).refresh().latest.get("gateway", {})
        if "outbox_served" in gateway:
            self.echo(f"[run] {ledger_line(gateway)}")

    def _report_restarts(self) -> None:
        restarts = self.restart_policy.restarts
        if restarts:
            self.echo(f"[run] restarts: {', '.join(f'{unit} {n}' for unit, n in sorted(restarts.items()))}")
