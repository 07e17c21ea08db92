"""The sample pool: durable storage, batching, and the trainer's committed cursor.

Two kinds of logs live in the pool directory:

- `samples-NNNNNN.log`: the acknowledged Samples, in arrival order, in segments of `segment_samples`;
- `ledger.log`: leases (batch id -> sample ids, samples dropped as stale) and
  commits (every batch up to an id is checkpointed by the trainer).

Batches are numbered 1, 2, 3... The trainer asks for "the batch after the last
one I trained". If that batch was leased before (the trainer restarted from a
checkpoint), the same samples come back in the same order; otherwise a new
lease is written durably before it is served. Commits release samples for
good. So after kill -9 of pool or trainer, no acknowledged sample is lost and
none is trained twice.

Disk and restart time stay bounded: a segment whose samples are all committed or dropped is deleted (or
moved to `archive`), the ledger is rewritten with only what live segments need, and recovery reads only live
segments. The ids of deleted segments stay known for `seen_window_segments` segments (`seen-NNNNNN.ids`), so
a late resend of one of them is still acknowledged as a duplicate.
"""
from __future__ import annotations

import os
import shutil
import time
from collections import Counter, OrderedDict, deque
from pathlib import Path
from typing import Callable, Iterator, Optional, Union

import msgspec

from clawr1.record_log import RecordLog, read_records
from clawr1.protocol import Ack, Batch, BatchRequest, NoBatch, PoolStats, Sample


class Lease(msgspec.Struct, tag=True):
    batch_id: int
    sample_ids: list[str]
    dropped_ids: list[str] = []


class CommitRecord(msgspec.Struct, tag=True):
    batch_id: int


LedgerRecord = Union[Lease, CommitRecord]


LEDGER_REWRITE_AFTER = 1024  # ledger records since the last rewrite


class SampleSegments:
    """The samples, in segment files; appends go to the newest, which rolls over after `segment_samples`."""

    def __init__(self, directory: Path, fsync: bool, segment_samples: int, archive: Optional[Path]):
        self.dir, self.fsync, self.segment_samples, self.archive = directory, fsync, segment_samples, archive
        self.written: dict[int, int] = {}  # samples per live segment
        self.active = 0
        self.log: Optional[RecordLog] = None
        legacy = self.dir / "samples.log"  # a pool written before segments: its first segment
        if legacy.exists() and not self.path(0).exists():
            os.replace(legacy, self.path(0))

    def path(self, index: int) -> Path:
        return self.dir / f"samples-{index:06d}.log"

    def replay(self) -> Iterator[tuple[int, Sample]]:
        """(segment, sample) for every sample of every live segment; then the newest is open for appending."""
        indices = sorted(int(p.stem.split("-")[1]) for p in self.dir.glob("samples-*.log"))
        for index in indices:
            log = RecordLog(self.path(index), Sample, self.fsync)
            self.written[index] = 0
            for sample in log.replay():
                self.written[index] += 1
                yield index, sample
            log.close()
        self._open(indices[-1] if indices else 1)

    def append_many(self, samples: list[Sample]) -> int:
        """Write `samples` durably into the active segment (rolling over first when it is full); its index."""
        if self.written[self.active] >= self.segment_samples:
            self.log.close()
            self._open(self.active + 1)
        self.log.append_many(samples)
        self.written[self.active] += len(samples)
        return self.active

    def _open(self, index: int) -> None:
        """Make segment `index` the active one, open for appending."""
        self.active = index
        self.written.setdefault(index, 0)
        self.log = RecordLog(self.path(index), Sample, self.fsync)
        list(self.log.replay())

    def retire(self, index: int) -> None:
        """Delete (or archive) a segment none of whose samples is needed any more."""
        self.written.pop(index, None)
        if self.archive is not None:
            self.archive.mkdir(parents=True, exist_ok=True)
            shutil.move(str(self.path(index)), str(self.archive / self.path(index).name))
        else:
            self.path(index).unlink(missing_ok=True)

    def close(self) -> None:
        if self.log is not None:
            self.log.close()


