import pytest
from transformers import AutoTokenizer

from clawr1 import bus
from clawr1.chat import ChatRenderer
from clawr1.devtools import stop_all
from tests.conftest import LoopProcess, make_config


@pytest.fixture(scope="module")
def stack(tiny_model, tmp_path_factory):
    """An engine and a gateway as real processes; the test holds the judge's end of the socket."""
    cfg = make_config(tmp_path_factory.mktemp("gateway"))
    judge = bus.pull_socket(cfg.judge_turns_addr)
    processes = [LoopProcess(cfg, "serve"), LoopProcess(cfg, "gateway")]
    try:
        processes[0].wait_http(f"{cfg.engine_url}/health")
        processes[1].wait_http(f"{cfg.gateway_url}/health")
        yield cfg, judge, ChatRenderer(AutoTokenizer.from_pretrained(tiny_model))
    finally:
        stop_all(processes)
        judge.close(0)
