"""Chaos: a live run (`recipes/live/cpu.yaml`, run.on_loop_failure=restart) under an external client, its judge,
pool, trainer and gateway each killed with SIGKILL at a random moment. The run must heal itself, and the durable
records must balance: every served main turn acknowledged (its Sample in the pool, or dropped with a reason), every
Sample in the pool a served turn, no sample leased to two batches (trained twice)."""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from clawr1.gateway.outbox import Entry, Outbox
from clawr1.pool.store import Lease, LedgerRecord, read_samples
from clawr1.protocol import TurnAck, TurnRecord, turn_key
from clawr1.record_log import read_records
from tests.conftest import REPO
from tests.e2e.test_live import LiveRun, steps
from tests.e2e.test_run import descendants

pytestmark = pytest.mark.slow
VICTIMS = ("judge", "pool", "trainer", "gateway")


def loop_pid(run: LiveRun, loop: str) -> int:
    """The pid of the run's `clawr1 <loop>` process (`train` for the trainer), from /proc."""
    command = "train" if loop == "trainer" else loop
    for pid in descendants(run.proc.pid):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except FileNotFoundError:
            continue
        if argv[1:4] == [b"-m", b"clawr1.cli", command.encode()]:
            return pid
    raise AssertionError(f"no {loop} process under the run")


def wait_until(predicate, timeout: float, what: str, run: LiveRun) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert run.proc.poll() is None, "the run exited:\n" + "".join(run.lines[-60:])
        assert time.monotonic() < deadline, f"{what} did not happen in {timeout:.0f}s:\n" + "".join(run.lines[-60:])
        time.sleep(0.5)


def answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def client_failures(stderr: Path) -> int:
    return sum("failed" in line for line in stderr.read_text().splitlines()) if stderr.exists() else 0


def gateway_record(run_dir: Path) -> dict:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return next((r for r in map(json.loads, reversed(lines)) if r["loop"] == "gateway"), {})


def test_kills_of_judge_pool_trainer_and_gateway_heal_and_the_ledger_balances(tiny_model, tmp_path):
    run_dir, rng = tmp_path / "chaos", random.Random(1)
    # small pool segments, archived rather than deleted: segments come and go during the run, and the check
    # below can still read every sample the pool ever took
    run = LiveRun(run_dir, "gateway.outbox_resend_s=10", "gateway.outbox_rewrite_after=1000000",
                  "gateway.session_ttl_s=8", "run.restart_backoff_s=0.5", "trainer.checkpoint_every=5",
                  "pool.segment_samples=1000", f"pool.archive={run_dir / 'archive'}")
    stderr = tmp_path / "client.err"
    users = None
    try:
        url = run.wait_ready()
        with open(stderr, "w") as err:  # the client's failed requests, one line each
            users = subprocess.Popen([sys.executable, "-m", "envs.personal.client", "--base-url", url, "--users", "8"],
                                     cwd=REPO, stdout=subprocess.DEVNULL, stderr=err, text=True)
        wait_until(lambda: steps(run_dir) >= 3, 300, "3 training steps", run)
        for victim in VICTIMS:
            time.sleep(rng.uniform(2.0, 8.0))  # a random moment
            if victim == "gateway":  # the only kill clients may notice: its address is down until it is back
                assert client_failures(stderr) == 0, stderr.read_text()[-2000:]
            before, restarted = steps(run_dir), f"[run] restarted '{victim}'"
            os.kill(loop_pid(run, victim), signal.SIGKILL)
            wait_until(lambda: any(line.startswith(restarted) for line in run.lines), 120, f"{victim} restarted", run)
            wait_until(lambda: steps(run_dir) >= before + 2, 240, f"training after the {victim} kill", run)
        wait_until(lambda: answers(f"{url.removesuffix('/v1')}/health"), 60, "the gateway answering", run)
        users.send_signal(signal.SIGTERM)
        users.wait(timeout=60)
        # every session's last turn expires (next state "none"), and every open turn reaches the judge
        wait_until(lambda: gateway_record(run_dir).get("outbox_open") == 0, 180, "an empty outbox", run)
        code, out = run.interrupt()
        assert code == 130, out[-3000:]
    finally:
        if users is not None and users.poll() is None:
            users.kill()
        run.kill()

    assert all(f"[run] loop '{v}' exited with code -9 (killed by SIGKILL)" in out for v in VICTIMS)
    assert "[run] restarts: gateway 1, judge 1, pool 1, trainer 1" in out

    # the ledger, from the durable records alone
    entries = read_records(run_dir / "gateway" / "outbox.log", Entry)
    served = [turn_key(e) for e in entries if isinstance(e, TurnRecord)]
    acks = {key: e.reason for e in entries if isinstance(e, TurnAck) for key in e.keys}
    assert len(served) == len(set(served)) > 100  # each served main turn logged once, under its own id
    assert set(served) == set(acks), "served turns never acknowledged: %s" % sorted(set(served) - set(acks))[:10]
    assert Outbox(run_dir / "gateway" / "outbox.log").counts()["outbox_open"] == 0
    pooled = [s.sample_id for s in read_samples(run_dir / "archive") + read_samples(run_dir / "pool")]
    assert len(pooled) == len(set(pooled))  # resends were harmless: one sample per turn
    assert set(pooled) == {key for key, reason in acks.items() if reason == "sample"}
    reasons = Counter(acks.values())
    assert reasons["sample"] > 0 and set(reasons) <= {"sample", "no_signal", "refused", "error"}
    leased: dict[str, set[int]] = {}
    for lease in read_records(run_dir / "pool" / "ledger.log", LedgerRecord):
        if isinstance(lease, Lease):
            for sample_id in lease.sample_ids:
                leased.setdefault(sample_id, set()).add(lease.batch_id)
    assert leased and all(len(batches) == 1 for batches in leased.values())  # no sample in two batches
    assert set(leased) <= set(pooled)
