"""An API key guards the gateway; binding beyond loopback without one is refused."""
from __future__ import annotations

import subprocess
import sys

import httpx
import openai
import pytest

from tests.conftest import REPO, LoopProcess, make_config


def test_non_loopback_without_a_key_refuses_to_start(tiny_model, tmp_path):
    cfg = make_config(tmp_path, "gateway.host=0.0.0.0")
    from clawr1.config import save_config

    save_config(cfg, tmp_path / "c.yaml")
    env = {k: v for k, v in __import__("os").environ.items() if k != cfg.gateway.api_key_env}
    out = subprocess.run([sys.executable, "-m", "clawr1.cli", "gateway", "--config", str(tmp_path / "c.yaml")],
                         cwd=REPO, capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode != 0 and "API key" in (out.stderr + out.stdout)


def test_key_from_a_file_is_required(tiny_model, tmp_path, loops):
    (tmp_path / "key").write_text("s3cret-key-for-tests\n")
    cfg = make_config(tmp_path, f"gateway.api_key_file={tmp_path / 'key'}")
    engine, gateway = loops(cfg, "serve"), loops(cfg, "gateway")
    engine.wait_http(f"{cfg.engine_url}/health")
    gateway.wait_http(f"{cfg.gateway_url}/health")  # health stays open for probes
    assert httpx.get(f"{cfg.gateway_url}/v1/models").status_code == 401
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{cfg.gateway_url}/v1", api_key="wrong").models.list()
    ok = openai.OpenAI(base_url=f"{cfg.gateway_url}/v1", api_key="s3cret-key-for-tests")
    assert ok.models.list().data[0].id == cfg.gateway.model_name
