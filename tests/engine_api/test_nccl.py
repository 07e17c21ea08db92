"""NCCL versions as torch, NCCL and engines write them, and what the SGLang releases of docs/trainer.md bring."""
from __future__ import annotations

import pytest
import torch.distributed as dist

from clawr1.engine_api.nccl import local_nccl_version, release_nccl, reported_nccl_version, version_string


@pytest.mark.parametrize("raw, expected", [
    ((2, 29, 7), "2.29.7"),  # torch.cuda.nccl.version() in torch >= 2.0
    ([2, 30, 7], "2.30.7"),  # a tuple after a JSON round trip
    (22809, "2.28.9"),  # NCCL_VERSION_CODE since 2.9: major*10000 + minor*100 + patch
    (2708, "2.7.8"),  # before 2.9: major*1000 + minor*100 + patch
    (" 2.30.7 ", "2.30.7"),
    (None, None),
    ("", None),
])
def test_version_string(raw, expected):
    assert version_string(raw) == expected


def test_an_unreadable_version_is_an_error():
    with pytest.raises(ValueError, match="unreadable NCCL version"):
        version_string({"major": 2})


def test_what_an_engine_reports():
    assert reported_nccl_version({"model_path": "m", "nccl_version": [2, 30, 7]}) == "2.30.7"
    assert reported_nccl_version({"model_path": "m", "nccl_version": None}) is None
    assert reported_nccl_version({"model_path": "m"}) is None  # SGLang


def test_this_process_reports_torchs_nccl_or_none():
    import torch

    expected = version_string(torch.cuda.nccl.version()) if dist.is_nccl_available() else None
    assert local_nccl_version() == expected
    if expected is not None:
        assert len(expected.split(".")) == 3


def test_the_readmes_sglang_releases_and_their_nccl():
    assert release_nccl("0.5.23") == ("2.14.1", "2.30.7")
    assert release_nccl("0.5.15.post1") == ("2.11.0", "2.28.9")
    assert release_nccl("0.5.22") is None and release_nccl(None) is None
