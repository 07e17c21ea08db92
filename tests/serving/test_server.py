"""The embedded engine's HTTP server (clawr1/serving/server.py), on a small random model served on loopback."""
from __future__ import annotations

import shutil
import threading
import time

import httpx
import pytest
import uvicorn

from clawr1.ports import free_port
from clawr1.engine_api.client import SyncEngineClient
from clawr1.engine_api.nccl import local_nccl_version, reported_nccl_version
from clawr1.serving.engine import Engine
from clawr1.serving.server import create_app
from clawr1.tokenizer_packages import tokenizer_dir
from tests.trainer.families import save_random_model


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """URL of create_app(Engine(a random Qwen2 with Qwen3's tokenizer)) in this process."""
    model = save_random_model("qwen2-tied", tmp_path_factory.mktemp("model"))
    for f in tokenizer_dir("qwen3").iterdir():
        shutil.copy(f, model / f.name)
    engine = Engine(model)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(engine), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)
    engine.stop()


def test_model_info_reports_torchs_nccl_version(served):
    info = httpx.get(f"{served}/model_info", timeout=10).json()
    assert "nccl_version" in info and info["nccl_version"] == local_nccl_version()  # null on a CPU build of torch
    client = SyncEngineClient(served)
    try:
        assert reported_nccl_version(client.model_info()) == local_nccl_version()
    finally:
        client.close()
    assert httpx.get(f"{served}/get_model_info", timeout=10).json()["nccl_version"] == info["nccl_version"]
