"""What a GRPO run of a multi-turn environment must leave in its pool: groups of `attempts` sessions, whole in
every batch the trainer took."""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from clawr1.pool.store import Lease, LedgerRecord
from clawr1.protocol import Sample
from clawr1.record_log import read_records


def sessions_of_groups(samples: list[Sample]) -> dict[str, set[str]]:
    """Each group id's sessions (attempts)."""
    groups: dict[str, set[str]] = defaultdict(set)
    for s in samples:
        groups[s.group_id].add(s.session_id)
    return groups


def assert_grpo_groups(run_dir: Path, pool: list[Sample], attempts: int, steps: int) -> None:
    """Every group the trainer took (the pool's leases, one a step) holds all its attempts, however many turns
    each played. A group with fewer attempts in the pool can only be a worker's last (group id w<k>-e<n>), in
    flight when the run stopped: its served turns still reach the pool (the ledger)."""
    by_id = {s.sample_id: s for s in pool}
    leases = [r for r in read_records(run_dir / "pool" / "ledger.log", LedgerRecord) if isinstance(r, Lease)]
    assert len(leases) == steps
    for lease in leases:
        taken = sessions_of_groups([by_id[sid] for sid in lease.sample_ids])
        assert taken and all(len(sessions) == attempts for sessions in taken.values()), taken
    groups = sessions_of_groups(pool)
    assert all(1 <= len(sessions) <= attempts for sessions in groups.values())
    last_of_worker: dict[str, int] = {}
    for group in groups:
        worker, episode = group.split("-")[:2]
        last_of_worker[worker] = max(last_of_worker.get(worker, -1), int(episode[1:]))
    for group, sessions in groups.items():
        worker, episode = group.split("-")[:2]
        assert len(sessions) == attempts or int(episode[1:]) == last_of_worker[worker], group
