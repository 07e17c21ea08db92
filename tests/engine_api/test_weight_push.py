"""Issue 26: one NCCL for the trainer and the engines, and a refusal that cannot stall the trainer.

Engines are real HTTP servers on loopback: SGLang stand-ins (FakeEngine) where only the HTTP side matters,
and engine processes that join real gloo groups (ENGINES_SCRIPT) where the broadcasts matter, both from
tests/serving/test_sglang_contract.py.
"""
from __future__ import annotations

import logging
import re
import threading
import time

import httpx
import pytest
import torch.distributed as dist

from clawr1.engine_api.weight_push import (
    BROADCAST_THREAD, DistributedWeightSync, NcclVersionMismatch, RankZeroGroup, WeightSyncError, buckets, dtype_name,
)
from tests.serving.test_sglang_contract import (
    ENGINES_SCRIPT, NAMED, SGLANG_0_5_15, SGLANG_0_5_23, FakeEngine, GlooEngines, Log, Wire, _tensors,
)

TRAINER_NCCL = "2.29.7"  # torch 2.13.0's NCCL
REFUSAL = "Failed to receive weights: shape mismatch"


@pytest.fixture
def engines():
    """engines(**per_engine_kw) -> (log, wire, [FakeEngine, ...]) named A, B, ...; all closed afterwards."""
    made: list[FakeEngine] = []
    wires: list[Wire] = []

    def make(*specs: dict):
        log = Log()
        wire = Wire(log)
        wires.append(wire)
        made.extend(FakeEngine(chr(ord("A") + i), log, wire, **spec) for i, spec in enumerate(specs))
        return log, wire, made[-len(specs):]

    yield make
    for w in wires:
        w.close()
    for e in made:
        e.close()


@pytest.fixture
def gloo_engines(tmp_path):
    script = tmp_path / "engines.py"
    script.write_text(ENGINES_SCRIPT)
    started = GlooEngines(script)
    yield started
    started.stop()


def _sync(urls, wire, **kw) -> DistributedWeightSync:
    kw.setdefault("nccl_version", TRAINER_NCCL)
    return DistributedWeightSync(urls, bucket_bytes=16, broadcast=wire.broadcast, retry_interval_s=0.01, **kw)


def _paths(log: Log) -> list[str]:
    return [e[2] if e[0] == "http" else e[0] for e in log.events]


# ================================================================ the NCCL version contract


def test_an_engine_with_another_nccl_is_refused_before_any_broadcast(engines):
    log, wire, (a, b) = engines({"nccl_version": "2.30.7"}, {"nccl_version": TRAINER_NCCL})
    with _sync([a.url, b.url], wire) as sync:
        with pytest.raises(NcclVersionMismatch) as err:
            sync.connect("127.0.0.1", 29500, [1, 1])
        with pytest.raises(WeightSyncError, match="before connect"):
            sync.push(_tensors(), 1)
    msg = str(err.value)
    assert f"this trainer has NCCL {TRAINER_NCCL}" in msg and f"engine {a.url} has NCCL 2.30.7" in msg
    assert b.url not in msg  # the engine that matches is not blamed
    paths = _paths(log)
    assert "/model_info" in paths and "/init_weights_update_group" not in paths
    assert "broadcast" not in paths and "/update_weights_from_distributed" not in paths and not a.paused


def test_engines_with_the_trainers_nccl_are_connected_and_updated(engines):
    log, wire, (a,) = engines({"nccl_version": TRAINER_NCCL})
    with _sync([a.url], wire) as sync:
        sync.connect("127.0.0.1", 29500, [1])
        sync.push(_tensors(), 2)
    paths = _paths(log)
    assert paths.index("/model_info") < paths.index("/init_weights_update_group")
    assert [e[2] for e in log.events if e[0] == "broadcast"] == ["w0", "w1", "w2", "w3"]
    assert a.weight_version == "2"


@pytest.mark.parametrize("release, trainer_nccl, tail", [
    (SGLANG_0_5_23, TRAINER_NCCL, "brings NCCL 2.30.7: unless that engine runs another torch, NCCL will refuse the group"),
    (SGLANG_0_5_15, TRAINER_NCCL, "brings NCCL 2.28.9: unless that engine runs another torch, NCCL will refuse the group"),
    (SGLANG_0_5_23, "2.30.7", "its release pins torch 2.14.1, which brings NCCL 2.30.7"),  # docs/trainer.md's pairing
    ("0.5.22", TRAINER_NCCL, f"(this trainer has NCCL {TRAINER_NCCL})"),  # a release docs/trainer.md does not pin
])
def test_an_sglang_engine_that_reports_no_nccl_is_not_checked_but_warned_about(engines, caplog, release, trainer_nccl,
                                                                                tail):
    log, wire, (a,) = engines({"version": release})
    with caplog.at_level(logging.WARNING, logger="clawr1.weight_sync"), \
            _sync([a.url], wire, nccl_version=trainer_nccl) as sync:
        sync.connect("127.0.0.1", 29500, [1])
    warned = [r.getMessage() for r in caplog.records if a.url in r.getMessage()]
    assert len(warned) == 1 and f"(sglang {release}) does not report its NCCL version, so it is not checked" in warned[0]
    assert warned[0].endswith(tail), warned[0]
    assert "/init_weights_update_group" in _paths(log)  # connected all the same


