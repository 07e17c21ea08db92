"""`clawr1 serve`'s choices before the engine starts."""
from __future__ import annotations

import logging

from clawr1.config import load_config
from clawr1.serving.main import engine_dtype


def test_a_bf16_engine_on_a_cpu_without_bf16_serves_fp32_and_says_why(tmp_path, caplog):
    cfg = load_config(None, [f"run.dir={tmp_path}", "serve.dtype=bfloat16", "run.cpu_bf16=off"])
    with caplog.at_level(logging.WARNING):
        assert engine_dtype(cfg) == "float32"
    assert "bf16 falls back to fp32" in caplog.text
    assert engine_dtype(load_config(None, [f"run.dir={tmp_path}", "serve.dtype=bfloat16", "run.cpu_bf16=on"])) == "bfloat16"
    assert engine_dtype(load_config(None, [f"run.dir={tmp_path}"])) == "float32"
