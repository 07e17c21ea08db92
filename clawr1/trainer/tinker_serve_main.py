"""`clawr1 tinker-serve RECIPE [overrides]`: Tinker's API on this machine's engine and Megatron trainer.

Starts the recipe's engine (`clawr1 serve`, LoRA adapters on), builds the trainer side
(`MegatronTinkerBackend`), and serves Tinker's API (`clawr1/tinker_serve/server.py`) until Ctrl-C. Point unchanged
Tinker SDK code at it: `tinker.ServiceClient(base_url="http://HOST:PORT")`. The key clients must send is read
from `tinker.api_key_env` (TINKER_API_KEY) when that is set, and is never logged or written.
"""
from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from clawr1.config import Config, load_config, save_config

from clawr1.ports import assign_free_ports
from clawr1.runtime import setup_logging, start_process, stop_processes, wait_http

log = logging.getLogger("clawr1.tinker")


def prepare(recipe: str, overrides: list[str]) -> Config:
    """The recipe with free ports, saved as RUN_DIR/config.yaml (the engine reads it from there)."""
    cfg = assign_free_ports(load_config(recipe, overrides))
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    save_config(cfg, cfg.run_dir / "config.yaml")
    return cfg


def serve(cfg: Config) -> int:
    """Run the engine and the API until interrupted; the engine is stopped whatever happens."""
    import uvicorn

    from clawr1.tinker_serve.server import create_app
    from clawr1.trainer.tinker_serve_backend import MegatronTinkerBackend

    setup_logging("tinker")
    engine = start_process([sys.executable, "-m", "clawr1.cli", "serve", "--config", str(cfg.run_dir / "config.yaml")],
                           cfg.run_dir / "logs" / "serve.log", {**os.environ, "PYTHONUNBUFFERED": "1"})
    backend = None
    try:
        wait_http(f"{cfg.engine_url}/health", engine, cfg.run.startup_timeout_s)
        backend = MegatronTinkerBackend(cfg, cfg.engine_url)
        api_key = os.environ.get(cfg.tinker.api_key_env) or None
        app = create_app(backend, api_key, session_ttl_s=cfg.tinker.session_ttl_s)
        url = f"http://{cfg.tinker.host}:{cfg.tinker.port}"
        info = backend.info()
        print(f"[tinker-serve] {info.model_name}: Tinker API at {url} (engine {cfg.engine_url}, "
              f"{cfg.lora.slots} training slots, LoRA ranks 1 to {info.lora_rank}, sessions end "
              f"{cfg.tinker.session_ttl_s:g} s after their last heartbeat; "
              f"{'key required' if api_key else 'any key accepted'})", flush=True)
        (cfg.run_dir / "tinker_url").write_text(url)
        # the SDK keeps idle connections up to 90 s; Ctrl-C must not wait out clients' 20 s long polls
        uvicorn.run(app, host=cfg.tinker.host, port=cfg.tinker.port, log_level="warning", timeout_keep_alive=75,
                    timeout_graceful_shutdown=5)
        return 0
    finally:
        if backend is not None:
            backend.close()
        stop_processes([engine], cfg.run.stop_timeout_s)


def main(recipe: str, overrides: list[str]) -> int:
    return serve(prepare(recipe, overrides))


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1], sys.argv[2:]))
