"""What both trainers (Megatron's, clawr1/trainer/main.py, and Tinker's, clawr1/trainer/tinker_client_trainer.py) ask
of the pool: the next batch, and the commit once a checkpoint holds it; and the progress line they print."""
from __future__ import annotations

import logging
import time
from typing import Optional

from clawr1 import bus
from clawr1.protocol import Batch, BatchRequest, Commit, NoBatch

log = logging.getLogger("clawr1.trainer")


class NoDataError(RuntimeError):
    """The pool produced no batch for longer than trainer.batch_wait_timeout_s."""


MAX_POLL_S = 1.0  # an idle trainer asks the pool at most this often


def wait_for_batch(pool: bus.RpcClient, version: int, last_batch_id: int, batch_size: int,
                   timeout_s: Optional[float], stop) -> Optional[Batch]:
    """The next batch, or None once `stop` is set; NoDataError after `timeout_s` without one (None: wait forever)."""
    start = reported = time.monotonic()
    poll_s = 0.05
    # a pool that died holding the request: ask its successor (asking is idempotent)
    asking = bus.Retry(note="asking the pool again", stop=stop.is_set)
    while not stop.is_set():
        reply = None
        for attempt in asking.attempts():
            with attempt:
                reply = pool.call(BatchRequest(trainer_version=version, last_batch_id=last_batch_id,
                                               batch_size=batch_size))
        if reply is None:
            return None  # told to stop before the pool answered
        if isinstance(reply, Batch):
            return reply
        assert isinstance(reply, NoBatch)
        waited = time.monotonic() - start
        if timeout_s is not None and waited > timeout_s:
            raise NoDataError(f"no batch from the pool in {timeout_s:.0f}s ({reply.reason}); is rollout producing samples?")
        if time.monotonic() - reported > (30 if timeout_s is not None else 300):
            log.info("waiting for samples: %s", reply.reason)
            reported = time.monotonic()
        stop.wait(poll_s)
        poll_s = min(poll_s * 2, MAX_POLL_S)
    return None


def commit_batch(pool: bus.RpcClient, batch_id: int, tries: int = 5) -> None:
    """Commit a batch to the pool; committing is idempotent, so a pool that died holding the request is asked again."""
    for attempt in bus.Retry(tries, note=f"committing batch {batch_id} again").attempts():
        with attempt:
            pool.call(Commit(batch_id=batch_id))


def progress_line(step: int, max_steps: int, version: int, stats: dict) -> str:
    return (f"step {step}{f'/{max_steps}' if max_steps else ''} | version {version} | samples {stats['samples']} | "
            f"reward {stats['reward_mean']:+.3f} | hint rate {stats['hint_rate']:.2f} | "
            f"loss {stats['pg_loss']:+.4f} | {stats['tokens_per_s']:.0f} tok/s")
