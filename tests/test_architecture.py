"""docs/architecture.md, the design map, names every module of clawr1/ and envs/, and every test it cites exists.

Which modules count: those Python can import as part of the `clawr1` or `envs` package, i.e. every folder from
the package root down to the file holds an `__init__.py`; `__init__.py` files themselves are left out. Task
data is left out that way: the terminal task directories (envs/terminal/tasks/) and the SWE tasks' bundled
repositories (envs/swe/repos/) are not packages of envs, and their Python files are what agents work on.
A module is named when its repo-relative path (e.g. `clawr1/gateway/adapters.py`) appears in the map.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.conftest import REPO

MAP = REPO / "docs" / "architecture.md"
PACKAGES = ("clawr1", "envs")
CITATION = re.compile(r"(tests/[\w/]+\.py)::(\w+)")


def package_modules(repo: Path, packages: tuple[str, ...] = PACKAGES) -> list[str]:
    """Repo-relative paths of the importable modules of `packages`, __init__.py left out."""
    found = []
    for package in packages:
        root = repo / package
        for path in sorted(root.rglob("*.py")):
            if path.name == "__init__.py" or "__pycache__" in path.parts:
                continue
            folders = [root] + [root.joinpath(*path.relative_to(root).parts[:i])
                                for i in range(1, len(path.relative_to(root).parts))]
            if all((folder / "__init__.py").is_file() for folder in folders):
                found.append(path.relative_to(repo).as_posix())
    return found


def unnamed_modules(repo: Path, map_text: str, packages: tuple[str, ...] = PACKAGES) -> list[str]:
    return [m for m in package_modules(repo, packages) if m not in map_text]


def missing_citations(repo: Path, map_text: str) -> list[str]:
    """`tests/...py::name` citations whose file does not exist or defines no function of that name."""
    missing = []
    for file, name in sorted(set(CITATION.findall(map_text))):
        path = repo / file
        defined = {node.name for node in ast.walk(ast.parse(path.read_text()))
                   if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))} if path.is_file() else set()
        if name not in defined:
            missing.append(f"{file}::{name}")
    return missing


def test_every_module_is_named_in_the_map():
    unnamed = unnamed_modules(REPO, MAP.read_text())
    assert not unnamed, ("docs/architecture.md does not name these modules; a change to the design changes the "
                         "map in the same commit:\n" + "\n".join(unnamed))


def test_every_cited_test_exists():
    text = MAP.read_text()
    assert len(set(CITATION.findall(text))) >= 20, "the map's invariants cite their tests as tests/FILE.py::test_name"
    missing = missing_citations(REPO, text)
    assert not missing, "docs/architecture.md cites tests that do not exist:\n" + "\n".join(missing)


def _tree(root: Path, files: dict[str, str]) -> Path:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_the_checks_catch_an_unnamed_module_and_a_missing_test(tmp_path):
    repo = _tree(tmp_path, {
        "clawr1/__init__.py": "", "clawr1/bus.py": "", "clawr1/pool/__init__.py": "", "clawr1/pool/store.py": "",
        "envs/__init__.py": "", "envs/toy/__init__.py": "", "envs/toy/env.py": "",
        "envs/toy/tasks/t1/tests/test_outputs.py": "",  # task data: not a package of envs
        "tests/test_bus.py": "def test_round_trip():\n    pass\n",
    })
    assert package_modules(repo) == ["clawr1/bus.py", "clawr1/pool/store.py", "envs/toy/env.py"]
    complete = "`clawr1/bus.py` `clawr1/pool/store.py` `envs/toy/env.py` `tests/test_bus.py::test_round_trip`"
    assert unnamed_modules(repo, complete) == [] and missing_citations(repo, complete) == []

    assert unnamed_modules(repo, complete.replace("`clawr1/pool/store.py`", "")) == ["clawr1/pool/store.py"]
    (repo / "envs" / "toy" / "grader.py").write_text("")
    assert unnamed_modules(repo, complete) == ["envs/toy/grader.py"]
    wrong = complete + " `tests/test_bus.py::test_gone` `tests/test_nowhere.py::test_x`"
    assert missing_citations(repo, wrong) == ["tests/test_bus.py::test_gone", "tests/test_nowhere.py::test_x"]


def map_header(map_text: str) -> list[str]:
    """The wire headers the map's wire section names (`the header `clawr1/N``)."""
    return re.findall(r"the header `([^`]+)`", map_text)


def map_recipe_folders(map_text: str) -> list[str]:
    """The folders the map's `recipes/` row lists."""
    row = re.search(r"^\| `recipes/` \| one folder per objective or task \(([^)]*)\)", map_text, re.MULTILINE)
    return re.findall(r"`([\w-]+)`", row.group(1)) if row else []


def test_the_wire_header_in_the_map_is_the_protocols():
    from clawr1 import protocol

    assert map_header(MAP.read_text()) == [protocol.header().decode()]


def test_the_recipe_folders_in_the_map_are_those_under_recipes():
    on_disk = sorted(p.name for p in (REPO / "recipes").iterdir() if p.is_dir() and not p.name.startswith("."))
    assert sorted(map_recipe_folders(MAP.read_text())) == on_disk


def map_loop_rows(map_text: str) -> dict[str, str]:
    """Each row of the map's loop table ("| loop | command | package | job |"): {command: package folder}."""
    table = re.search(r"^\| loop \| command \| package \| job \|\n\|[-|]+\|\n((?:\|.*\n)+)", map_text, re.MULTILINE)
    rows = {}
    for line in table.group(1).splitlines() if table else []:
        command, package = line.split("|")[2:4]
        found = re.search(r"`clawr1 ([\w-]+)`", command), re.search(r"`(clawr1/\w+)/`", package)
        if all(found):
            rows[found[0].group(1)] = found[1].group(1)
    return rows


def test_the_loop_table_names_each_command_beside_its_package():
    from clawr1.cli import LOOPS

    assert map_loop_rows(MAP.read_text()) == {
        command: "/".join(module.split(".")[:2]) for command, (module, _) in LOOPS.items()}


def test_the_loop_table_check_reads_what_the_map_says():
    text = ("| loop | command | package | job |\n|---|---|---|---|\n"
            "| serving | `clawr1 serve` (embedded) | `clawr1/serving/` | generates |\n"
            "| trainer | `clawr1 train` | `clawr1/trainer/` | steps |\n\nafter\n")
    assert map_loop_rows(text) == {"serve": "clawr1/serving", "train": "clawr1/trainer"}
    assert map_loop_rows("no table") == {}


def test_the_header_and_recipe_checks_read_what_the_map_says():
    text = "the header `clawr1/3` and ...\n| `recipes/` | one folder per objective or task (`opd`, `gui`): configs |\n"
    assert map_header(text) == ["clawr1/3"] and map_recipe_folders(text) == ["opd", "gui"]
    assert map_recipe_folders("| `recipes/` | configs |") == []