def read_samples(pool_dir: Path) -> list[Sample]:
    """Every sample of a pool directory's live segments, in order, read only (for inspecting a running pool)."""
    return [s for path in sorted(Path(pool_dir).glob("samples-*.log")) for s in read_records(path, Sample)]


class PoolError(ValueError):
    """A request that contradicts the pool's durable state (answered as an error, state untouched)."""


class SamplePool:
    def __init__(self, directory: Path, max_staleness: int, max_pending: int = 100_000, fsync: bool = True,
                 group_size: int = 1, group_timeout_s: float = 60.0, clock: Callable[[], float] = time.time,
                 segment_samples: int = 10_000, seen_window_segments: int = 8, archive: Optional[Path] = None):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.max_staleness = max_staleness
        self.max_pending = max_pending
        self.group_size, self.group_timeout_s, self.clock = group_size, group_timeout_s, clock
        self.fsync = fsync
        self.samples: dict[str, Sample] = {}  # acknowledged and not yet committed
        self.pending: OrderedDict[str, None] = OrderedDict()  # not leased, in arrival order
        self.leases: dict[int, Lease] = {}  # leased and not yet committed
        self.segment_of: dict[str, int] = {}  # every sample id of the live segments
        self.unreleased: Counter = Counter()  # per live segment: its samples not yet committed or dropped
        self.retired_ids: deque[set[str]] = deque(maxlen=seen_window_segments)  # ids of recently deleted segments
        self.committed_batch_id = 0
        self.received = 0
        self.dropped_stale = 0
        self._segments = SampleSegments(self.dir, fsync, segment_samples, archive)
        self._ledger = RecordLog(self.dir / "ledger.log", LedgerRecord, fsync)
        self._ledger_records = 0
        self._recover()

    # ------------------------------------------------------------ recovery
    def _recover(self) -> None:
        for ids_file in sorted(self.dir.glob("seen-*.ids"))[-self.retired_ids.maxlen:] if self.retired_ids.maxlen else []:
            self.retired_ids.append(set(msgspec.msgpack.decode(ids_file.read_bytes(), type=list[str])))
        for index, s in self._segments.replay():
            self._admit(s, index)
        for rec in self._ledger.replay():
            self._ledger_records += 1
            if isinstance(rec, Lease):
                self._apply_lease(rec)
            else:
                self._apply_commit(rec.batch_id)

    def seen(self, sample_id: str) -> bool:
        return sample_id in self.segment_of or any(sample_id in ids for ids in self.retired_ids)

    def _admit(self, s: Sample, segment: int) -> None:
        self.segment_of[s.sample_id] = segment
        self.unreleased[segment] += 1
        self.samples[s.sample_id] = s
        self.pending[s.sample_id] = None
        self.received += 1

    def _release(self, sample_id: str) -> None:
        """A sample is committed or dropped: its segment goes once none of its samples is needed."""
        if self.samples.pop(sample_id, None) is None:
            return
        segment = self.segment_of[sample_id]
        self.unreleased[segment] -= 1
        if self.unreleased[segment] == 0 and segment != self._segments.active:
            self._retire(segment)

    def _retire(self, segment: int) -> None:
        ids = {sid for sid, seg in self.segment_of.items() if seg == segment}
        if self.retired_ids.maxlen:  # written (atomically) before the segment goes
            ids_file, tmp = self.dir / f"seen-{segment:06d}.ids", self.dir / f"seen-{segment:06d}.tmp"
            tmp.write_bytes(msgspec.msgpack.encode(sorted(ids)))
            os.replace(tmp, ids_file)
            for old in sorted(self.dir.glob("seen-*.ids"))[:-self.retired_ids.maxlen]:
                old.unlink()
            self.retired_ids.append(ids)
        for sid in ids:
            del self.segment_of[sid]
        self.unreleased.pop(segment, None)
        self._segments.retire(segment)

    def _apply_lease(self, lease: Lease) -> None:
        for sid in lease.sample_ids + lease.dropped_ids:
            self.pending.pop(sid, None)
        for sid in lease.dropped_ids:
            self._release(sid)
        self.dropped_stale += len(lease.dropped_ids)
        if lease.sample_ids:
            self.leases[lease.batch_id] = lease

    def _apply_commit(self, batch_id: int) -> None:
        for bid in [b for b in self.leases if b <= batch_id]:
            for sid in self.leases.pop(bid).sample_ids:
                self._release(sid)
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
            if self.seen(s.sample_id) or any(f.sample_id == s.sample_id for f in fresh):
                acks.append(Ack(id=s.sample_id))  # a retry of something already durable
            elif len(self.pending) + len(fresh) >= self.max_pending:
                acks.append(Ack(id=s.sample_id, ok=False, retry=True,
                                error=f"pool full ({self.max_pending} samples pending)"))
            else:
                fresh.append(s)
                acks.append(Ack(id=s.sample_id))
        if fresh:
            before = self._segments.active
            segment = self._segments.append_many(fresh)
            for s in fresh:
                self._admit(s, segment)
            if segment != before and self.unreleased[before] == 0:  # rolled over a segment nothing needs
                self._retire(before)
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
        self._append_ledger(CommitRecord(batch_id))
        self._apply_commit(batch_id)
        if self._ledger_records >= LEDGER_REWRITE_AFTER:
            self._rewrite_ledger()

    def stats(self) -> PoolStats:
        return PoolStats(pending=len(self.pending), received=self.received,
                         committed_batch_id=self.committed_batch_id, dropped_stale=self.dropped_stale)

    def close(self) -> None:
        self._segments.close()
        self._ledger.close()

    def disk_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.dir.iterdir() if p.is_file())

    # ------------------------------------------------------------ the ledger's size
    def _append_ledger(self, record: Union[Lease, CommitRecord]) -> None:
        self._ledger.append(record)
        self._ledger_records += 1

    def _rewrite_ledger(self) -> None:
        """Keep the cursor and the leases whose samples are still in live segments (recovery needs them to
        know those samples are taken); written aside, then renamed over the ledger."""
        kept: list[Union[Lease, CommitRecord]] = [CommitRecord(self.committed_batch_id)]
        kept += [lease for lease in self._replayed_leases() if any(
            sid in self.segment_of for sid in lease.sample_ids + lease.dropped_ids)]
        self._ledger.rewrite(kept)
        self._ledger_records = len(kept)

    def _replayed_leases(self) -> list[Lease]:
        return [r for r in read_records(self.dir / "ledger.log", LedgerRecord) if isinstance(r, Lease)]

    # ------------------------------------------------------------ helpers
    def _whole_groups(self, fresh: list[str], batch_size: int) -> Optional[list[str]]:
        """Complete groups (group_size attempts, or waiting past the timeout) in arrival order, until the batch
        holds at least batch_size samples; None if there are not enough yet. Groups are never split. An attempt
        is a session: a multi-turn episode's turns count once (they arrive together when the judge holds them for
        the outcome), so a group is never taken with one attempt's turns and without the others'. A sample that
        names no group (the judge gives it its own id as group id) is a complete group of one: nothing else will
        join it, so it never waits for the timeout."""
        groups: dict[str, list[str]] = {}
        for sid in fresh:
            groups.setdefault(self.samples[sid].group_id, []).append(sid)
        now, chosen = self.clock(), []
        for group_id, members in groups.items():
            first = min(self.samples[sid].created_at for sid in members)
            alone = members == [group_id]
            attempts = {self.samples[sid].session_id or sid for sid in members}
            if alone or len(attempts) >= self.group_size or now - first >= self.group_timeout_s:
                chosen += members
                if len(chosen) >= batch_size:
                    return chosen
        return None

    def _is_stale(self, s: Sample, trainer_version: int) -> bool:
        """Too old to train on-policy; ingested logs are off-policy by nature and never count as stale."""
        return not s.ingested and bool(s.versions) and trainer_version - min(s.versions) > self.max_staleness

    def _record(self, lease: Lease) -> None:
        self._append_ledger(lease)
        self._apply_lease(lease)

    def _batch(self, lease: Lease) -> Batch:
        return Batch(batch_id=lease.batch_id, samples=[self.samples[sid] for sid in lease.sample_ids],
                     dropped_stale=len(lease.dropped_ids), pending=len(self.pending))
