"""The import rule of ../shared/DESIGN.md, and the one place ChatML is spelled.

Loop packages meet on the wire: none imports another. The ground floor imports no loop.
clawr1 never imports an environment. No import cycles in clawr1/, envs/ and benchmarks/, not even one closed
by an import inside a function. Only clawr1/tinymodel/chatml.py (the tiny model's template) writes
ChatML's markers: everything else renders with the model's own template.
"""
from __future__ import annotations

import ast
from pathlib import Path

from clawr1.tinymodel import chatml
from tests.conftest import REPO

LOOPS = ("gateway", "serving", "rollout", "judge", "pool", "trainer")
GROUND_FLOOR = ("protocol", "bus", "config", "addresses", "ports", "chat", "engine_api", "runtime", "tracking", "algo", "model_path",
                "environment", "record_log", "chat_client", "tinymodel", "tokenizer_packages", "model_import",
                "model_dir", "cpu_dtype", "tinker_serve")  # tinker_serve: Tinker's API served (clawr1 tinker-serve), no loop's code
WITHOUT_CYCLES = ("clawr1", "envs", "benchmarks")


def imported_modules(path: Path, root: Path = REPO) -> set[str]:
    """Every module a file imports, at any depth (function-level imports included), as absolute names; for
    `from m import x`, both m and m.x (x may be a module or a name)."""
    out = set()
    package = ".".join(path.relative_to(root).with_suffix("").parts[:-1])
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


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path, packages: tuple[str, ...]) -> dict[str, set[str]]:
    """Module -> the modules of `packages` it imports (anywhere in the file), for every .py under them."""
    files = {module_name(p, root): p for package in packages for p in sorted((root / package).rglob("*.py"))}
    return {name: {m for m in imported_modules(path, root) if m in files and m != name}
            for name, path in files.items()}


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan): each holds at least one cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in sorted(graph.get(module, ())):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(cycles)


def files_of(part: str) -> list[Path]:
    root = REPO / "clawr1" / part
    return sorted(root.rglob("*.py")) if root.is_dir() else [root.with_suffix(".py")]


def test_the_ground_floor_and_the_loops_all_exist():
    for part in LOOPS + GROUND_FLOOR:
        assert all(p.exists() for p in files_of(part)) and files_of(part), part


def test_every_package_of_clawr1_is_a_loop_or_on_the_ground_floor():
    packages = sorted(p.name for p in (REPO / "clawr1").iterdir() if (p / "__init__.py").is_file())
    assert [p for p in packages if p not in LOOPS + GROUND_FLOOR] == []


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
    probe = tmp_path / "clawr1" / "judge" / "_layout_probe.py"
    probe.parent.mkdir(parents=True)
    probe.write_text("from ..gateway import service\n")
    assert "clawr1.gateway.service" in imported_modules(probe, tmp_path)


def test_there_are_no_import_cycles():
    graph = import_graph(REPO, WITHOUT_CYCLES)
    cycles = import_cycles(graph)
    listed = "\n".join(" <-> ".join(c) for c in cycles)
    assert len(graph) > 100 and not cycles, f"modules that import each other (at any depth):\n{listed}"


def test_a_cycle_closed_inside_a_function_is_caught(tmp_path):
    """The checker itself, on a planted tree: a <-> b closed by b's function-level import, c -> d -> e -> c through
    a relative import, and f -> a outside any cycle."""
    files = {"a.py": "from pkg import b\n",
             "b.py": "def late():\n    from pkg.a import thing\n    return thing\n",
             "c.py": "import pkg.d\n", "d.py": "from pkg.e import x\n", "e.py": "from . import c\n",
             "f.py": "from pkg import a\n", "__init__.py": ""}
    (tmp_path / "pkg").mkdir()
    for name, text in files.items():
        (tmp_path / "pkg" / name).write_text(text)
    assert import_cycles(import_graph(tmp_path, ("pkg",))) == [["pkg.a", "pkg.b"], ["pkg.c", "pkg.d", "pkg.e"]]
    (tmp_path / "pkg" / "b.py").write_text("def late():\n    return None\n")
    assert import_cycles(import_graph(tmp_path, ("pkg",))) == [["pkg.c", "pkg.d", "pkg.e"]]


def test_only_the_chat_module_spells_chatml():
    markers = (chatml.IM_START, chatml.IM_END)
    sources = [p for d in ("clawr1", "envs", "benchmarks", "tests", "recipes", "launch")
               for p in sorted((REPO / d).rglob("*")) if p.suffix in (".py", ".sh", ".yaml", ".md", ".txt", ".json")]
    spelled = [str(p.relative_to(REPO)) for p in sources
               if p != REPO / "clawr1" / "tinymodel" / "chatml.py" and any(m in p.read_text(errors="replace") for m in markers)]
    assert len(sources) > 50 and not spelled, f"ChatML written outside clawr1/tinymodel/chatml.py: {spelled}"


def test_the_slow_first_order_names_modules_that_exist():
    """tests/conftest.py's SLOW_FIRST starts the slowest modules first (pytest.ini keeps xdist from reordering
    them): a renamed module would silently fall back to the end."""
    from tests.conftest import SLOW_FIRST

    assert len(set(SLOW_FIRST)) == len(SLOW_FIRST)
    assert [m for m in SLOW_FIRST if not (REPO / m).is_file()] == []


def private_imports(paths: list[Path], root: Path = REPO, packages: tuple[str, ...] = WITHOUT_CYCLES) -> list[str]:
    """`from <one of packages>... import _name`: a name another module keeps private."""
    found = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in packages:
                found += [f"{path.relative_to(root)} imports {node.module}.{a.name}" for a in node.names
                          if a.name.startswith("_")]
    return found


def test_no_module_imports_a_private_name_of_another():
    paths = [p for package in WITHOUT_CYCLES for p in sorted((REPO / package).rglob("*.py"))]
    assert private_imports(paths) == [], "a name used by another module is public (no leading underscore)"


def test_the_private_import_check_finds_one(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("from clawr1.trainer.step import _x, flat_field\nfrom os import _exit\n")
    assert private_imports([probe], tmp_path) == ["probe.py imports clawr1.trainer.step._x"]
