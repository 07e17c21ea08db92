"""The sandbox's test toolchain: pinned wheels checked by sha256, built once per python, reachable by the sandbox's user."""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from envs.agentic.toolchain import (DONE, MOUNT, PINS, Pin, ToolchainError, bind_source, pins_for, reachable_by,
                                    sandbox_python3, toolchain_dir, toolchain_name)

OTHER_UID = 65534 if os.getuid() != 65534 else 65533  # a user who owns none of our files
INICONFIG = next(p for p in PINS if p.name == "iniconfig")


def test_pins_are_exact_versions_with_checksums_and_py310_gets_its_backports():
    assert all(p.version[0].isdigit() and len(p.sha256) == 64 and int(p.sha256, 16) >= 0 for p in PINS)
    always = ["pytest", "pluggy", "iniconfig", "packaging", "pygments", "pytest-timeout", "pytest-mock"]
    assert [p.name for p in pins_for((3, 11))] == always == [p.name for p in pins_for((3, 13))]
    assert [p.name for p in pins_for((3, 10))] == always + ["exceptiongroup", "tomli", "typing-extensions"]
    assert INICONFIG.requirement() == f"iniconfig==2.3.0 --hash=sha256:{INICONFIG.sha256}"


def test_the_cache_name_changes_with_any_pin_or_the_python():
    pins = pins_for((3, 11))
    name = toolchain_name("/usr/bin/python3", (3, 11, 2), pins)
    assert name.startswith("python3.11-") and len(name) == len("python3.11-") + 12
    assert toolchain_name("/usr/bin/python3", (3, 11, 2), list(pins)) == name
    bumped = [Pin(p.name, "0.0.1", p.sha256) if p.name == "pluggy" else p for p in pins]
    assert toolchain_name("/usr/bin/python3", (3, 11, 2), bumped) != name
    assert toolchain_name("/usr/local/bin/python3", (3, 11, 2), pins) != name
    assert toolchain_name("/usr/bin/python3", (3, 11, 9), pins) != name


def test_the_toolchain_is_built_once_and_reused():
    first = toolchain_dir(sandbox_python3())
    stamp = (first / DONE).stat().st_mtime_ns
    assert toolchain_dir(sandbox_python3()) == first and (first / DONE).stat().st_mtime_ns == stamp
    record = json.loads((first / DONE).read_text())
    assert record["mount"] == MOUNT and record["python3"] == sandbox_python3()
    assert record["pins"] == [p.requirement() for p in pins_for(tuple(record["version"][:2]))]


def test_a_build_is_a_venv_of_the_system_python_holding_only_its_pins(tmp_path: Path):
    built = toolchain_dir(sandbox_python3(), cache=tmp_path, pins=(INICONFIG,))
    assert sorted(os.listdir(tmp_path)) == [".lock", built.name]  # no staging directory left behind
    assert (built / "pyvenv.cfg").read_text().splitlines()[:2] == [
        f"home = {os.path.dirname(sandbox_python3())}", "include-system-site-packages = false"]
    assert os.readlink(built / "bin" / "python3") == sandbox_python3()
    assert (built / "bin" / "pytest").read_text().startswith(f"#!{MOUNT}/bin/python3\n")
    probe = "import iniconfig, sys, importlib.util as u; print(iniconfig.__file__); print(u.find_spec('pytest'))"
    run = subprocess.run([str(built / "bin" / "python3"), "-I", "-c", probe], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0, run.stderr
    [site] = built.glob("lib/python3.*/site-packages")
    assert run.stdout.splitlines() == [str(site / "iniconfig" / "__init__.py"), "None"]  # only what was pinned
    assert list(site.glob("iniconfig/__pycache__/__init__.*.pyc")), "not byte-compiled"


def test_a_wheel_with_another_checksum_is_not_installed(tmp_path: Path):
    wrong = Pin("iniconfig", "2.3.0", "0" * 64)
    with pytest.raises(ToolchainError, match="(?i)hash"):
        toolchain_dir(sandbox_python3(), cache=tmp_path, pins=(wrong,))
    assert os.listdir(tmp_path) == [".lock"]  # nothing half-built is kept


def test_a_private_toolchain_is_bound_from_a_readable_copy(tmp_path: Path):
    private = Path(tempfile.mkdtemp(dir=tmp_path))  # mode 0700: another user cannot traverse it
    toolchain = private / "python3.11-abc"
    (toolchain / "bin").mkdir(parents=True)
    (toolchain / "bin" / "pytest").write_text("#!/bin/sh\n")
    (toolchain / "bin" / "pytest").chmod(0o755)
    (toolchain / "bin" / "python3").symlink_to("/usr/bin/python3")
    assert not reachable_by(toolchain, OTHER_UID) and reachable_by(toolchain, os.getuid())
    assert bind_source(toolchain, os.getuid()) == toolchain
    copy = bind_source(toolchain, OTHER_UID)
    assert copy != toolchain and copy.name == toolchain.name and reachable_by(copy, OTHER_UID)
    assert Path(tempfile.gettempdir()) in copy.parents
    assert os.readlink(copy / "bin" / "python3") == "/usr/bin/python3"  # links stay links
    assert (copy / "bin" / "pytest").read_text() == "#!/bin/sh\n" and os.access(copy / "bin" / "pytest", os.X_OK)
    assert oct(copy.parent.stat().st_mode & 0o777) == "0o755" and copy.parent.stat().st_uid == os.getuid()
