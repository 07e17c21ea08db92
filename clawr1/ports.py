"""Free ports for a run's loops, promised across the machine so two runs starting at once never share one.

A port is checked free and then bound seconds later by the loop it was given to (after its imports); the
promises (files in PORT_PROMISES) keep another clawr1 process from being given it in between."""
from __future__ import annotations

import os
import random
import socket
import tempfile
import time
import typing
from pathlib import Path

from clawr1.config import Config


def ephemeral_port_range() -> tuple[int, int]:
    """The ports the kernel hands to outgoing connections (Linux's ip_local_port_range; its default elsewhere)."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


PORT_PROMISE_S = 120.0  # how long a port given out stays promised to its taker, which binds it within seconds
PORT_PROMISES = Path(tempfile.gettempdir()) / "clawr1-promised-ports"  # shared by every clawr1 process on the machine


def promise_port(port: int, registry: Path | None = None) -> bool:
    """Promise `port` to this caller unless another process was promised it in the last PORT_PROMISE_S seconds.

    A port is checked free, then bound seconds later by the loop it was given to (after its imports): two runs
    starting on one machine could be given the same port in between. The promises are files in `registry`
    (PORT_PROMISES)."""
    path = (registry or PORT_PROMISES) / str(port)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError:  # no registry here (a read-only directory, a file in its place): the port, unpromised, as before
        return True
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        try:
            if time.time() - path.stat().st_mtime < PORT_PROMISE_S:
                return False
            os.utime(path)  # an old promise: the port was bound and freed since, or never taken
            return True
        except OSError:  # gone meanwhile (another took it), or another user's we may not renew: leave it to them
            return False
    except OSError:  # another user's directory: the port, unpromised, as before
        return True


def free_port(host: str = "127.0.0.1", avoid: typing.Collection[int] = ()) -> int:
    """A port free to listen on, below the ephemeral range where it can be: a port the kernel would give out
    (bind to 0) may be taken by any process's outgoing connection before the loop that was promised it binds it,
    which failed runs with "address already in use". `avoid`: ports promised already (not yet bound); ports
    promised to other processes in the last minutes are skipped too (`promise_port`)."""
    low, _ = ephemeral_port_range()
    candidates = random.Random().sample(range(20000, low), min(64, max(low - 20000, 0)))
    for port in (p for p in candidates if p not in avoid):
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        if promise_port(port):
            return port
    with socket.socket() as s:  # no range below the ephemeral one (or all of it taken): the kernel's choice
        s.bind((host, 0))
        return s.getsockname()[1]


def assign_free_ports(cfg: Config) -> Config:
    """Give every port left at 0 a free one, each a different one, so a whole run can start on a busy machine."""
    promised: set[int] = set()

    def port() -> int:
        chosen = free_port(avoid=promised)
        promised.add(chosen)
        return chosen

    for section, name in [
        (cfg.serve, "port"), (cfg.gateway, "port"), (cfg.gateway, "acks_port"), (cfg.pool, "samples_port"),
        (cfg.pool, "batches_port"), (cfg.trainer, "publish_port"), (cfg.judge, "port"), (cfg.tinker, "port"),
    ]:
        if getattr(section, name) == 0:
            setattr(section, name, port())
    while len(cfg.serve.extra_ports) < cfg.serve.num_engines - 1:
        cfg.serve.extra_ports.append(port())
    if cfg.judge.runs_own_teacher and not cfg.judge.teacher_port:
        cfg.judge.teacher_port = port()
    if cfg.judge.runs_own_prm and not cfg.judge.prm_port:
        cfg.judge.prm_port = port()
    return cfg
