"""Fuzzing the gateway's request schema (from its own OpenAPI document): no input gets a 5xx.

Schemathesis generates the requests (valid and invalid bodies, headers, paths) from the
OpenAPI document; Hypothesis drives it. Its pytest plugin does not run under pytest 9,
so each operation's strategy is driven directly.
"""
from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings

from tests.conftest import LoopProcess, make_config


@pytest.fixture(scope="module")
def gateway_schema(tiny_model, tmp_path_factory):
    cfg = make_config(tmp_path_factory.mktemp("fuzz"), "gateway.max_completion_tokens=8",
                      "gateway.default_max_tokens=8")
    engine, gateway = LoopProcess(cfg, "serve"), LoopProcess(cfg, "gateway")
    engine.wait_http(f"{cfg.engine_url}/health")
    gateway.wait_http(f"{cfg.gateway_url}/health")
    yield schemathesis.openapi.from_url(f"{cfg.gateway_url}/openapi.json")
    gateway.stop()
    engine.stop()


OPERATIONS = ["POST /v1/chat/completions", "POST /s/{session_id}/v1/chat/completions", "POST /v1/feedback", "POST /v1/score",
              "POST /v1/sessions/{session_id}/complete", "POST /v1/ingest", "GET /v1/status", "GET /v1/models",
              "GET /metrics", "GET /playground"]


@pytest.mark.parametrize("operation", OPERATIONS)
def test_no_input_gets_a_server_error(gateway_schema, operation):
    method, path = operation.split(" ")
    op = gateway_schema[path][method]
    seen = []

    @given(case=op.as_strategy())
    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None,
              phases=[Phase.explicit, Phase.generate])  # no shrinking: every request costs a real round trip
    def check(case):
        response = case.call(timeout=60)
        seen.append(response.status_code)
        assert response.status_code < 500, (case.body, case.path_parameters, response.status_code, response.text[:400])

    check()
    assert seen  # the strategy produced requests
