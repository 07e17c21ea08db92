"""The sandbox's test toolchain: a read-only Python environment with pytest, built once from pinned wheels.

Test suites (Terminal-Bench's `python3 -m pytest`, a repository's own tests) need pytest, and the
sandbox has no network to install it. So every sandbox sees this environment, read-only, at
`MOUNT` (/opt/toolchain), its `bin/` first on PATH:

- `bin/python3` (and `bin/python`): a venv of the sandbox's own system python3: the standard library
  plus the pinned packages below, nothing of the host's site-packages (so no host plugin loads);
  `python3 -I` keeps the venv, so `-I` scripts import pytest too;
- `bin/pytest` (and `bin/py.test`);
- `lib/pythonX.Y/site-packages/`: `PINS`, pure-Python wheels checked by sha256 (pip --require-hashes).

It is built on first use (scripts/setup.sh builds it at set-up) into
`~/.cache/clawr1/toolchain/python<X.Y>-<digest>`, the digest covering the pins, the python and the
mount point, so changing any of them builds a new one. The built tree is never written again.

    python -m envs.agentic.toolchain     # build it now; prints its directory
"""
from __future__ import annotations

import atexit
import fcntl
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

MOUNT = "/opt/toolchain"  # where the toolchain appears inside every sandbox
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # host and sandbox share these
DEFAULT_CACHE = Path("~/.cache/clawr1/toolchain").expanduser()
MIN_PYTHON = (3, 10)  # pytest 9 needs it
DONE = "toolchain.json"  # written last: a directory without it is an unfinished build
PIP_TIMEOUT_S = 600


@dataclass(frozen=True)
class Pin:
    name: str
    version: str
    sha256: str  # of the py3-none-any wheel
    below: tuple[int, int] | None = None  # only for sandbox pythons older than this

    def requirement(self) -> str:
        return f"{self.name}=={self.version} --hash=sha256:{self.sha256}"


PINS = (
    Pin("pytest", "9.0.2", "711ffd45bf766d5264d487b917733b453d917afd2b0ad65223959f59089f875b"),
    Pin("pluggy", "1.6.0", "e920276dd6813095e9377c0bc5566d94c932c33b27a3e3945d8389c374dd4746"),
    Pin("iniconfig", "2.3.0", "f631c04d2c48c52b84d0d0549c99ff3859c98df65b3101406327ecc7d53fbf12"),
    Pin("packaging", "25.0", "29572ef2b1f17581046b3a2227d5c611fb25ec70ca1ba8554b24b0e69331a484"),
    Pin("pygments", "2.19.2", "86540386c03d588bb81d44bc3928634ff26449851e99741617ecb9037ee5ec0b"),
    Pin("pytest-timeout", "2.4.0", "c42667e5cdadb151aeb5b26d114aff6bdf5a907f176a007a30b940d3d865b5c2"),
    Pin("pytest-mock", "3.15.1", "0a25e2eb88fe5168d535041d09a4529a188176ae608a6d249ee65abc0949630d"),
    # pytest's dependencies on Python 3.10 only
    Pin("exceptiongroup", "1.3.0", "4d111e6e0c13d0644cad6ddaa7ed0261a0b36971f6d23e7ec9b4b9097da78a10", (3, 11)),
    Pin("tomli", "2.2.1", "cb55c73c5f4408779d0cf3eef9f762b9c9f147a77de7b258bef0a5628adc85cc", (3, 11)),
    Pin("typing-extensions", "4.15.0", "f0fa19c6845758ab08074a0cfa8b7aecb71c999ca73d62883bc25cc018c4e548", (3, 11)),
)

# Run by the sandbox's python3 through bin/pytest: the venv's python, found at the mount point.
PYTEST_SCRIPT = f"#!{MOUNT}/bin/python3\nimport sys\nfrom pytest import console_main\nsys.exit(console_main())\n"


class ToolchainError(RuntimeError):
    """The toolchain cannot be built; the text says why."""


def pins_for(version: tuple[int, int], pins: tuple[Pin, ...] = PINS) -> list[Pin]:
    """The pins a sandbox python of `version` (major, minor) needs."""
    return [p for p in pins if p.below is None or version < p.below]


def python_version(python3: str) -> tuple[int, int, int]:
    """The version of the interpreter at `python3`."""
    done = subprocess.run([python3, "-I", "-c", "import sys; print(*sys.version_info[:3])"],
                          capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise ToolchainError(f"{python3} does not run: {done.stderr.strip()[-300:]}")
    major, minor, micro = (int(x) for x in done.stdout.split())
    return major, minor, micro


def toolchain_name(python3: str, version: tuple[int, int, int], pins: list[Pin]) -> str:
    """The cache directory's name: python<X.Y>-<digest of the pins, the python and the mount point>."""
    key = json.dumps([python3, list(version), MOUNT, [p.requirement() for p in pins]])
    return f"python{version[0]}.{version[1]}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def toolchain_dir(python3: str, cache: Path = DEFAULT_CACHE, pins: tuple[Pin, ...] = PINS) -> Path:
    """The toolchain for the sandbox python `python3` (its path as seen inside), built on first use."""
    version = python_version(python3)
    if version[:2] < MIN_PYTHON:
        raise ToolchainError(f"the sandbox's python3 ({python3}) is {'.'.join(map(str, version))}; "
                             f"the test toolchain needs {'.'.join(map(str, MIN_PYTHON))} or newer")
    chosen = pins_for(version[:2], pins)
    out = cache / toolchain_name(python3, version, chosen)
    if (out / DONE).exists():
        return out
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as lock:  # another process may be building the same one
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / DONE).exists():
            build(out, python3, version, chosen)
    return out


