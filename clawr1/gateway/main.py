"""`clawr1 gateway`: serve the OpenAI-compatible gateway."""
from __future__ import annotations

import logging

import uvicorn
from transformers import AutoTokenizer

from clawr1.config import Config
from clawr1.gateway.app import check_exposure, create_app, resolve_api_key
from clawr1.gateway.service import Gateway
from clawr1.runtime import freeze_startup_objects, setup_logging
from clawr1.tinymodel.build import resolve_model_path

log = logging.getLogger("clawr1.gateway")


def main(cfg: Config) -> int:
    setup_logging("gateway")
    key = resolve_api_key(cfg.gateway)
    check_exposure(cfg.gateway, key)
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(cfg.model))
    gateway = Gateway(cfg, tokenizer, judge_addr=cfg.judge_turns_addr)
    log.info("gateway on %s -> engines %s, judge %s, auth %s", cfg.gateway_url, cfg.engine_urls, cfg.judge_turns_addr,
             "on" if key else "off (loopback only)")
    app = create_app(gateway, key)
    freeze_startup_objects()
    uvicorn.run(app, host=cfg.gateway.host, port=cfg.gateway.port, log_level="warning", loop="uvloop", http="httptools",
                timeout_keep_alive=75)  # longer than clients keep idle connections: no reuse-vs-close race
    return 0