def test_the_check_is_for_nccl_only(engines):
    log, wire, (a,) = engines({"nccl_version": "2.30.7"})
    with _sync([a.url], wire, backend="gloo") as sync:
        sync.connect("127.0.0.1", 29500, [1])
    assert "/model_info" not in _paths(log) and "/init_weights_update_group" in _paths(log)


# ================================================================ a refusal cannot stall the trainer


class QueuedBroadcastGroup(RankZeroGroup):
    """Stands in for NCCL's queueing on gloo: broadcast() returns as soon as the broadcast is issued, as
    ProcessGroupNCCL's work.wait() does, so the sender finishes whether or not the engines receive."""

    aborted: list[str] = []

    @property
    def queues_broadcasts(self) -> bool:
        return True

    def broadcast(self, tensor) -> None:
        if self.broken is not None:
            raise WeightSyncError(f"weight-update group {self.name} is unusable: {self.broken}")
        opts = dist.BroadcastOptions()
        opts.rootRank, opts.rootTensor = 0, 0
        self.pg.broadcast([tensor.contiguous()], opts)  # queued; nothing waits for it

    def abort(self, reason: str) -> None:
        QueuedBroadcastGroup.aborted.append(self.name)
        super().abort(reason)


def _weights(t) -> list:
    return [dtype_name(t.dtype), t.float().flatten().tolist()]


def test_a_refused_second_publish_lets_the_next_step_and_shutdown_finish_within_10s(gloo_engines):
    per_publish = len(buckets(NAMED, 32))  # update calls per publish: engine B refuses from the second publish
    urls = gloo_engines({"version": SGLANG_0_5_23},
                        {"version": SGLANG_0_5_23, "refuse": REFUSAL, "refuse_from": per_publish})
    sync = DistributedWeightSync(urls, backend="gloo", bucket_bytes=32, timeout_s=60, refusal_grace_s=1.0)
    try:
        sync.connect("127.0.0.1", 0, [1, 1])
        sync.push(NAMED, 1)
        t0 = time.monotonic()
        with pytest.raises(WeightSyncError, match=f"engine {urls[1]}: /update_weights_from_distributed answered "
                                                  f"HTTP 400: .*{REFUSAL}"):
            sync.push([(n, t * 2) for n, t in NAMED], 2)
        with pytest.raises(WeightSyncError, match="weight-update group clawr1_weights-1 was abandoned"):
            sync.push([(n, t * 3) for n, t in NAMED], 3)  # the next step's publish fails at once
    finally:
        sync.close()
    elapsed = time.monotonic() - t0
    assert elapsed < 10, elapsed
    stuck = [t for t in threading.enumerate() if t.name == BROADCAST_THREAD and t.is_alive()]
    assert not stuck
    first, second = (httpx.get(f"{u}/state", timeout=10).json() for u in urls)
    assert first["weights"] == {n: _weights(t * 3) for n, t in NAMED}  # the other engine took every publish
    assert second["weights"] == {n: _weights(t) for n, t in NAMED}  # the refusing one kept the first
    assert second["calls"].count("/continue_generation") == 1  # left paused after the refusal


def test_a_queued_broadcast_is_aborted_after_a_refusal(gloo_engines):
    """NCCL's broadcast returns once queued: the sender is done when the refusal comes, and the group must be
    aborted anyway, or the orphaned broadcast would hold the trainer's CUDA stream."""
    QueuedBroadcastGroup.aborted.clear()
    urls = gloo_engines({"version": SGLANG_0_5_23}, {"version": SGLANG_0_5_23, "refuse": REFUSAL})
    sync = DistributedWeightSync(urls, backend="gloo", bucket_bytes=32, timeout_s=60, refusal_grace_s=1.0,
                                 group_class=QueuedBroadcastGroup)
    try:
        sync.connect("127.0.0.1", 0, [1, 1])
        t0 = time.monotonic()
        with pytest.raises(WeightSyncError, match=re.escape(REFUSAL)):
            sync.push(NAMED, 1)
        assert QueuedBroadcastGroup.aborted == ["clawr1_weights-1"]  # the refusing engine's group, not the other
        with pytest.raises(WeightSyncError, match=rf"weight-update group clawr1_weights-1 was abandoned \(an engine "
                                                  rf"refused the update: engine {re.escape(urls[1])}"):
            sync.push(NAMED, 2)
    finally:
        sync.close()
    assert time.monotonic() - t0 < 10
    first = httpx.get(f"{urls[0]}/state", timeout=10).json()
    assert first["weights"] == {n: _weights(t) for n, t in NAMED}
