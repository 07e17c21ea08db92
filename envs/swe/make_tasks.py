"""Write tasks.jsonl from bugs.yaml: SWE-smith-style bug injection into the bundled repositories.

    python -m envs.swe.make_tasks            # rewrites envs/swe/tasks.jsonl

For each bug of bugs.yaml: `bug_patch` replaces the `correct` text of `file` with the `buggy` text,
the gold `patch` is its reverse, `test_patch` appends `tests` to `test_file`, `base_commit` is the
commit `envs.swe.tasks.build_base` makes, and FAIL_TO_PASS / PASS_TO_PASS come from running the suite
with the bug and with the fix in the sandbox (`envs.swe.validate.derive`). A bug whose lists come
out unusable stops the run.
"""
from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import yaml

from envs.swe.tasks import BUNDLED_TASKS, COPY_IGNORE, SweTask, build_base, commit_tree, git
from envs.swe.validate import derive

SPEC = Path(__file__).with_name("bugs.yaml")
REPOS = Path(__file__).with_name("repos")


def _diff_of_edit(repo: Path, path: str, edit) -> tuple[str, str]:
    """(diff, reverse diff) of changing `path` in the committed `repo` with `edit(text) -> text`."""
    target = repo / path
    original = target.read_text()
    target.write_text(edit(original))
    # -R swaps the prefixes too: these give the reverse diff the usual a/ and b/
    diffs = (git(["diff", "--no-color"], repo),
             git(["diff", "-R", "--no-color", "--src-prefix=b/", "--dst-prefix=a/"], repo))
    target.write_text(original)
    return diffs


def _replace_once(bug: dict):
    def edit(text: str) -> str:
        if text.count(bug["correct"]) != 1:
            raise ValueError(f"{bug['id']}: the 'correct' text occurs {text.count(bug['correct'])} times in "
                             f"{bug['file']}, not once")
        return text.replace(bug["correct"], bug["buggy"])
    return edit


def make_row(bug: dict, scratch: Path) -> dict:
    """The task row of one bug of bugs.yaml (lists still empty)."""
    work = scratch / bug["id"]
    shutil.copytree(REPOS / bug["repo"], work, ignore=COPY_IGNORE)
    commit_tree(work)
    bug_patch, patch = _diff_of_edit(work, bug["file"], _replace_once(bug))
    test_patch, _ = _diff_of_edit(work, bug["test_file"], lambda text: text + bug["tests"])
    base_commit = build_base(REPOS / bug["repo"], bug_patch, scratch / f"{bug['id']}-base")
    return {"instance_id": bug["id"], "repo": f"clawr1/{bug['repo']}", "base_commit": base_commit,
            "problem_statement": bug["problem_statement"], "patch": patch, "test_patch": test_patch,
            "FAIL_TO_PASS": "[]", "PASS_TO_PASS": "[]", "repo_dir": f"repos/{bug['repo']}", "bug_patch": bug_patch}


def fill_lists(row: dict) -> dict:
    """The row with FAIL_TO_PASS and PASS_TO_PASS derived in the sandbox (JSON strings, as SWE-bench writes them)."""
    task = SweTask(row["instance_id"], row["repo"], row["base_commit"], row["problem_statement"], row["patch"],
                   row["test_patch"], (), (), repo_dir=REPOS / row["repo"].split("/")[1], bug_patch=row["bug_patch"])
    derived = derive(task)
    if derived.problems:
        raise ValueError(f"{row['instance_id']}: {'; '.join(derived.problems)}")
    return {**row, "FAIL_TO_PASS": json.dumps(derived.fail_to_pass), "PASS_TO_PASS": json.dumps(derived.pass_to_pass)}


def main() -> None:
    bugs = yaml.safe_load(SPEC.read_text())
    with tempfile.TemporaryDirectory() as scratch:
        rows = [fill_lists(make_row(bug, Path(scratch))) for bug in bugs]
    BUNDLED_TASKS.write_text("".join(json.dumps(row) + "\n" for row in rows))
    print(f"wrote {len(rows)} tasks to {BUNDLED_TASKS.name}")


if __name__ == "__main__":
    main()
