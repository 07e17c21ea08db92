import pytest
from transformers import AutoTokenizer

from clawr1 import bus
from clawr1.gateway.chat_template import ChatRenderer
from tests.conftest import LoopProcess, make_config


@pytest.fixture(scope="module")
def stack(tiny_model, tmp_path_factory):
    """An engine and a gateway as real processes; the test holds the judge's end of the socket."""
    cfg = make_config(tmp_path_factory.mktemp("gateway"))
    judge = bus.pull_socket(cfg.judge_turns_addr)
    engine = LoopProcess(cfg, "serve")
    gateway = LoopProcess(cfg, "gateway")
    engine.wait_http(f"{cfg.engine_url}/health")
    gateway.wait_http(f"{cfg.gateway_url}/health")
    yield cfg, judge, ChatRenderer(AutoTokenizer.from_pretrained(tiny_model))
    gateway.stop()
    engine.stop()
    judge.close(0)