def build(out: Path, python3: str, version: tuple[int, int, int], pins: list[Pin]) -> None:
    """Install `pins` into a fresh venv layout for `python3` at `out` (replaced only when complete)."""
    print(f"[toolchain] building the sandbox's test toolchain in {out}", file=sys.stderr, flush=True)
    staging = Path(tempfile.mkdtemp(prefix=".building-", dir=out.parent))
    try:
        site = staging / "lib" / f"python{version[0]}.{version[1]}" / "site-packages"
        _pip_install(pins, version, site)
        shutil.rmtree(site / "bin", ignore_errors=True)  # pip's scripts name the host's python: ours follow
        _write_venv(staging, python3, version)
        _compile(python3, site)
        (staging / DONE).write_text(json.dumps({"python3": python3, "version": list(version), "mount": MOUNT,
                                                "pins": [p.requirement() for p in pins]}, indent=1) + "\n")
        _make_readable(staging)
        if out.exists():
            shutil.rmtree(out)
        staging.replace(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _pip_install(pins: list[Pin], version: tuple[int, int, int], site: Path) -> None:
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as requirements:
        requirements.write("".join(p.requirement() + "\n" for p in pins))
        requirements.flush()
        argv = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps",
                "--require-hashes", "--only-binary=:all:", "--no-compile", "--target", str(site),
                # pure-Python wheels only, for the sandbox's python (not the one running pip)
                "--python-version", f"{version[0]}.{version[1]}", "--implementation", "py", "--abi", "none",
                "--platform", "any", "-r", requirements.name]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    if done.returncode != 0:
        raise ToolchainError(f"pip could not install the test toolchain's pinned wheels: "
                             f"{(done.stderr or done.stdout).strip()[-1500:]}")


def _write_venv(root: Path, python3: str, version: tuple[int, int, int]) -> None:
    """pyvenv.cfg and bin/: the layout `python3 -m venv --without-pip` makes, for the mount point."""
    (root / "pyvenv.cfg").write_text(f"home = {os.path.dirname(python3)}\ninclude-system-site-packages = false\n"
                                     f"version = {'.'.join(map(str, version))}\n")
    bin_dir = root / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(python3)  # the sandbox sees the host's /usr at the same path
    (bin_dir / "python").symlink_to("python3")
    for name in ("pytest", "py.test"):
        (bin_dir / name).write_text(PYTEST_SCRIPT)
        (bin_dir / name).chmod(0o755)


def _compile(python3: str, site: Path) -> None:
    """Byte-compile with the sandbox's own python: the read-only tree cannot cache .pyc files later."""
    done = subprocess.run([python3, "-I", "-m", "compileall", "-q", "-j", "1", "--invalidation-mode",
                           "unchecked-hash", str(site)], capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    if done.returncode != 0:
        raise ToolchainError(f"could not byte-compile the toolchain: {(done.stderr or done.stdout).strip()[-500:]}")


def _make_readable(root: Path) -> None:
    """Readable (and directories traversable) by everyone: the sandbox may run as another user."""
    for parent, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(parent, name)
            if not os.path.islink(path):
                mode = stat.S_IMODE(os.lstat(path).st_mode)
                os.chmod(path, mode | 0o444 | (0o111 if mode & 0o100 else 0))
    os.chmod(root, 0o755)


# ---------------------------------------------------------------- what the sandbox binds

def reachable_by(path: Path, uid: int) -> bool:
    """Whether user `uid` (no supplementary groups) can traverse to `path` and read it, by mode bits."""
    for directory in [*reversed(path.parents), path]:
        info = os.stat(directory)
        bits = stat.S_IXUSR | stat.S_IRUSR if info.st_uid == uid else stat.S_IXOTH | stat.S_IROTH
        if directory != path:
            bits &= stat.S_IXUSR | stat.S_IXOTH  # an ancestor needs only traversal
        if info.st_mode & bits != bits:
            return False
    return True


def bind_source(toolchain: Path, uid: int) -> Path:
    """The host directory to bind at MOUNT for sandboxes running as `uid`.

    The toolchain itself when `uid` can reach it; otherwise (a root launcher whose cache sits in a
    private home) a copy in a fresh directory of the temp dir, readable by all and writable by none
    but us, deleted at exit (the sandbox asks once per process).
    """
    if reachable_by(toolchain, uid):
        return toolchain
    holder = Path(tempfile.mkdtemp(prefix="clawr1-toolchain-"))
    atexit.register(shutil.rmtree, holder, True)
    holder.chmod(0o755)
    copy = holder / toolchain.name
    shutil.copytree(toolchain, copy, symlinks=True)
    if not reachable_by(copy, uid):
        raise ToolchainError(f"user {uid} cannot read the toolchain's copy at {copy} (is the temp dir private?)")
    return copy


def sandbox_python3() -> str:
    """The system python3 the sandbox sees (host and sandbox share /usr): the toolchain's base."""
    python3 = shutil.which("python3", path=SYSTEM_PATH)
    if python3 is None:
        raise ToolchainError(f"no python3 on {SYSTEM_PATH}: the sandbox's test toolchain needs one")
    return python3


def main() -> None:
    print(toolchain_dir(sandbox_python3()))


if __name__ == "__main__":
    main()
