"""Publishing: the state rank 0 gathers, and the lagged teacher.

gather_hf_state on real trainer ranks (gloo): rank 0 gets the whole HF state, and only the weights that
reach it are copied to the host. WeightPublisher with judge.teacher=lagged: two real engine processes
(the policy's and the lagged teacher's) on loopback; the trainer's publisher pushes versions 1..7 through
the disk sink, each with different weights, and the teacher gets them every teacher_lag versions.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from clawr1.ports import free_port
from clawr1.engine_api.client import SyncEngineClient
from tests.conftest import REPO, make_config
from tests.serving.test_engine_api import prompt_ids
from tests.trainer.families import save_random_model


def weights_of_version(base: dict, version: int) -> dict:
    """The base weights with the final norm scaled by a version-dependent factor: every version scores differently."""
    state = dict(base)
    state["model.norm.weight"] = base["model.norm.weight"] * (1.0 + 0.25 * version)
    return state


def prompt_logprobs(engine: SyncEngineClient, ids: list[int]) -> list[float]:
    return engine.generate(ids, {"max_new_tokens": 0, "temperature": 0.0}, logprob_start_len=0).prompt_logprobs


def test_lagged_teacher_is_refreshed_every_teacher_lag_versions_only(tiny_model, tmp_path, loops):
    from transformers import AutoTokenizer

    from clawr1.trainer.hf_io import load_hf_state
    from clawr1.trainer.publish import WeightPublisher

    cfg = make_config(tmp_path, "judge.teacher=lagged", "judge.teacher_lag=3")
    assert cfg.judge.teacher_port and cfg.teacher_engine_url != cfg.engine_url
    loops(cfg, "serve").wait_http(f"{cfg.engine_url}/health")
    loops(cfg, "serve", extra=(f"serve.port={cfg.judge.teacher_port}",), name="teacher").wait_http(
        f"{cfg.teacher_engine_url}/health")
    policy, teacher = SyncEngineClient(cfg.engine_url), SyncEngineClient(cfg.teacher_engine_url)
    ids = prompt_ids(AutoTokenizer.from_pretrained(tiny_model))
    base = load_hf_state(tiny_model)
    publisher = WeightPublisher(cfg, tiny_model)
    try:
        scored: dict[int, list[float]] = {0: prompt_logprobs(teacher, ids)}
        for version in range(1, 8):
            publisher.publish(weights_of_version(base, version), version, step=version)
            scored[version] = prompt_logprobs(policy, ids)
            refreshed_at = version - version % 3
            assert policy.weight_version() == version
            assert teacher.weight_version() == refreshed_at, f"after publishing v{version}"
            # the teacher scores with the weights of the last refresh, not the newest ones
            assert prompt_logprobs(teacher, ids) == scored[refreshed_at], f"after publishing v{version}"
            if version != refreshed_at:
                assert scored[version] != scored[refreshed_at]
    finally:
        publisher.close()
        policy.close()
        teacher.close()


def gather_on_ranks(model, tp: int, world: int, out) -> list[dict]:
    """Each of `world` trainer ranks runs gather_hf_state (tests/trainer/publish_worker.py); their reports."""
    port = str(free_port())
    procs = [subprocess.Popen([sys.executable, "-m", "tests.trainer.publish_worker", str(model), str(tp), str(out)],
                              cwd=REPO, env={**os.environ, "RANK": str(r), "WORLD_SIZE": str(world),
                                             "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(world)]
    try:
        for p in procs:
            output, _ = p.communicate(timeout=300)  # a rank missing a collective hangs the others: fails here
            assert p.returncode == 0, output[-3000:]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


@pytest.mark.parametrize("tp", [1, 2])
def test_only_the_weights_that_reach_rank_0_are_copied_to_the_host(tmp_path, tp):
    """Issue 26: data-parallel replicas other than the first copy nothing; under TP the first replica's other
    ranks copy their own shard, which they send to rank 0; rank 0 gets the whole HF state."""
    model = save_random_model("qwen2.5-untied", tmp_path / "model")
    lead, other = gather_on_ranks(model, tp, world=2, out=tmp_path)
    assert lead["gathered"] and lead["same_as_hf"] and lead["host_copies"] == lead["own_tensors"] > 0
    assert not other["gathered"]
    if tp == 1:  # rank 1 is a second data-parallel replica
        assert other["dp_rank"] == 1 and other["host_copies"] == 0
    else:  # rank 1 holds the other half of replica 0's weights
        assert other["tp_rank"] == 1 and other["host_copies"] == other["own_tensors"] > 0


# ================================================================ where the engines reach rank 0 (trainer.weight_sync=nccl)


def test_the_master_address_on_one_machine_is_loopback(tmp_path):
    from clawr1.trainer.publish import master_address

    cfg = make_config(tmp_path)
    assert cfg.trainer.host == "127.0.0.1" and cfg.trainer.master_address == ""
    assert master_address(cfg) == "127.0.0.1"
    cfg.gateway.engine_urls = ["http://localhost:30000", "http://127.0.0.1:30001"]
    assert master_address(cfg) == "127.0.0.1"


def test_a_set_master_address_or_a_routable_trainer_host_is_used_as_is(tmp_path):
    from clawr1.trainer.publish import master_address

    cfg = make_config(tmp_path, "trainer.master_address=10.9.8.7")
    cfg.gateway.engine_urls = ["http://198.51.100.7:30000"]
    assert master_address(cfg) == "10.9.8.7"
    cfg = make_config(tmp_path, "trainer.host=10.0.0.5")  # as `clawr1 run` on Ray sets it: rank 0's node address
    cfg.gateway.engine_urls = ["http://198.51.100.7:30000"]
    assert master_address(cfg) == "10.0.0.5"


def test_with_engines_on_another_machine_the_master_address_is_this_machines_routable_one(tmp_path):
    """The default with engines elsewhere: an address of this machine (not loopback) that serves the rendezvous."""
    import ipaddress
    from datetime import timedelta

    import torch.distributed as dist

    from clawr1.engine_api.weight_push import host_store
    from clawr1.trainer.publish import master_address

    cfg = make_config(tmp_path)
    cfg.gateway.engine_urls = ["http://198.51.100.7:30000"]  # TEST-NET-2: another machine, reached by the default route
    try:
        address = master_address(cfg)
    except ValueError as e:  # a machine with no route beyond itself cannot tell
        assert "set trainer.master_address" in str(e)
        return
    assert not ipaddress.ip_address(address).is_loopback
    store = host_store(address, 0, timeout_s=10)  # what NcclSink serves there, and an engine's client of it
    client = dist.TCPStore(address, store.port, None, False, timedelta(seconds=10))
    client.set("joined", "engine-0")
    assert store.get("joined") == b"engine-0"


def test_pruning_removes_old_versions_and_a_half_written_one_a_killed_trainer_left(tmp_path):
    from clawr1.trainer.publish import DiskSink

    cfg = make_config(tmp_path)
    cfg.trainer.keep_weight_versions = 2
    sink = DiskSink(cfg, [], tmp_path / "base")
    for name in ("v000001", "v000002", "v000003", "v000004.tmp"):  # the trainer was killed while writing v4
        (sink.dir / name).mkdir(parents=True)
    sink._prune(3)  # the resumed trainer republished version 3
    assert sorted(p.name for p in sink.dir.iterdir()) == ["v000002", "v000003"]


def test_an_engine_that_is_down_is_skipped_and_the_others_still_get_the_weights(engine, tiny_model):
    """A live run restarts a dead engine on the newest published weights; the trainer must not die of it."""
    import httpx

    from clawr1.trainer.publish import to_each_engine

    down = SyncEngineClient(f"http://127.0.0.1:{free_port()}")  # nothing listens there
    to_each_engine([down, SyncEngineClient(engine)], lambda e: e.update_weights_from_disk(str(tiny_model), 3))
    assert httpx.get(f"{engine}/get_model_info").json()["weight_version"] == "3"
