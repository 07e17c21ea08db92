"""The import rule of ../shared/DESIGN.md, and the one place ChatML is spelled.

Loop packages meet on the wire: none imports another. The ground floor imports no loop.
clawr1 never imports an environment. Only clawr1/tinymodel/chatml.py (the tiny model's template) writes
ChatML's markers: everything else renders with the model's own template.
"""
from __future__ import annotations

import ast
from pathlib import Path

from clawr1.tinymodel import chatml
from tests.conftest import REPO

LOOPS = ("gateway", "serving", "rollout", "judge", "pool", "trainer")
GROUND_FLOOR = ("protocol", "bus", "config", "chat", "engine_api", "runtime", "tracking", "algo", "model_path",
                "environment", "record_log", "chat_client", "tinymodel", "tokenizer_packages", "model_import")


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, at any depth (function-level imports included), as absolute names."""
    out = set()
    package = ".".join(path.relative_to(REPO).with_suffix("").parts[:-1])
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against the file's package
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            out |= {base} | {f"{base}.{a.name}" for a in node.names}
    return out


def files_of(part: str) -> list[Path]:
    root = REPO / "clawr1" / part
    return sorted(root.rglob("*.py")) if root.is_dir() else [root.with_suffix(".py")]


def test_the_ground_floor_and_the_loops_all_exist():
    for part in LOOPS + GROUND_FLOOR:
        assert all(p.exists() for p in files_of(part)) and files_of(part), part


def test_no_loop_imports_another_loop():
    wrong = []
    for loop in LOOPS:
        for path in files_of(loop):
            for module in imported_modules(path):
                other = module.split(".")[1] if module.startswith("clawr1.") else None
                if other in LOOPS and other != loop:
                    wrong.append(f"{path.relative_to(REPO)} imports {module}")
    assert not wrong, "loops meet on the wire, not by import:\n" + "\n".join(wrong)


def test_the_ground_floor_imports_no_loop():
    wrong = [f"{path.relative_to(REPO)} imports {module}"
             for part in GROUND_FLOOR for path in files_of(part) for module in imported_modules(path)
             if module.startswith("clawr1.") and module.split(".")[1] in LOOPS]
    assert not wrong, "\n".join(wrong)


def test_clawr1_never_imports_an_environment():
    wrong = [f"{path.relative_to(REPO)} imports {module}" for path in sorted((REPO / "clawr1").rglob("*.py"))
             for module in imported_modules(path) if module == "envs" or module.startswith("envs.")]
    assert not wrong, "environments are named by import path in the config:\n" + "\n".join(wrong)


def test_the_rule_catches_a_violation(tmp_path):
    """The checker itself: a relative import reaching into another loop is seen."""
    fake = REPO / "clawr1" / "judge" / "_layout_probe.py"
    fake.write_text("from ..gateway import service\n")
    try:
        assert "clawr1.gateway.service" in imported_modules(fake)
    finally:
        fake.unlink()


def test_only_the_chat_module_spells_chatml():
    markers = (chatml.IM_START, chatml.IM_END)
    sources = [p for d in ("clawr1", "envs", "benchmarks", "tests", "recipes", "launch")
               for p in sorted((REPO / d).rglob("*")) if p.suffix in (".py", ".sh", ".yaml", ".md", ".txt", ".json")]
    spelled = [str(p.relative_to(REPO)) for p in sources
               if p != REPO / "clawr1" / "tinymodel" / "chatml.py" and any(m in p.read_text(errors="replace") for m in markers)]
    assert len(sources) > 50 and not spelled, f"ChatML written outside clawr1/tinymodel/chatml.py: {spelled}"
