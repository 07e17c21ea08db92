"""`clawr1 run`'s supervision: restart backoff and the crash-loop limit, the newest weights for a restarted
or resumed engine, the ledger line, one run to a run directory; and a live run that stops once one loop keeps
dying."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from clawr1.config import load_config
from clawr1.engine_api.lora import write_current
from clawr1.engine_api.versions import newest_weights, published_version
from clawr1.run_skeleton import LoopFailed, RestartPolicy, ledger_line
from clawr1.supervisor import Supervisor, _held_locks, prepare
from tests.conftest import REPO


def test_restarts_back_off_and_too_many_in_the_window_stop_the_run():
    policy = RestartPolicy(backoff_s=1.0, max_restarts=5, window_s=600)
    assert [policy.failed("judge", t) for t in (0, 10, 20, 30, 40)] == [1.0, 2.0, 4.0, 8.0, 16.0]
    with pytest.raises(LoopFailed, match=r"loop 'judge' failed 6 times within 600s \(run.max_restarts=5\)"):
        policy.failed("judge", 50)
    assert policy.failed("pool", 50) == 1.0  # counted per loop
    later = RestartPolicy(backoff_s=1.0, max_restarts=2, window_s=60)
    assert [later.failed("trainer", t) for t in (0, 30, 100, 130)] == [1.0, 2.0, 1.0, 2.0]  # old failures age out
    assert RestartPolicy(backoff_s=10.0, max_restarts=9, window_s=10**6).failed("x", 0) == 10.0
    capped = RestartPolicy(backoff_s=10.0, max_restarts=9, window_s=10**6)
    assert max(capped.failed("x", t) for t in range(6)) == RestartPolicy.MAX_BACKOFF_S
    assert capped.restarts == {"x": 6}


def test_a_restarted_engine_gets_the_newest_complete_weights(tmp_path):
    assert newest_weights(tmp_path / "weights") is None
    for name in ("v000007", "v000012", "v000013.tmp", "notes"):
        (tmp_path / "weights" / name).mkdir(parents=True)
    assert newest_weights(tmp_path / "weights") == (tmp_path / "weights" / "v000012", 12)


def test_a_resumed_runs_policy_engine_starts_on_the_newest_published_weights(tmp_path):
    (tmp_path / "weights" / "v000005").mkdir(parents=True)
    for resume in (False, True):
        sup = Supervisor(load_config(REPO / "recipes/combined/cpu.yaml", [f"run.dir={tmp_path}",
                                                                           f"trainer.resume={str(resume).lower()}"]))
        engines = {loop.name: loop for wave in sup.plan() for loop in wave if loop.command == "serve"}
        assert set(engines) == {"serve", "teacher"}
        newest = (f"model.path={tmp_path / 'weights' / 'v000005'}", "serve.weight_version=5")
        assert sup._start_args(engines["serve"]) == ((*engines["serve"].args, *newest) if resume else
                                                     engines["serve"].args)
        assert sup._start_args(engines["teacher"]) == engines["teacher"].args  # the frozen teacher stays the base
    assert published_version(tmp_path, adapters=False) == 5
    assert published_version(tmp_path, adapters=True) == 0  # no adapters published
    write_current(tmp_path / "adapters", 3, [0, 1])
    assert published_version(tmp_path, adapters=True) == 3


def test_the_ledger_line_balances_or_says_it_does_not():
    record = {"outbox_served": 10, "outbox_open": 2, "outbox_acked_sample": 6, "outbox_acked_no_signal": 2}
    assert ledger_line(record) == ("ledger: 10 served main turns = 6 samples in the pool + 2 dropped (no_signal 2) "
                                   "+ 2 in flight (balanced)")
    assert ledger_line({**record, "outbox_served": 11}).endswith("(NOT balanced)")


@pytest.mark.slow
def test_a_loop_that_keeps_dying_stops_the_live_run_naming_it(tiny_model, tmp_path):
    from tests.e2e.test_chaos import loop_pid, wait_until
    from tests.e2e.test_live import LiveRun

    run = LiveRun(tmp_path / "run", "run.max_restarts=1", "run.restart_backoff_s=0.2")
    try:
        run.wait_ready()
        os.kill(loop_pid(run, "judge"), signal.SIGKILL)
        wait_until(lambda: any(line.startswith("[run] restarted 'judge'") for line in run.lines), 60, "a restart", run)
        os.kill(loop_pid(run, "judge"), signal.SIGKILL)
        assert run.proc.wait(timeout=120) == 1
        run.reader.join(timeout=30)
        out = "".join(run.lines)
        assert "[run] FAILED: loop 'judge' failed 2 times within 600s (run.max_restarts=1); stopping the run" in out
        assert "[run] restarts: judge 1" in out and "ledger: 0 served main turns" in out
    finally:
        run.kill()


HOLD = ("import sys, time; from pathlib import Path; from clawr1.supervisor import hold_run_lock; "
        "p = Path(sys.argv[1]); p.mkdir(); hold_run_lock(p); print('held', flush=True); time.sleep(120)")


def test_a_second_run_in_a_live_runs_directory_is_refused_naming_it(tmp_path):
    run_dir = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        for flags in ([], ["--resume"], ["--overwrite"]):
            out = subprocess.run([sys.executable, "-m", "clawr1.cli", "run", "recipes/combined/cpu.yaml",
                                  f"run.dir={run_dir}", *flags], cwd=REPO, capture_output=True, text=True, timeout=120)
            assert out.returncode == 1 and f"is in use by another clawr1 run (pid {holder.pid})" in out.stderr, flags
        assert (run_dir / "run.lock").exists()  # --overwrite deleted nothing
    finally:
        holder.kill()
        holder.wait()
    recipe = REPO / "recipes/combined/cpu.yaml"  # the kernel released the lock of the killed run
    cfg = prepare(load_config(recipe, [f"run.dir={run_dir}"]), recipe, overwrite=True)
    try:
        assert (run_dir / "run.lock").read_text() == f"{os.getpid()}\n"
    finally:
        _held_locks.pop(cfg.run_dir.resolve()).close()
