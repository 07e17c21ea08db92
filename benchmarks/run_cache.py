"""Benchmark run directories named by their settings, so a cached run is reused only for the same settings.

A name ends in 8 hex digits of the sha256 of the run's resolved config (the recipe with everything it
includes, the defaults, and the overrides; `run.dir` left out): a sweep with other overrides, or an edited
recipe, gets new directories instead of silently reporting another sweep's runs. Conservative by design: a new
config field, even one left at its default, renames every run, so runs made before it are run again, unless it
is listed in NEUTRAL_DEFAULTS: a field added later whose default makes a run do exactly what it did before the
field existed is left out of the hash while it holds that default (each entry is a reviewed claim, not a rule).
A renamed field (RENAMED_FIELDS) is hashed under its old name.
"""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from clawr1.config import load_config  # noqa: E402


# the field's path in the config -> the default that reproduces the behaviour from before the field was added
# serve.device: the embedded engine ran on the CPU only before the field existed
# serve.sglang.device: auto is the GPU launch where there is a GPU, as before; without one SGLang could not run
# tinker.session_ttl_s, lora.max_rank: only `clawr1 tinker-serve` reads them, which no benchmark run starts
# gateway.engine_wait_s: only how long a request waits when no engine is up; what is served and trained is the same
# trainer.fused_kernels, serve.decode_attention, serve.decode_cuda_graph: off, the plain ops as before;
# serve.sampler: generator, each request's host generator as before; trainer.share_prefixes: off, flat packs
NEUTRAL_DEFAULTS = {("algo", "balance"): "none", ("serve", "device"): "cpu", ("serve", "sglang", "device"): "auto",
                    ("tinker", "session_ttl_s"): 45.0, ("lora", "max_rank"): 0, ("gateway", "engine_wait_s"): 30.0,
                    ("run", "fork_server"): True, ("trainer", "fused_kernels"): [],
                    ("serve", "decode_attention"): "gather", ("serve", "decode_cuda_graph"): False,
                    ("serve", "sampler"): "generator", ("trainer", "share_prefixes"): False}
# a field renamed since -> its name when earlier runs were made: hashed under that name, so those runs keep theirs
RENAMED_FIELDS = {("algo", "step_max_staleness"): ("algo", "max_staleness")}


def settings_hash(recipe: Path, overrides: list[str]) -> str:
    cfg = load_config(recipe, list(overrides)).model_dump(mode="json")
    cfg["run"].pop("dir", None)
    for (section, field), (old_section, old_field) in RENAMED_FIELDS.items():
        cfg[old_section][old_field] = cfg[section].pop(field)
    for (*sections, field), neutral in NEUTRAL_DEFAULTS.items():
        where = cfg
        for section in sections:
            where = where[section]
        if where.get(field) == neutral:
            del where[field]
    return hashlib.sha256(json.dumps(cfg, sort_keys=True).encode()).hexdigest()[:8]


def run_path(parent: Path, name: str, recipe: Path, overrides: list[str]) -> Path:
    """parent/<name>-<settings hash>."""
    return parent / f"{name}-{settings_hash(recipe, overrides)}"
