"""SGLang's own environment made to serve on CPU: the kernel stand-in and the pin_memory workaround.

`python -m clawr1.serving.sglang_cpu install VENV` (scripts/setup_sglang.sh runs it) does two things to the
environment SGLang 0.5.23 is installed in, and nothing to any other:
- installs `sgl_kernel`, clawr1's stand-in for SGLang's CPU kernel package (not on PyPI): SGLang imports a few
  of its names on CPU and, without AMX and with --attention-backend torch_native, never calls them; every name
  in the stand-in raises when called (clawr1/serving/sgl_kernel_standin);
- only where that environment's torch sees no CUDA: SGLang's LoRA code pins host memory unconditionally
  (`pin_memory=True`, `.pin_memory()` in srt/lora/layers.py and srt/lora/backend/torch_backend.py), which
  needs an NVIDIA driver; those calls become unpinned copies (`pin_memory=False`, `.clone()`).

Stdlib only: it runs under SGLang's Python or clawr1's.
"""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

STANDIN = Path(__file__).with_name("sgl_kernel_standin")
PINNING_FILES = ("sglang/srt/lora/layers.py", "sglang/srt/lora/backend/torch_backend.py")
PATCH_MARK = "# clawr1: host memory is not pinned here (no CUDA); see clawr1/serving/sglang_cpu.py\n"
_PIN_ARG = re.compile(r"pin_memory=True")
_PIN_CALL = re.compile(r"\.pin_memory\(\)")


def site_packages(python: str) -> Path:
    """Where `python`'s environment installs pure-Python packages."""
    out = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


def has_cuda(python: str) -> bool:
    """Whether torch in `python`'s environment sees a CUDA device."""
    out = subprocess.run([python, "-c", "import torch; print(torch.cuda.is_available())"],
                         capture_output=True, text=True, check=True)
    return out.stdout.strip() == "True"


def install_standin(site: Path) -> Path:
    """Copy the stand-in in as `sgl_kernel`, unless a real package is there (one without our STANDIN flag)."""
    target = site / "sgl_kernel"
    init = target / "__init__.py"
    if init.exists() and "STANDIN = True" not in init.read_text():
        raise SystemExit(f"{target} is a real sgl_kernel package; the stand-in is not installed over it")
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(STANDIN, target, ignore=shutil.ignore_patterns("__pycache__"))
    return target


def unpin(source: str) -> tuple[str, int]:
    """`source` with host-memory pinning replaced by unpinned copies, and how many places changed."""
    source, args = _PIN_ARG.subn("pin_memory=False", source)
    source, calls = _PIN_CALL.subn(".clone()", source)
    return source, args + calls


def patch_pinning(site: Path) -> list[str]:
    """Apply unpin() to PINNING_FILES once; what changed, one line a file. SystemExit when a file is missing or
    has nothing to change (another SGLang release: the workaround must be re-read, not applied blind)."""
    done = []
    for rel in PINNING_FILES:
        path = site / rel
        if not path.exists():
            raise SystemExit(f"{path} is missing: is SGLang 0.5.23 installed in this environment?")
        text = path.read_text()
        if text.startswith(PATCH_MARK):
            done.append(f"{rel}: already unpinned")
            continue
        patched, count = unpin(text)
        if not count:
            raise SystemExit(f"{path} pins no host memory: this SGLang release differs from 0.5.23; re-read it")
        path.write_text(PATCH_MARK + patched)
        done.append(f"{rel}: {count} pinning calls unpinned")
    return done


def install(venv: Path) -> None:
    python = str(venv / "bin" / "python")
    site = site_packages(python)
    print(f"sglang_cpu: stand-in kernel package at {install_standin(site)}")
    if has_cuda(python):
        print("sglang_cpu: CUDA is present; SGLang's pinned host memory is left as it is")
        return
    for line in patch_pinning(site):
        print(f"sglang_cpu: {line}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m clawr1.serving.sglang_cpu", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("install", help="the stand-in and the workaround, into SGLang's environment").add_argument(
        "venv", type=Path, help="SGLang's virtual environment (e.g. .venv-sglang)")
    args = parser.parse_args(argv)
    install(args.venv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
