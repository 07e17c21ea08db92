"""The sample pool: durable storage, batching, and the trainer's committed cursor.

Two logs live in the pool directory:

- `samples.log`: every acknowledged Sample, in arrival order;
- `ledger.log`: leases (batch id -> sample ids, samples dropped as stale) and
  commits (every batch up to an id is checkpointed by the trainer).

Batches are numbered 1, 2, 3... The trainer asks for "the batch after the last
one I trained". If that batch was leased before (the trainer restarted from a
checkpoint), the same samples come back in the same order; otherwise a new
lease is written durably before it is served. Commits release samples for
good. So after kill -9 of pool or trainer, no acknowledged sample is lost and
none is trained twice.
"""
from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
import time
from typing import Callable, Optional, Union

import msgspec

from clawr1.record_log import RecordLog
from clawr1.protocol import Ack, Batch, BatchRequest, NoBatch, PoolStats, Sample


class Lease(msgspec.Struct, tag=True):
    batch_id: int
    sample_ids: list[str]
    dropped_ids: list[str] = []


class CommitRecord(msgspec.Struct, tag=True):
    batch_id: int


LedgerRecord = Union[Lease, CommitRecord]


class PoolError(ValueError):
    """A request that contradicts the pool's durable state (answered as an error, state untouched)."""


