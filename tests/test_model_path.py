"""A model directory is checked before anything starts; a check that fails names everything missing."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from clawr1.config import ModelConfig
from clawr1.model_dir import ModelDirError, check_model_dir
from clawr1.model_path import load_tokenizer, resolve_model_path
from tests.conftest import REPO


@pytest.fixture
def model_dir(tiny_model, tmp_path):
    out = tmp_path / "model"
    shutil.copytree(tiny_model, out)
    return out


def remove_template(model_dir) -> str:
    """Take the chat template out of the directory (a file, or a key of tokenizer_config.json); returns it."""
    if (model_dir / "chat_template.jinja").exists():
        template = (model_dir / "chat_template.jinja").read_text()
        (model_dir / "chat_template.jinja").unlink()
        return template
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    template = config.pop("chat_template")
    (model_dir / "tokenizer_config.json").write_text(json.dumps(config))
    return template


def test_the_tiny_model_passes_and_a_missing_part_is_named(model_dir):
    assert check_model_dir(model_dir)["model_type"] == "qwen2"
    (model_dir / "model.safetensors").unlink()
    remove_template(model_dir)
    with pytest.raises(ModelDirError) as e:
        check_model_dir(model_dir)
    assert "no *.safetensors weights" in str(e.value) and "no chat template" in str(e.value)


def test_an_unsupported_architecture_and_a_short_vocabulary_are_refused(model_dir):
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**config, "model_type": "gpt2", "vocab_size": 10}))
    with pytest.raises(ModelDirError) as e:
        check_model_dir(model_dir)
    assert "model_type 'gpt2'" in str(e.value) and "vocab_size is 10" in str(e.value)


def test_a_template_file_stands_in_for_a_missing_one(model_dir, tmp_path):
    template = remove_template(model_dir)
    (tmp_path / "t.jinja").write_text(template)
    cfg = ModelConfig(path=str(model_dir), chat_template=str(tmp_path / "t.jinja"))
    assert resolve_model_path(cfg) == model_dir
    assert load_tokenizer(cfg, model_dir).chat_template == template
    with pytest.raises(ModelDirError, match="is not a file"):
        check_model_dir(model_dir, str(tmp_path / "missing.jinja"))


def test_clawr1_run_refuses_a_bad_directory_before_starting_anything(tmp_path):
    (tmp_path / "model").mkdir()
    done = subprocess.run([sys.executable, "-m", "clawr1.cli", "run", "recipes/live/cpu.yaml",
                           f"model.path={tmp_path / 'model'}", f"run.dir={tmp_path / 'run'}"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "config.json is missing" in done.stderr and "tokenizer.json is missing" in done.stderr
    assert not (tmp_path / "run" / "logs").exists()
