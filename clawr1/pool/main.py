"""`clawr1 pool`: serve the durable sample pool over ZeroMQ."""
from __future__ import annotations

import time
from pathlib import Path

import zmq

from clawr1.bus import RpcServer
from clawr1.config import Config
from clawr1.record_log import CorruptLog
from clawr1.pool.store import PoolError, SamplePool
from clawr1.protocol import Ack, BatchRequest, Commit, ErrorReply, Sample, StatsRequest
from clawr1.runtime import mark_ready, setup_logging, stop_event
from clawr1.tracking import MetricsWriter

MAX_GROUP_COMMIT = 256  # samples made durable with one fsync


def _drain_samples(server: RpcServer, pool: SamplePool) -> None:
    """Take every sample waiting on the socket, store them with one fsync, ack each."""
    batch: list[tuple[list[bytes], Sample]] = []
    while len(batch) < MAX_GROUP_COMMIT and server.sock.poll(0):
        route, msg, error = server.recv()
        if not isinstance(msg, Sample):
            server.reply(route, ErrorReply(error=error or f"expected a Sample, got {type(msg).__name__}"))
            continue
        batch.append((route, msg))
    if batch:
        acks = pool.add([s for _, s in batch])
        for (route, _), ack in zip(batch, acks):
            server.reply(route, ack)


def _serve_trainer(server: RpcServer, pool: SamplePool, max_batch: int) -> None:
    route, msg, error = server.recv()
    try:
        if isinstance(msg, BatchRequest):
            if not 0 < msg.batch_size <= max_batch:
                raise PoolError(f"batch_size must be in 1..{max_batch}")
            server.reply(route, pool.next_batch(msg))
        elif isinstance(msg, Commit):
            pool.commit(msg.batch_id)
            server.reply(route, Ack(id=str(msg.batch_id)))
        elif isinstance(msg, StatsRequest):
            server.reply(route, pool.stats())
        else:
            server.reply(route, ErrorReply(error=error or f"unexpected {type(msg).__name__}"))
    except PoolError as e:
        server.reply(route, ErrorReply(error=str(e)))


def main(cfg: Config) -> int:
    log = setup_logging("pool")
    stop = stop_event()
    try:
        p = cfg.pool
        pool = SamplePool(cfg.run_dir / "pool", p.max_staleness, p.max_pending, p.fsync, p.group_size,
                          p.group_timeout_s, segment_samples=p.segment_samples,
                          seen_window_segments=p.seen_window_segments, archive=Path(p.archive) if p.archive else None)
    except CorruptLog as e:
        log.error("%s", e)
        return 1
    s = pool.stats()
    log.info("pool at %s: %d pending, %d leased batches, cursor at batch %d", pool.dir, s.pending, len(pool.leases),
             s.committed_batch_id)
    samples, batches = RpcServer(cfg.pool_samples_addr), RpcServer(cfg.pool_batches_addr)
    poller = zmq.Poller()
    poller.register(samples.sock, zmq.POLLIN)
    poller.register(batches.sock, zmq.POLLIN)
    metrics = MetricsWriter(cfg.run_dir, "pool")
    mark_ready(cfg, "pool")
    last_report = time.monotonic()
    try:
        while not stop.is_set():
            events = dict(poller.poll(200))
            if samples.sock in events:
                _drain_samples(samples, pool)
            if batches.sock in events:
                _serve_trainer(batches, pool, max_batch=cfg.pool.max_pending)
            if time.monotonic() - last_report > 5:
                s = pool.stats()
                metrics.log({"pending": s.pending, "received": s.received, "dropped_stale": s.dropped_stale,
                             "committed_batch_id": s.committed_batch_id, "disk_bytes": pool.disk_bytes(),
                             "live_segments": len(pool.unreleased)}, step=s.committed_batch_id)
                last_report = time.monotonic()
    finally:
        samples.close()
        batches.close()
        pool.close()
    log.info("pool stopped")
    return 0
