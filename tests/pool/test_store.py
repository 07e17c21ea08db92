import pytest

from clawr1.pool.store import PoolError, SamplePool
from clawr1.protocol import Batch, BatchRequest, NoBatch, Sample


def sample(i: int, version: int = 0) -> Sample:
    return Sample(sample_id=f"s{i}", group_id=f"s{i}", tokens=[1, 2, 3], prompt_len=2, loss_mask=[1],
                  rollout_logprobs=[-0.5], versions=[version], reward=1.0)


def req(last: int, size: int = 2, version: int = 0) -> BatchRequest:
    return BatchRequest(trainer_version=version, last_batch_id=last, batch_size=size)


def test_batches_in_arrival_order_and_no_batch_when_short(tmp_path):
    pool = SamplePool(tmp_path, max_staleness=4, fsync=False)
    assert all(a.ok for a in pool.add([sample(0), sample(1), sample(2)]))
    b1 = pool.next_batch(req(0))
    assert isinstance(b1, Batch) and b1.batch_id == 1 and [s.sample_id for s in b1.samples] == ["s0", "s1"]
    nb = pool.next_batch(req(1))
    assert isinstance(nb, NoBatch) and nb.pending == 1


def test_duplicates_are_acked_once_and_invalid_samples_nacked(tmp_path):
    pool = SamplePool(tmp_path, max_staleness=4, fsync=False)
    pool.add([sample(0)])
    bad = sample(1)
    bad.rollout_logprobs = []
    acks = pool.add([sample(0), bad])
    assert acks[0].ok and not acks[1].ok and not acks[1].retry and "rollout_logprobs" in acks[1].error
    assert pool.stats().received == 1


def test_full_pool_asks_to_retry(tmp_path):
    pool = SamplePool(tmp_path, max_staleness=4, max_pending=2, fsync=False)
    acks = pool.add([sample(0), sample(1), sample(2)])
    assert [(a.ok, a.retry) for a in acks] == [(True, False), (True, False), (False, True)] and "pool full" in acks[2].error


def test_restart_replays_uncommitted_leases_and_keeps_acked_samples(tmp_path):
    pool = SamplePool(tmp_path, max_staleness=4)
    pool.add([sample(i) for i in range(5)])
    first = pool.next_batch(req(0))
    second = pool.next_batch(req(1))
    pool.commit(1)
    pool.close()  # as good as kill -9: everything above was fsynced before returning

    pool = SamplePool(tmp_path, max_staleness=4)
    assert pool.committed_batch_id == 1
    again = pool.next_batch(req(1))  # the trainer resumes after batch 1: batch 2 comes back unchanged
    assert again.batch_id == 2 and again.samples == second.samples
    third = pool.next_batch(req(2, size=1))
    assert [s.sample_id for s in third.samples] == ["s4"]
    trained = [s.sample_id for b in (first, again, third) for s in b.samples]
    assert sorted(trained) == [f"s{i}" for i in range(5)] and len(set(trained)) == 5


def test_committed_batches_cannot_be_served_again(tmp_path):
    pool = SamplePool(tmp_path, max_staleness=4, fsync=False)
    pool.add([sample(0), sample(1)])
    pool.next_batch(req(0))
    pool.commit(1)
    pool.commit(1)  # idempotent
    with pytest.raises(PoolError, match="already committed"):
        pool.next_batch(req(0))
    with pytest.raises(PoolError, match="never leased"):
        pool.commit(5)


def test_stale_samples_are_dropped_and_counted(tmp_path):
    pool = SamplePool(tmp_path, max_staleness=2, fsync=False)
    pool.add([sample(0, version=0), sample(1, version=5), sample(2, version=6)])
    b = pool.next_batch(req(0, size=2, version=6))
    assert [s.sample_id for s in b.samples] == ["s1", "s2"] and b.dropped_stale == 1
    pool.close()
    assert SamplePool(tmp_path, max_staleness=2, fsync=False).dropped_stale == 1


def grouped(i: int, group: str, created: float) -> Sample:
    s = sample(i)
    s.group_id, s.created_at = group, created
    return s


def test_groups_are_batched_whole_and_only_when_complete_or_timed_out(tmp_path):
    now = [100.0]
    pool = SamplePool(tmp_path, max_staleness=4, fsync=False, group_size=3, group_timeout_s=30, clock=lambda: now[0])
    pool.add([grouped(0, "a", 99), grouped(1, "b", 99), grouped(2, "a", 99), grouped(3, "b", 99)])
    assert isinstance(pool.next_batch(req(0, size=2)), NoBatch)  # two groups of 2 of 3
    pool.add([grouped(4, "a", 99)])
    b = pool.next_batch(req(0, size=2))
    assert [s.sample_id for s in b.samples] == ["s0", "s2", "s4"]  # all of group a, never split, over the size
    now[0] = 200.0  # group b waited past the timeout
    assert [s.sample_id for s in pool.next_batch(req(1, size=2)).samples] == ["s1", "s3"]
    # a sample naming no group (its group id is its own id) is complete alone: it does not wait for the timeout
    pool.add([grouped(5, "s5", 199), grouped(6, "c", 199), grouped(7, "s7", 199)])
    assert [s.sample_id for s in pool.next_batch(req(2, size=2)).samples] == ["s5", "s7"]


