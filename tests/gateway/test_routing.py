"""Several engines: session affinity, failover when one dies, rolling weight updates from `clawr1 run`; the
gateway ready only when a request will be served."""
from __future__ import annotations

import asyncio
import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from clawr1.ports import free_port
from clawr1.gateway.router import EngineRouter, NoEngineError
from tests.conftest import engine_metric, make_config

ASK = {"model": "m", "messages": [{"role": "user", "content": "Add 2 g and 3 g."}], "max_tokens": 4}


def gateway_health(url: str) -> httpx.Response | None:
    try:
        return httpx.get(f"{url}/health", timeout=2)
    except httpx.HTTPError:
        return None


def test_the_gateway_is_ready_only_when_a_request_will_be_served(tiny_model, tmp_path, loops):
    """The engine starts last. Until it is up the gateway's /health answers 503 and a request waits for it
    (gateway.engine_wait_s); the first request sent the moment /health says 200 is served."""
    cfg = make_config(tmp_path, "gateway.engine_wait_s=600")
    gateway = loops(cfg, "gateway")
    deadline = time.monotonic() + 120
    while (answer := gateway_health(cfg.gateway_url)) is None:
        assert gateway.proc.poll() is None and time.monotonic() < deadline, "the gateway never answered"
        time.sleep(0.1)
    assert answer.status_code == 503 and answer.json() == {"status": "waiting for an engine", "engines_healthy": 0}
    client = openai.OpenAI(base_url=f"{cfg.gateway_url}/v1", api_key="unused", max_retries=0, timeout=600)
    with ThreadPoolExecutor(1) as pool:
        early = pool.submit(client.chat.completions.create, **ASK)  # sent while no engine exists
        engine = loops(cfg, "serve")
        while (answer := gateway_health(cfg.gateway_url)) is None or answer.status_code != 200:
            assert engine.proc.poll() is None and time.monotonic() < deadline + 480, "the gateway never got ready"
            time.sleep(0.02)
        first = client.chat.completions.create(**ASK)  # at the first moment the gateway says it is ready
        assert first.choices[0].message.content is not None and first.usage.completion_tokens > 0
        assert early.result(timeout=600).usage.completion_tokens > 0
    assert answer.json() == {"status": "ok", "engines_healthy": 1}


def test_with_no_engine_a_request_is_refused_after_the_wait_naming_it():
    async def go() -> str:
        router = EngineRouter([f"http://127.0.0.1:{free_port()}"], engine_wait_s=0.3)
        try:
            assert not router.ready
            with pytest.raises(NoEngineError) as refused:
                await router.call("s", lambda engine: engine.generate([1, 2], {"max_new_tokens": 1}))
            return str(refused.value)
        finally:
            await router.close()

    message = asyncio.run(go())
    assert "within 0.3 s (gateway.engine_wait_s)" in message and "EngineUnreachable" in message


def test_sessions_stick_to_an_engine_and_fail_over_when_it_dies(tiny_model, tmp_path, loops):
    cfg = make_config(tmp_path, "serve.num_engines=2")
    assert len(cfg.engine_urls) == 2
    engines = []
    for port in (cfg.serve.port, *cfg.serve.extra_ports):
        p = loops(cfg, "serve", extra=(f"serve.port={port}",), name=f"serve-{port}")
        p.wait_http(f"http://127.0.0.1:{port}/health")
        engines.append(p)
    gateway = loops(cfg, "gateway")
    gateway.wait_http(f"{cfg.gateway_url}/health")
    c = openai.OpenAI(base_url=f"{cfg.gateway_url}/v1", api_key="unused", max_retries=0)

    for i in range(6):  # one session's turns all go to the same engine
        c.chat.completions.create(model="m", messages=[{"role": "user", "content": f"Add {i} g and 1 g."}],
                                  max_tokens=4, extra_headers={"X-Session-Id": "sticky", "X-Turn-Type": "side" if i else "main"})
    counts = [engine_metric(u, "requests_total") for u in cfg.engine_urls]
    assert sorted(counts) == [0, 6]
    survivor = counts.index(0)
    engines[1 - survivor].stop()  # the session's engine dies
    r = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "Add 1 g and 1 g."}], max_tokens=4,
                                  extra_headers={"X-Session-Id": "sticky"})
    assert r.choices[0].message.content is not None
    assert engine_metric(cfg.engine_urls[survivor], "requests_total") == 1


def test_clawr1_run_with_two_engines_updates_both(tiny_model, tmp_path):
    import subprocess
    import sys

    from tests.conftest import REPO

    run_dir = tmp_path / "run"
    out = subprocess.run([sys.executable, "-m", "clawr1.cli", "run", "recipes/combined/cpu.yaml", f"run.dir={run_dir}",
                          "run.max_steps=2", "serve.num_engines=2", "judge.teacher=policy"],
                         cwd=REPO, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:]
    final = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()
             if '"final_engine_versions"' in line][-1]
    assert final["final_engine_versions"] == [2, 2]
    assert sorted(p.name for p in (run_dir / "logs").iterdir() if p.name.startswith("serve")) == ["serve-1.log", "serve.log"]
