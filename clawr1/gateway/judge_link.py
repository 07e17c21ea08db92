"""The gateway's link to the judge. Every turn whose next state is known goes to the judge as a `TurnRecord`
over ZeroMQ, through a bounded queue (gateway.judge_queue_size).

Without the outbox a turn that finds the queue full is dropped and counted, never silently. With it
(gateway.outbox) nothing served is lost: each main turn is logged when served and again with its next state, the
judge acknowledges it (`TurnAck` on gateway.acks_port), and what stays unacknowledged is sent again: after
gateway.outbox_resend_s, when a (re)started judge says hello, and when the gateway itself restarts."""
from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Optional

from clawr1 import bus, protocol
from clawr1.config import GatewayConfig
from clawr1.gateway.metrics import Metrics
from clawr1.gateway.outbox import SYNC_EVERY_S as OUTBOX_SYNC_EVERY_S, Outbox
from clawr1.protocol import JudgeHello, TurnAck, TurnRecord

log = logging.getLogger("clawr1.gateway")


class JudgeLink:
    def __init__(self, cfg: GatewayConfig, run_dir: Path, judge_addr: Optional[str], metrics: Metrics):
        """judge_addr: the judge's turns socket (None: no judge, turns stay queued)."""
        self.cfg = cfg
        self.judge_addr = judge_addr
        self.metrics = metrics
        self.queue: asyncio.Queue[TurnRecord] = asyncio.Queue(maxsize=cfg.judge_queue_size)
        self.outbox: Optional[Outbox] = Outbox(run_dir / "gateway" / "outbox.log",
                                               cfg.outbox_rewrite_after) if cfg.outbox else None
        self.acks_bind = f"tcp://{cfg.host}:{cfg.acks_port}" if self.outbox and judge_addr else ""

    def start(self, live: set[str]) -> list[asyncio.Task]:
        """Queue what the outbox holds unacknowledged, then run the link's tasks (returned: the caller cancels
        them). live: the keys of turns still pending in a session; any other unacknowledged turn lost its session
        with an earlier gateway."""
        tasks = []
        if self.outbox is not None:
            self._recover(live)
            tasks.append(asyncio.create_task(self._sync_outbox()))
        if self.judge_addr:
            tasks.append(asyncio.create_task(self._send_to_judge()))
            if self.acks_bind:
                tasks.append(asyncio.create_task(self._receive_acks()))
                tasks.append(asyncio.create_task(self._resend_unacknowledged()))
        return tasks

    async def drain(self, wait_s: float) -> None:
        """Wait up to wait_s for the queued turns to leave (a stopping gateway hands them over)."""
        deadline = time.monotonic() + wait_s
        while not self.queue.empty() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    def close(self) -> None:
        if self.outbox is not None:
            self.outbox.close()

    def counts(self) -> dict[str, float]:
        return {"judge_queue_depth": self.queue.qsize(), **(self.outbox.counts() if self.outbox is not None else {})}

    # ------------------------------------------------------------ turns in
    def served(self, record: TurnRecord) -> None:
        """A main turn was just served: with the outbox it is durable from now on."""
        if self.outbox is not None:
            self.outbox.served_turn(record)

    def send(self, record: TurnRecord) -> None:
        """A turn with its next state to the judge, exactly once."""
        if self.outbox is not None:
            self.outbox.next_state(record)
        if not self._queue(record) and self.outbox is None:
            self.metrics.inc("turns_dropped", help="TurnRecords dropped because the judge queue was full")
            log.warning("judge queue full (%d): dropped turn %s/%d", self.queue.qsize(), record.session_id,
                        record.turn_index)

    async def put(self, record: TurnRecord, wait_s: float) -> bool:
        """A logged (ingested) turn to the judge, waiting up to wait_s for room in the queue; False when it stayed
        full (with the outbox, the turn is sent later)."""
        if self.outbox is not None:
            self.outbox.next_state(record)  # logs the turn and its next state
        try:
            await asyncio.wait_for(self.queue.put(record), wait_s)
        except asyncio.TimeoutError:
            return False
        if self.outbox is not None:
            self.outbox.mark_sent(record)
        return True

    # ------------------------------------------------------------ the outbox (exactly once, served to trained)
    def _recover(self, live: set[str]) -> None:
        orphans = self.outbox.orphans(live)
        due = self.outbox.due(0.0)
        for record in due:
            self._queue(record)
        if due:
            log.info("outbox: %d unacknowledged turns sent to the judge again (%d of them orphaned by a stopped "
                     "gateway)", len(due), len(orphans))

    def _queue(self, record: TurnRecord) -> bool:
        """Put a turn on the judge queue; False when it is full (with the outbox, it is sent again later)."""
        try:
            self.queue.put_nowait(record)
        except asyncio.QueueFull:
            return False
        if self.outbox is not None:
            self.outbox.mark_sent(record)
        return True

    async def _receive_acks(self) -> None:
        sock = bus.pull_socket(self.acks_bind, asyncio=True)
        try:
            while True:
                try:
                    msg = protocol.decode(await sock.recv_multipart())
                except protocol.SchemaMismatch as e:
                    log.error("ignored a message on the acknowledgement socket: %s", e)
                    continue
                if isinstance(msg, TurnAck):
                    self.outbox.ack(msg)
                elif isinstance(msg, JudgeHello):  # a (re)started judge: whatever the old one held is lost
                    for record in self.outbox.due(0.0):
                        self._resend(record)
        finally:
            sock.close(0)

    async def _resend_unacknowledged(self) -> None:
        while True:
            await asyncio.sleep(min(5.0, self.cfg.outbox_resend_s / 4))
            for record in self.outbox.due(self.cfg.outbox_resend_s):
                if not self._resend(record):
                    break

    def _resend(self, record: TurnRecord) -> bool:
        queued = self._queue(record)
        if queued:
            self.metrics.inc("turns_resent", help="unacknowledged TurnRecords sent to the judge again")
        return queued

    async def _sync_outbox(self) -> None:
        while True:
            await asyncio.sleep(OUTBOX_SYNC_EVERY_S)
            self.outbox.sync()

    async def _send_to_judge(self) -> None:
        sock = bus.push_socket(self.judge_addr, asyncio=True)
        try:
            while True:
                record = await self.queue.get()
                try:
                    frames = protocol.encode(record)
                except (UnicodeEncodeError, OverflowError):  # a client's JSON msgpack cannot hold (no outbox caught it)
                    protocol.make_encodable(record)
                    frames = protocol.encode(record)
                await sock.send_multipart(frames)
                self.metrics.inc("turns_sent", help="TurnRecords delivered to the judge")
        finally:
            sock.close(linger=2000)
