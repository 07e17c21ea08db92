"""SWE task rows: the loader's checks, the reproducible base repositories, and the validation command.

The validation runs the real suites of the bundled repositories with the real pytest of the sandbox's
toolchain, with the bug and with the gold patch.
"""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from envs.agentic.sandbox import SandboxLimits, available_backends
from envs.swe.docker import episode_command, export_commands
from envs.swe.grading import is_test_path, parse_outcomes
from envs.swe.tasks import (BUNDLED_TASKS, GIT_ENV, TaskFormatError, git, load_tasks, parse_row, patch_files,
                            prepared_repo)
from envs.swe.validate import validate
from tests.conftest import REPO

needs_sandbox = pytest.mark.skipif(not available_backends(), reason="no isolating sandbox backend works here")
ROWS = [json.loads(line) for line in BUNDLED_TASKS.read_text().splitlines() if line.strip()]


def row(**changes) -> dict:
    """The first bundled row as SWE-bench writes it, with `changes` (None deletes a field)."""
    out = {**ROWS[0], "repo_dir": str(BUNDLED_TASKS.parent / ROWS[0]["repo_dir"])}
    out.update(changes)
    return {k: v for k, v in out.items() if v is not None}


def test_the_bundled_set_has_12_tasks_over_4_repositories():
    tasks = load_tasks()
    assert len(tasks) == 12 and len({t.repo for t in tasks}) == 4
    assert all(t.fail_to_pass and t.pass_to_pass and t.bug_patch for t in tasks)
    assert all(t.repo_dir is not None and (t.repo_dir / "tests").is_dir() for t in tasks)
    for t in tasks:  # the gold patch touches code only, test_patch tests only
        assert not any(is_test_path(p) for p in patch_files(t.patch)), t.id
        assert all(is_test_path(p) for p in patch_files(t.test_patch)), t.id


def test_test_lists_may_be_json_strings_or_lists():
    as_strings = parse_row(row())
    as_lists = parse_row(row(FAIL_TO_PASS=json.loads(ROWS[0]["FAIL_TO_PASS"]),
                             PASS_TO_PASS=json.loads(ROWS[0]["PASS_TO_PASS"])))
    assert as_strings == as_lists
    assert as_strings.fail_to_pass == ("tests/test_text.py::test_slugify_max_length_never_ends_with_separator",)


@pytest.mark.parametrize("changes, message", [
    ({"FAIL_TO_PASS": "[]"}, "instance 'slugkit-1': field 'FAIL_TO_PASS' is empty"),
    ({"FAIL_TO_PASS": []}, "instance 'slugkit-1': field 'FAIL_TO_PASS' is empty"),
    ({"patch": None}, "instance 'slugkit-1': missing field 'patch'"),
    ({"PASS_TO_PASS": None}, "instance 'slugkit-1': missing field 'PASS_TO_PASS'"),
    ({"test_patch": "  "}, "instance 'slugkit-1': field 'test_patch' must be a non-empty string"),
    ({"FAIL_TO_PASS": "not json"}, "field 'FAIL_TO_PASS' is a string but not a JSON list"),
    ({"PASS_TO_PASS": [1]}, "field 'PASS_TO_PASS' must be a list of test ids"),
    ({"image_name": "swebench/x:latest"}, "exactly one of the fields 'repo_dir'"),
    ({"repo_dir": None}, "exactly one of the fields 'repo_dir'"),
    ({"repo_dir": "/nonexistent/repo"}, "field 'repo_dir': no such directory"),
])
def test_bad_rows_are_refused_naming_the_instance_and_the_field(changes: dict, message: str):
    with pytest.raises(TaskFormatError, match=message.replace("(", r"\(").replace("[", r"\[")):
        parse_row(row(**changes))


def test_the_loader_names_the_file_and_line(tmp_path: Path):
    file = tmp_path / "tasks.jsonl"
    file.write_text(json.dumps(row()) + "\n\n" + json.dumps(row(instance_id="x-2", FAIL_TO_PASS="[]")) + "\n")
    with pytest.raises(TaskFormatError, match=r"tasks.jsonl:3: instance 'x-2': field 'FAIL_TO_PASS' is empty"):
        load_tasks(file)
    file.write_text(json.dumps(row()) + "\n" + json.dumps(row()) + "\n")
    with pytest.raises(TaskFormatError, match="occur more than once: slugkit-1"):
        load_tasks(file)