def test_a_multi_turn_attempt_counts_once_so_a_group_waits_for_its_other_attempts(tmp_path):
    now = [100.0]
    pool = SamplePool(tmp_path, max_staleness=4, fsync=False, group_size=2, group_timeout_s=30, clock=lambda: now[0])
    turns = [grouped(i, "g", 99) for i in range(3)]
    for turn, session in zip(turns, ["g-0", "g-0", "g-1"]):
        turn.session_id = session
    pool.add(turns[:2])  # attempt g-0's two turns: two samples, one attempt of 2
    assert isinstance(pool.next_batch(req(0, size=2)), NoBatch)
    pool.add(turns[2:])
    assert [s.sample_id for s in pool.next_batch(req(0, size=2)).samples] == ["s0", "s1", "s2"]


def test_ingested_logs_are_never_dropped_as_stale(tmp_path):
    pool = SamplePool(tmp_path, max_staleness=2, fsync=False)
    old_live, old_log = sample(0, version=0), sample(1, version=0)
    old_log.ingested = True
    pool.add([old_live, old_log, sample(2, version=9)])
    batch = pool.next_batch(req(0, size=2, version=10))
    assert [s.sample_id for s in batch.samples] == ["s1", "s2"] and batch.dropped_stale == 1


def train_all(pool: SamplePool, last: int, size: int) -> int:
    """Lease and commit every pending sample in batches of `size`; the last batch id."""
    while isinstance(batch := pool.next_batch(req(last, size=size)), Batch):
        last = batch.batch_id
        pool.commit(last)
    return last


def test_committed_segments_are_deleted_and_restart_reads_only_live_ones(tmp_path):
    pool = SamplePool(tmp_path, max_staleness=4, fsync=False, segment_samples=10, seen_window_segments=2)
    for i in range(0, 95, 5):
        pool.add([sample(j) for j in range(i, i + 5)])
    last = train_all(pool, 0, 10)  # 90 of 95 trained
    segments = sorted(p.name for p in tmp_path.glob("samples-*.log"))
    assert segments == ["samples-000010.log"]  # the active one (5 samples, not yet trained), nothing else
    assert sorted(p.name for p in tmp_path.glob("seen-*.ids")) == ["seen-000008.ids", "seen-000009.ids"]
    pool.close()

    pool = SamplePool(tmp_path, max_staleness=4, fsync=False, segment_samples=10, seen_window_segments=2)
    assert (pool.committed_batch_id, len(pool.pending), pool.received) == (last, 5, 5)
    assert [a.ok for a in pool.add([sample(85), sample(2)])] == [True, True]  # 85: a duplicate in the window...
    assert len(pool.pending) == 6 and "s2" in pool.pending  # ...2 is older than it: accepted again (documented)
    nxt = pool.next_batch(req(last, size=6))
    assert sorted(s.sample_id for s in nxt.samples) == ["s2", "s90", "s91", "s92", "s93", "s94"]


def test_a_leased_batch_keeps_its_segments_until_it_is_committed(tmp_path):
    pool = SamplePool(tmp_path, max_staleness=4, fsync=False, segment_samples=4)
    pool.add([sample(i) for i in range(4)])
    pool.add([sample(i) for i in range(4, 8)])
    leased = pool.next_batch(req(0, size=8))  # the trainer got batch 1, then died before committing it
    pool.add([sample(i) for i in range(8, 10)])
    pool.close()
    assert len(list(tmp_path.glob("samples-*.log"))) == 3
    pool = SamplePool(tmp_path, max_staleness=4, fsync=False, segment_samples=4)
    assert pool.next_batch(req(0, size=8)).samples == leased.samples  # the same batch again
    pool.commit(1)
    assert sorted(p.name for p in tmp_path.glob("samples-*.log")) == ["samples-000003.log"]


def test_the_ledger_is_rewritten_and_a_restart_agrees(tmp_path, monkeypatch):
    import clawr1.pool.store as store

    monkeypatch.setattr(store, "LEDGER_REWRITE_AFTER", 8)
    pool = SamplePool(tmp_path, max_staleness=4, fsync=False, segment_samples=4)
    for i in range(0, 60, 3):
        pool.add([sample(j) for j in range(i, i + 3)])
    last = train_all(pool, 0, 2)
    pool.add([sample(60)])
    assert len(read_ledger(tmp_path)) <= 8 + 2  # 60 leases and commits, rewritten down to what is still needed
    pool.close()
    pool = SamplePool(tmp_path, max_staleness=4, fsync=False, segment_samples=4)
    assert (pool.committed_batch_id, list(pool.pending), pool.leases) == (last, ["s60"], {})


def read_ledger(directory):
    from clawr1.pool.store import LedgerRecord
    from clawr1.record_log import read_records

    return read_records(directory / "ledger.log", LedgerRecord)


def test_an_archive_keeps_the_deleted_segments(tmp_path):
    pool = SamplePool(tmp_path / "pool", max_staleness=4, fsync=False, segment_samples=4, archive=tmp_path / "old")
    pool.add([sample(i) for i in range(4)])
    pool.add([sample(i) for i in range(4, 6)])
    train_all(pool, 0, 4)
    assert sorted(p.name for p in (tmp_path / "old").iterdir()) == ["samples-000001.log"]


def test_a_pool_written_before_segments_is_read_as_its_first_segment(tmp_path):
    from clawr1.record_log import RecordLog

    old = RecordLog(tmp_path / "samples.log", Sample, fsync=False)
    list(old.replay())
    old.append_many([sample(0), sample(1)])
    old.close()
    pool = SamplePool(tmp_path, max_staleness=4, fsync=False)
    assert list(pool.pending) == ["s0", "s1"] and not (tmp_path / "samples.log").exists()
