"""`clawr1 gateway`: serve the OpenAI-compatible gateway."""
from __future__ import annotations

import logging

import uvicorn

from clawr1.config import Config
from clawr1.gateway.app import check_exposure, create_app
from clawr1.chat import template_breaking_shapes
from clawr1.gateway.service import Gateway
from clawr1.runtime import freeze_startup_objects, resolve_api_key, setup_logging
from clawr1.model_path import engine_context, load_chat_tokenizer, read_model_facts, resolve_model_path

log = logging.getLogger("clawr1.gateway")


def main(cfg: Config) -> int:
    setup_logging("gateway")
    key = resolve_api_key(cfg.gateway)
    check_exposure(cfg.gateway, key)
    model_path = resolve_model_path(cfg.model, weights=cfg.serve.backend != "tinker")
    tokenizer = load_chat_tokenizer(cfg.model, model_path)
    model = read_model_facts(model_path)
    gateway = Gateway(cfg, tokenizer, judge_addr=cfg.judge_turns_addr, model_type=model.model_type,
                      end_ids=model.end_ids)
    model_max = model.max_position_embeddings
    gateway.limits.max_context = (cfg.serve.sglang.context_length or model_max if cfg.serve.backend == "sglang"
                           else engine_context(model_max, cfg.serve.context_length))
    log.info("chat template: tool calls %s, reasoning %s; not prefix-stable for: %s", gateway.tool_call_format,
             "parsed" if gateway.parses_reasoning else "not parsed",
             ", ".join(template_breaking_shapes(gateway.renderer)) or "nothing probed")
    log.info("gateway on %s -> engines %s, judge %s, auth %s", cfg.gateway_url, cfg.engine_urls, cfg.judge_turns_addr,
             "on" if key else "off (loopback only)")
    app = create_app(gateway, key)
    freeze_startup_objects()
    uvicorn.run(app, host=cfg.gateway.host, port=cfg.gateway.port, log_level="warning", loop="uvloop", http="httptools",
                timeout_keep_alive=75)  # longer than clients keep idle connections: no reuse-vs-close race
    return 0
