"""The tiny family models' cache: built once, found again, rebuilt when what it is taught changes."""
from __future__ import annotations

import json

from clawr1.tinymodel.family import ensure_family_model

SMALL = {"layers": 1, "hidden": 16, "steps": 1}


def test_a_family_model_is_built_once_and_found_in_the_cache(tmp_path):
    first = ensure_family_model("llama3_1", tmp_path, **SMALL)
    built_at = (first / "clawr1_family_build.json").stat().st_mtime_ns
    assert json.loads((first / "clawr1_family_build.json").read_text())["steps"] == 1
    assert ensure_family_model("llama3_1", tmp_path, **SMALL) == first
    assert (first / "clawr1_family_build.json").stat().st_mtime_ns == built_at  # found, not rebuilt
    other = ensure_family_model("llama3_1", tmp_path, **{**SMALL, "steps": 2})  # other settings: another model
    assert other != first and json.loads((other / "clawr1_family_build.json").read_text())["steps"] == 2
    assert not list(tmp_path.glob("*.partial"))
