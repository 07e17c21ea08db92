"""Several engines: session affinity, failover when one dies, rolling weight updates from `clawr1 run`."""
from __future__ import annotations

import json

import openai

from tests.conftest import engine_metric, make_config


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
