"""Free ports for a run's loops: distinct, listenable, below the ephemeral range, promised across processes."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

from clawr1.config import load_config
from tests.conftest import REPO


def test_free_ports_are_distinct_listenable_and_below_the_ephemeral_range():
    """A port the kernel would hand out (bind to 0) can go to any process's outgoing connection before the loop
    it was promised to binds it ("address already in use"): ports come from below that range."""
    from clawr1.ports import assign_free_ports, ephemeral_port_range, free_port

    low, _ = ephemeral_port_range()
    cfg = assign_free_ports(load_config(None, ["serve.num_engines=3", "judge.teacher=frozen"]))
    ports = [cfg.serve.port, cfg.gateway.port, cfg.gateway.acks_port, cfg.pool.samples_port, cfg.pool.batches_port,
             cfg.trainer.publish_port, cfg.judge.port, *cfg.serve.extra_ports, cfg.judge.teacher_port]
    assert len(set(ports)) == len(ports) == 10 and all(0 < p < low for p in ports)
    for p in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))
    held = socket.socket()
    held.bind(("127.0.0.1", free_port()))
    try:
        assert free_port(avoid=[1]) != held.getsockname()[1]  # a port in use is skipped
    finally:
        held.close()


def test_a_port_promised_to_another_process_is_not_given_out_again(tmp_path, monkeypatch):
    """Two runs starting at once each check a port free before their loops bind it: a port given to one (here by
    another process) is skipped by the other for PORT_PROMISE_S, and taken again after."""
    import clawr1.ports as ports

    monkeypatch.setattr(ports, "PORT_PROMISES", tmp_path)
    with socket.socket() as a, socket.socket() as b:
        a.bind(("127.0.0.1", 0))
        b.bind(("127.0.0.1", 0))
        first, second = a.getsockname()[1], b.getsockname()[1]
    promised = subprocess.run([sys.executable, "-c", "import sys; from pathlib import Path; from clawr1.ports import "
                               f"promise_port; sys.exit(0 if promise_port({first}, Path(sys.argv[1])) else 1)",
                               str(tmp_path)], cwd=REPO)
    assert promised.returncode == 0

    class Candidates:  # free_port's random sample, in a known order
        def sample(self, population, k):
            return [first, second]

    monkeypatch.setattr(ports.random, "Random", Candidates)
    assert ports.free_port() == second  # the other process's promise is kept
    assert not ports.promise_port(second)  # and now this one's
    old = time.time() - ports.PORT_PROMISE_S - 1
    os.utime(tmp_path / str(first), (old, old))
    assert ports.free_port() == first  # an old promise is given out again
    not_a_directory = tmp_path / "file"
    not_a_directory.write_text("")
    monkeypatch.setattr(ports, "PORT_PROMISES", not_a_directory)
    assert ports.free_port() == first  # no registry to be had: a free port all the same, unpromised
