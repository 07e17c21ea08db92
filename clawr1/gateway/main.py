"""`clawr1 gateway`: serve the OpenAI-compatible gateway."""
from __future__ import annotations

import logging

import uvicorn
from transformers import AutoTokenizer

from clawr1.config import Config
from clawr1.gateway.app import Gateway, create_app
from clawr1.runtime import setup_logging
from clawr1.tinymodel.build import resolve_model_path

log = logging.getLogger("clawr1.gateway")


def main(cfg: Config) -> int:
    setup_logging("gateway")
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(cfg.model))
    gateway = Gateway(cfg, tokenizer, judge_addr=cfg.judge_turns_addr)
    log.info("gateway on %s -> engines %s, judge %s", cfg.gateway_url, cfg.engine_urls, cfg.judge_turns_addr)
    uvicorn.run(create_app(gateway), host=cfg.gateway.host, port=cfg.gateway.port, log_level="warning")
    return 0