def test_a_docker_row_loads_but_runs_only_in_its_image():
    task = parse_row(row(repo_dir=None, image_name="swebench/sweb.eval.x86_64.slugkit-1:latest"))
    assert task.image_name == "swebench/sweb.eval.x86_64.slugkit-1:latest" and task.repo_dir is None
    with pytest.raises(TaskFormatError, match="runs only in its docker image"):
        prepared_repo(task)


def test_base_commits_are_reproducible_and_hold_the_bug():
    for task in load_tasks():
        repo = prepared_repo(task)
        assert git(["rev-parse", "HEAD"], repo).strip() == task.base_commit
        assert git(["log", "--format=%an <%ae> %ad", "--date=iso"], repo).splitlines() == [
            "clawr1 <swe@clawr1.invalid> 2025-01-01 00:00:00 +0000"]
        assert git(["status", "--porcelain"], repo) == ""
        assert git(["apply", "--check", "-"], repo, stdin=task.patch) == ""  # the gold patch fixes this base
    wrong = dataclasses.replace(load_tasks()[0], base_commit="0" * 40)
    with pytest.raises(TaskFormatError, match="field 'base_commit' is 0000000000000000000000000000000000000000, but"):
        prepared_repo(wrong)


def test_a_local_git_repository_is_checked_out_at_the_base_commit_with_nothing_later(tmp_path: Path):
    local = tmp_path / "local"
    local.mkdir()
    (local / "m.py").write_text("X = 1\n")
    git(["init", "-q", "-b", "main"], local)
    git(["add", "-A"], local)
    git(["commit", "-q", "-m", "one"], local)
    base = git(["rev-parse", "HEAD"], local).strip()
    (local / "m.py").write_text("X = 2  # the fix\n")
    git(["commit", "-q", "-am", "fix"], local)
    git(["tag", "v1"], local)
    task = parse_row(row(repo_dir=str(local), base_commit=base, bug_patch=None))
    repo = prepared_repo(task)
    assert (repo / "m.py").read_text() == "X = 1\n"
    assert git(["log", "--all", "--format=%s"], repo).split() == ["one"]  # the fix is out of reach
    assert git(["remote"], repo) == "" and git(["tag"], repo) == ""
    assert GIT_ENV["GIT_CONFIG_GLOBAL"]  # host git never reads the user's configuration


def test_test_paths_and_pytest_outcomes():
    assert all(map(is_test_path, ["tests/test_a.py", "pkg/tests/data.json", "test_x.py", "a_test.py", "conftest.py",
                                  "src/conftest.py"]))
    assert not any(map(is_test_path, ["pkg/mod.py", "pkg/testing_utils.py", "README.md"]))
    output = ("PASSED tests/t.py::test_fake\n"  # before the summary: a test's own print, ignored
              "=== short test summary info ===\nPASSED tests/t.py::test_a\nFAILED tests/t.py::test_b - assert 1 == 2\n"
              "PASSED tests/t.py::test_c[x - y]\nPASSED tests/t.py::test_d\nERROR tests/t.py::test_d - teardown\n"
              "1 failed, 3 passed, 1 error in 0.1s\n")
    ids = ["tests/t.py::test_a", "tests/t.py::test_b", "tests/t.py::test_c[x - y]", "tests/t.py::test_d"]
    assert parse_outcomes(output, ids) == {"tests/t.py::test_a": "PASSED", "tests/t.py::test_b": "FAILED",
                                           "tests/t.py::test_c[x - y]": "PASSED", "tests/t.py::test_d": "ERROR"}
    assert "tests/t.py::test_c[x" in parse_outcomes(output)  # without the ids asked for, " - " ends an id
    assert parse_outcomes("PASSED tests/t.py::test_a\n") == {}  # no summary section: nothing counts


