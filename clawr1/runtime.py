"""What every loop process shares: logging, a stop signal, a readiness marker, garbage-collector set-up."""
from __future__ import annotations

import gc
import logging
import os
import signal
import sys
import threading
from pathlib import Path

from clawr1.config import Config


def setup_logging(loop: str) -> logging.Logger:
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, force=True,
                        format=f"%(asctime)s {loop} %(levelname)s %(message)s", datefmt="%H:%M:%S")
    for noisy in ("httpx", "httpx2", "httpcore", "openai", "uvicorn.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    return logging.getLogger(f"clawr1.{loop}")


def freeze_startup_objects() -> None:
    """Move everything loaded so far (model code, tokenizer, libraries) out of the garbage collector's sight.

    None of it is garbage, and scanning it in every full collection costs a serving process
    milliseconds per collection; objects made while serving are collected as usual."""
    gc.collect()
    gc.freeze()


def stop_event() -> threading.Event:
    """An event set by SIGTERM or SIGINT, for loops that poll it between units of work."""
    event = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: event.set())
    return event


def ready_file(cfg: Config, loop: str) -> Path:
    return cfg.run_dir / "state" / f"{loop}.ready"


def mark_ready(cfg: Config, loop: str) -> None:
    path = ready_file(cfg, loop)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(str(os.getpid()))
