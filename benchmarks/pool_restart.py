"""Pool restart time against the number of committed samples, segmented (the pool as it runs) and not.

For each size N: a pool takes N samples (256 tokens each, 64 at a time as the judge delivers them), the
trainer leases and commits what it can in batches of 32, 64 more stay pending, and the pool is closed. The
restart time is how long opening that directory takes (replaying what it must). The baseline is the same
work with one segment that is never deleted (`segment_samples` larger than N), which replays the whole
history as the pool did before segments. Goal: under 2 s at 100,000 committed samples.

Usage: python benchmarks/pool_restart.py [--sizes 1000 10000 100000] [--segment-samples 10000]
Prints one JSON line.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from clawr1.pool.store import SamplePool  # noqa: E402
from clawr1.protocol import Batch, BatchRequest, Sample  # noqa: E402

TOKENS, RESPONSE = 256, 64


def sample(i: int) -> Sample:
    return Sample(sample_id=f"session-{i // 8}/0/{i % 8}", group_id=f"g{i}", tokens=list(range(TOKENS)),
                  prompt_len=TOKENS - RESPONSE, loss_mask=[1] * RESPONSE, rollout_logprobs=[-0.5] * RESPONSE,
                  versions=[0] * RESPONSE, reward=1.0)


def fill(directory: Path, n: int, segment_samples: int) -> tuple[int, int, int]:
    """A pool directory that received n samples and trained all it could in batches of 32, then 64 more
    pending; (samples committed, samples pending, size in bytes)."""
    pool = SamplePool(directory, max_staleness=10**9, fsync=False, segment_samples=segment_samples,
                      max_pending=10**9)
    last, committed = 0, 0
    for start in range(0, n, 64):
        pool.add([sample(i) for i in range(start, min(start + 64, n))])
        while isinstance(batch := pool.next_batch(BatchRequest(trainer_version=0, last_batch_id=last,
                                                               batch_size=32)), Batch):
            last, committed = batch.batch_id, committed + len(batch.samples)
            pool.commit(last)
    pool.add([sample(i) for i in range(n, n + 64)])
    pending, size = len(pool.pending), pool.disk_bytes()
    pool.close()
    return committed, pending, size


def restart_s(directory: Path, segment_samples: int) -> tuple[float, int]:
    t0 = time.perf_counter()
    pool = SamplePool(directory, max_staleness=10**9, fsync=False, segment_samples=segment_samples, max_pending=10**9)
    elapsed = time.perf_counter() - t0
    pending = len(pool.pending)
    pool.close()
    return elapsed, pending


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[1000, 10_000, 100_000])
    p.add_argument("--segment-samples", type=int, default=10_000)
    args = p.parse_args()
    rows = []
    for n in args.sizes:
        row = {}
        for name, segment in (("segmented", args.segment_samples), ("one_segment", n + 10**6)):
            with tempfile.TemporaryDirectory() as tmp:
                committed, pending, disk = fill(Path(tmp), n, segment)
                seconds, pending_after = restart_s(Path(tmp), segment)
            assert pending_after == pending, (pending_after, pending)  # the restart found the same pool
            row.update(committed=committed, pending=pending)
            row[f"{name}_restart_s"], row[f"{name}_disk_mb"] = round(seconds, 3), round(disk / 2**20, 1)
        row["speedup"] = round(row["one_segment_restart_s"] / max(row["segmented_restart_s"], 1e-6), 1)
        rows.append(row)
        print(f"[pool_restart] {row}", file=sys.stderr, flush=True)
    top = rows[-1]
    print(json.dumps({"benchmark": "pool_restart", "segment_samples": args.segment_samples, "rows": rows,
                      "restart_s_at_largest": top["segmented_restart_s"],
                      "goal_met": top["committed"] < 100_000 or top["segmented_restart_s"] < 2.0}))


if __name__ == "__main__":
    main()