@needs_sandbox
def test_the_validation_command_accepts_every_bundled_task():
    done = subprocess.run([sys.executable, "-m", "envs.swe.validate"], cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert sorted(lines[:-1]) == sorted(f"ok {r['instance_id']}" for r in ROWS)
    assert lines[-1] == "all tasks valid"


@needs_sandbox
def test_validation_rejects_wrong_lists_and_tests_that_do_not_catch_the_bug(tmp_path: Path):
    task = load_tasks()[0]
    f2p, p2p = task.fail_to_pass[0], task.pass_to_pass[0]
    swapped = dataclasses.replace(task, fail_to_pass=(p2p,), pass_to_pass=(f2p, *task.pass_to_pass[1:]))
    problems = validate(swapped)
    assert f"stored FAIL_TO_PASS lacks {f2p}" in problems
    assert any(p.startswith(f"stored PASS_TO_PASS has {f2p}") and "do not pass both ways" in p for p in problems)
    # a test_patch whose test passes with the bug too: nothing fails before the fix
    weak = dataclasses.replace(task, test_patch=task.test_patch.replace('max_length=6) == "hello"',
                                                                        'max_length=6) in ("hello", "hello-")')
                               .replace('max_length=4) == "a_b"', 'max_length=4) in ("a_b", "a_b_")'))
    assert weak.test_patch != task.test_patch
    assert "FAIL_TO_PASS is empty: no test fails with the bug and passes with the fix" in validate(weak)

    file = tmp_path / "bad.jsonl"
    file.write_text(json.dumps(row(FAIL_TO_PASS=json.dumps([p2p]))) + "\n")
    done = subprocess.run([sys.executable, "-m", "envs.swe.validate", "--tasks", str(file)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and done.stdout.startswith("REJECTED slugkit-1\n")
    assert done.stdout.splitlines()[-1] == "1 of the tasks rejected"


def test_the_docker_commands_for_a_swe_bench_row_are_pinned(tmp_path: Path):
    image = "swebench/sweb.eval.x86_64.slugkit-1:latest"
    task = parse_row(row(repo_dir=None, image_name=image))
    limits = SandboxLimits(memory_mb=4096, max_processes=128, file_size_mb=64, cpu_s=900, tmp_mb=32)
    argv = episode_command(task, tmp_path, "python -m pytest -q", limits, name="swe-episode-1")

    def value(option: str) -> list[str]:
        return [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == option]

    at = argv.index(image)
    assert argv[:2] == ["docker", "run"] and "--rm" in argv[:at] and "--read-only" in argv[:at]
    assert argv[at:] == [image, "/bin/bash", "-c", "python -m pytest -q"]
    assert value("--network") == ["none"] and value("--name") == ["swe-episode-1"]
    assert value("--mount") == [f"type=bind,source={tmp_path.resolve()},target=/testbed"]
    assert value("--workdir") == ["/testbed"]
    assert value("--memory") == ["4096m"] and value("--memory-swap") == ["4096m"] and value("--pids-limit") == ["128"]
    assert sorted(value("--ulimit")) == ["core=0", "cpu=900:901", f"fsize={64 << 20}"]
    assert value("--cap-drop") == ["ALL"] and value("--user") == ["65534:65534"]
    assert value("--tmpfs") == ["/tmp:rw,nosuid,nodev,size=32m"]
    env = dict(e.split("=", 1) for e in value("--env"))
    assert env["PATH"].startswith("/opt/miniconda3/envs/testbed/bin:") and set(env) == {"PATH", "HOME", "LANG", "TERM"}
    assert not any(a.startswith(("-v", "--volume", "--privileged", "--env-file")) for a in argv[:at])
    assert export_commands(task, tmp_path, "swe-export-1") == [
        ["docker", "create", "--name", "swe-export-1", "--network", "none", image, "true"],
        ["docker", "cp", "swe-export-1:/testbed/.", str(tmp_path.resolve())],
        ["docker", "rm", "--force", "swe-export-1"]]
    with pytest.raises(TaskFormatError, match="no 'image_name'"):
        episode_command(load_tasks()[0], tmp_path, "true")