class SamplePool:
    def __init__(self, directory: Path, max_staleness: int, max_pending: int = 100_000, fsync: bool = True,
                 group_size: int = 1, group_timeout_s: float = 60.0, clock: Callable[[], float] = time.time):
        self.dir = Path(directory)
        self.max_staleness = max_staleness
        self.max_pending = max_pending
        self.group_size, self.group_timeout_s, self.clock = group_size, group_timeout_s, clock
        self.samples: dict[str, Sample] = {}  # acknowledged and not yet committed
        self.pending: OrderedDict[str, None] = OrderedDict()  # not leased, in arrival order
        self.leases: dict[int, Lease] = {}  # leased and not yet committed
        self.seen: set[str] = set()
        self.committed_batch_id = 0
        self.received = 0
        self.dropped_stale = 0
        self._samples_log = RecordLog(self.dir / "samples.log", Sample, fsync)
        self._ledger = RecordLog(self.dir / "ledger.log", LedgerRecord, fsync)
        self._recover()

    # ------------------------------------------------------------ recovery
    def _recover(self) -> None:
        for s in self._samples_log.replay():
            self._admit(s)
        for rec in self._ledger.replay():
            if isinstance(rec, Lease):
                self._apply_lease(rec)
            else:
                self._apply_commit(rec.batch_id)

    def _admit(self, s: Sample) -> None:
        self.seen.add(s.sample_id)
        self.samples[s.sample_id] = s
        self.pending[s.sample_id] = None
        self.received += 1

    def _apply_lease(self, lease: Lease) -> None:
        for sid in lease.sample_ids + lease.dropped_ids:
            self.pending.pop(sid, None)
        for sid in lease.dropped_ids:
            self.samples.pop(sid, None)
        self.dropped_stale += len(lease.dropped_ids)
        if lease.sample_ids:
            self.leases[lease.batch_id] = lease

    def _apply_commit(self, batch_id: int) -> None:
        for bid in [b for b in self.leases if b <= batch_id]:
            for sid in self.leases.pop(bid).sample_ids:
                self.samples.pop(sid, None)
        self.committed_batch_id = max(self.committed_batch_id, batch_id)

    # ------------------------------------------------------------ judge side
    def add(self, samples: list[Sample]) -> list[Ack]:
        """Store samples durably (one fsync for the lot), then acknowledge each."""
        acks, fresh = [], []
        for s in samples:
            try:
                s.check()
            except ValueError as e:
                acks.append(Ack(id=s.sample_id, ok=False, error=f"invalid sample: {e}"))
                continue
            if s.sample_id in self.seen or any(f.sample_id == s.sample_id for f in fresh):
                acks.append(Ack(id=s.sample_id))  # a retry of something already durable
            elif len(self.pending) + len(fresh) >= self.max_pending:
                acks.append(Ack(id=s.sample_id, ok=False, retry=True,
                                error=f"pool full ({self.max_pending} samples pending)"))
            else:
                fresh.append(s)
                acks.append(Ack(id=s.sample_id))
        if fresh:
            self._samples_log.append_many(fresh)
            for s in fresh:
                self._admit(s)
        return acks

    # ------------------------------------------------------------ trainer side
    def next_batch(self, req: BatchRequest) -> Union[Batch, NoBatch]:
        batch_id = req.last_batch_id + 1
        if batch_id in self.leases:  # the trainer restarted: serve exactly what it got before
            return self._batch(self.leases[batch_id])
        if batch_id <= self.committed_batch_id:
            raise PoolError(f"batch {batch_id} was already committed (the pool's cursor is at "
                            f"{self.committed_batch_id}); the trainer must resume from its latest checkpoint")
        newest = max(self.leases, default=self.committed_batch_id)
        if batch_id != newest + 1:
            raise PoolError(f"batch {batch_id} requested, but the next new batch is {newest + 1}")
        stale, fresh = [], []
        for sid in self.pending:
            (stale if self._is_stale(self.samples[sid], req.trainer_version) else fresh).append(sid)
        chosen = self._whole_groups(fresh, req.batch_size)
        if chosen is None:
            if stale:  # batch id 0: a ledger entry that only drops
                self._record(Lease(batch_id=0, sample_ids=[], dropped_ids=stale))
            return NoBatch(pending=len(fresh), reason=f"{len(fresh)} fresh samples, {req.batch_size} needed in complete groups")
        lease = Lease(batch_id=batch_id, sample_ids=chosen, dropped_ids=stale)
        self._record(lease)
        return self._batch(lease)

    def commit(self, batch_id: int) -> None:
        if batch_id > max(self.leases, default=self.committed_batch_id):
            raise PoolError(f"cannot commit batch {batch_id}: it was never leased")
        if batch_id <= self.committed_batch_id:
            return  # idempotent: a trainer that restarted re-sends its last commit
        self._ledger.append(CommitRecord(batch_id))
        self._apply_commit(batch_id)

    def stats(self) -> PoolStats:
        return PoolStats(pending=len(self.pending), received=self.received,
                         committed_batch_id=self.committed_batch_id, dropped_stale=self.dropped_stale)

    def close(self) -> None:
        self._samples_log.close()
        self._ledger.close()

    # ------------------------------------------------------------ helpers
    def _whole_groups(self, fresh: list[str], batch_size: int) -> Optional[list[str]]:
        """Complete groups (group_size samples, or waiting past the timeout) in arrival order, until the batch
        holds at least batch_size samples; None if there are not enough yet. Groups are never split."""
        groups: dict[str, list[str]] = {}
        for sid in fresh:
            groups.setdefault(self.samples[sid].group_id, []).append(sid)
        now, chosen = self.clock(), []
        for members in groups.values():
            first = min(self.samples[sid].created_at for sid in members)
            if len(members) >= self.group_size or now - first >= self.group_timeout_s:
                chosen += members
                if len(chosen) >= batch_size:
                    return chosen
        return None

    def _is_stale(self, s: Sample, trainer_version: int) -> bool:
        """Too old to train on-policy; ingested logs are off-policy by nature and never count as stale."""
        return not s.ingested and bool(s.versions) and trainer_version - min(s.versions) > self.max_staleness

    def _record(self, lease: Lease) -> None:
        self._ledger.append(lease)
        self._apply_lease(lease)

    def _batch(self, lease: Lease) -> Batch:
        return Batch(batch_id=lease.batch_id, samples=[self.samples[sid] for sid in lease.sample_ids],
                     dropped_stale=len(lease.dropped_ids), pending=len(self.pending))
