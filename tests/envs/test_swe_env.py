"""The SWE environment in a real sandbox: calibration, grading that tampering cannot fool, tools, containment.

Every episode plays a bundled task (a real repository, real git, the sandbox toolchain's real pytest)
with a scripted agent: the oracle applies the gold patch through the bash tool, the null agent submits
at once, and tampering agents try to get a pass without the fix.
"""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from clawr1.agent_bench import load_environment
from clawr1.environment import AssistantTurn, TaskEnvironment
from envs.agentic.agent import ScriptedAgent, call_turn
from envs.agentic.sandbox import available_backends
from envs.swe import env as swe_env
from envs.swe.env import SweEnv, SweWorld, oracle_command
from envs.swe.grading import grade_patch
from envs.swe.tasks import SweTask
from envs.swe.text_mode import FORMAT_REMINDER, SUBMIT_COMMAND, parse_command, text_turn
from tests.conftest import REPO
from tests.envs.test_terminal_env import SUBMIT, bash, play, processes_with, script, write  # the same helpers

pytestmark = pytest.mark.skipif(not available_backends(), reason="no isolating sandbox backend (bwrap, unshare) "
                                                                 "works on this machine")


@pytest.fixture(scope="module")
def env() -> SweEnv:
    return SweEnv({})


def by_id(env: SweEnv, task_id: str) -> SweTask:
    return next(t for t in env.tasks() if t.id == task_id)


SLUG = "slugkit-1"  # FAIL_TO_PASS: tests/test_text.py::test_slugify_max_length_never_ends_with_separator
SLUG_FIX = ("slugkit/text.py", "        slug = slug[:max_length]\n",  # path, old_str, new_str: the gold fix
            "        slug = slug[:max_length].rstrip(separator)\n")


def replace(path: str, old: str, new: str) -> AssistantTurn:
    return call_turn([("str_replace", {"path": path, "old_str": old, "new_str": new})])


def test_it_is_a_task_environment_found_by_bench(env: SweEnv):
    found = load_environment("envs/swe", {})
    assert isinstance(found, TaskEnvironment) and isinstance(found, SweEnv)
    assert [t.id for t in found.tasks()] == [t.id for t in env.tasks()]
    assert found.describe()["tasks"] == "bundled (envs/swe/tasks.jsonl)"
    with pytest.raises(ValueError, match="swe env: unknown arg"):
        SweEnv({"nonsense": 1})


def test_oracle_resolves_and_null_fails_every_bundled_task(env: SweEnv):
    tasks = env.tasks()
    oracle, null = env.scripted_agent("oracle"), env.scripted_agent("null")
    resolved = play(env, oracle, tasks, "oracle", side=False)
    unresolved = play(env, null, tasks, "null", side=False)
    assert [r.passed for r in resolved] == [True] * 12, [r.details for r in resolved if not r.passed]
    assert [r.passed for r in unresolved] == [False] * 12
    assert sorted(oracle.outcomes.values()) == [1.0] * 12 and sorted(null.outcomes.values()) == [-1.0] * 12
    for task, result in zip(tasks, resolved):
        assert result.details["FAIL_TO_PASS"] == {t: "PASSED" for t in task.fail_to_pass}
        assert result.details["PASS_TO_PASS"] == {t: "PASSED" for t in task.pass_to_pass}
        assert (result.turns, result.tool_calls, result.tool_errors) == (2, 2, 0)
    assert {r.details["reason"] for r in unresolved} == {"empty diff"}


def test_the_bench_command_reports_the_resolved_rate(tmp_path: Path):
    def bench(agent: str) -> dict:
        done = subprocess.run([sys.executable, "-m", "clawr1.cli", "bench", "envs/swe", "--agent", agent, "--out",
                               str(tmp_path / agent)], cwd=REPO, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    oracle, null = bench("oracle"), bench("null")
    assert (oracle["tasks"], oracle["resolved_rate"], oracle["pass@1"], oracle["failed"], oracle["mean_turns"]) == \
        (12, 1.0, 1.0, 0, 2.0)
    assert (null["resolved_rate"], null["pass@1"], null["failed"], null["mean_turns"]) == (0.0, 0.0, 12, 1.0)
    report = (tmp_path / "oracle.md").read_text()
    assert "| slugkit-1 | clawr1/slugkit | 1/1 | 2.0 | 0 |" in report


# --- tampering: the tests decide, not the agent ---

F2P_FILE = "tests/test_text.py"
FAKE_TESTS = "def test_slugify_max_length_never_ends_with_separator():\n    pass\n"
ALWAYS_PASS_CONFTEST = """\
import pytest

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    report.outcome = "passed"
"""
FAKE_PYTEST = ("import sys\nfor a in sys.argv[1:]:\n    print('PASSED', a)\n"
               "print('=== short test summary info ===')\nfor a in sys.argv[1:]:\n    print('PASSED', a)\n")

TAMPERS = {
    "edit the test file": [write(F2P_FILE, FAKE_TESTS)],
    "delete the tests": [bash("rm -rf tests")],
    "a conftest that passes everything": [write("conftest.py", ALWAYS_PASS_CONFTEST),
                                          write("tests/conftest.py", ALWAYS_PASS_CONFTEST)],
    "a fake pytest module": [write("pytest.py", FAKE_PYTEST),
                             bash("mkdir -p _pytest && cp pytest.py _pytest/main.py")],
    "break git": [bash("rm -rf .git")],
}


@pytest.mark.parametrize("name", list(TAMPERS))
def test_tampering_is_not_resolved(env: SweEnv, name: str):
    result = play(env, script(*TAMPERS[name], SUBMIT), [by_id(env, SLUG)])[0]
    assert not result.passed and result.reward == -1.0, result.details
    if name != "break git":
        f2p = result.details["FAIL_TO_PASS"]
        assert f2p == {"tests/test_text.py::test_slugify_max_length_never_ends_with_separator": "FAILED"}


def test_a_real_fix_counts_even_when_the_agent_also_edits_the_tests(env: SweEnv):
    agent = script(replace(*SLUG_FIX), write(F2P_FILE, FAKE_TESTS), write("conftest.py", ALWAYS_PASS_CONFTEST),
                   SUBMIT)
    result = play(env, agent, [by_id(env, SLUG)])[0]
    assert result.passed and result.reward == 1.0, result.details


def test_a_fix_that_breaks_a_pass_to_pass_test_is_not_resolved(env: SweEnv):
    task = by_id(env, SLUG)
    breaks_wrap = replace("slugkit/text.py", "    if current:\n        lines.append(current)\n", "")
    result = play(env, script(replace(*SLUG_FIX), breaks_wrap, SUBMIT), [task])[0]
    assert not result.passed and result.reward == -1.0
    assert set(result.details["FAIL_TO_PASS"].values()) == {"PASSED"}  # the issue itself is fixed
    broken = {t for t, s in result.details["PASS_TO_PASS"].items() if s != "PASSED"}
    assert broken == {"tests/test_text.py::test_wrap_basic", "tests/test_text.py::test_wrap_long_word"}
    assert result.details["failing_tests"] == sorted(broken)


def test_an_empty_or_non_applying_diff_is_not_resolved(env: SweEnv):
    task = by_id(env, SLUG)
    assert grade_patch(task, "").reason == "empty diff"
    stale = task.patch.replace("slug = slug[:max_length]\n", "slug = something_else\n")
    report = grade_patch(task, stale)
    assert not report.resolved and report.reason.startswith("the diff does not apply")
    assert set(report.fail_to_pass.values()) == {"NOT_RUN"}
    assert grade_patch(task, task.patch).resolved


def test_the_judge_is_told_the_failing_tests(env: SweEnv):
    agent = script(bash("echo '# touched' >> slugkit/text.py"), SUBMIT)
    result = play(env, agent, [by_id(env, SLUG)], side=False)[0]
    assert not result.passed
    assert agent.outcomes == {"s-0": -1.0}
    with SweWorld(by_id(env, SLUG), env.cfg) as world:
        world.call("bash", json.dumps({"command": "echo '# touched' >> slugkit/text.py"}))
        feedback = world.grade([]).feedback
    assert feedback == ("not resolved: failing tests: "
                        "tests/test_text.py::test_slugify_max_length_never_ends_with_separator")


# --- tools ---

@pytest.fixture
def world(env: SweEnv):
    with SweWorld(by_id(env, SLUG), env.cfg) as w:
        yield w


def call(world: SweWorld, name: str, **args) -> dict:
    return json.loads(world.call(name, json.dumps(args)).message_content())


def test_str_replace_refuses_missing_and_repeated_text(world: SweWorld):
    before = world.sandbox.read_file("slugkit/text.py")
    missing = call(world, "str_replace", path="slugkit/text.py", old_str="no such text", new_str="x")
    assert missing == {"ok": False, "error": "str_replace: old_str does not occur in slugkit/text.py; "
                                             "nothing was changed", "output": ""}
    repeated = call(world, "str_replace", path="slugkit/text.py", old_str="return", new_str="yield")
    assert not repeated["ok"] and repeated["error"].startswith(
        f"str_replace: old_str occurs {before.count('return')} times in slugkit/text.py; include more")
    empty = call(world, "str_replace", path="slugkit/text.py", old_str="", new_str="x")
    assert empty["error"] == "str_replace: old_str is empty"
    absent = call(world, "str_replace", path="nope.py", old_str="a", new_str="b")
    assert absent["error"] == "str_replace: no such file 'nope.py'"
    assert world.sandbox.read_file("slugkit/text.py") == before  # nothing was written
    done = call(world, "str_replace", path="slugkit/text.py", old_str=SLUG_FIX[1], new_str=SLUG_FIX[2])
    assert done == {"ok": True, "output": "replaced the text at line 16 of slugkit/text.py"}
    assert world.sandbox.read_file("slugkit/text.py") == before.replace(SLUG_FIX[1], SLUG_FIX[2])


def test_read_file_shows_numbered_line_ranges(world: SweWorld):
    lines = world.sandbox.read_file("slugkit/text.py").splitlines()
    shown = call(world, "read_file", path="slugkit/text.py", start_line=2, end_line=3)
    assert shown == {"ok": True, "output": f"     2\t{lines[1]}\n     3\t{lines[2]}\n"}
    whole = call(world, "read_file", path="/workspace/slugkit/text.py")["output"]
    assert whole.count("\n") == len(lines) and whole.startswith('     1\t"""Text helpers.')
    assert call(world, "read_file", path="slugkit/text.py", start_line=500)["error"].startswith(
        "read_file: lines 500 to")
    assert call(world, "read_file", path="slugkit/text.py", start_line="2")["error"] == \
        "read_file: argument start_line must be an integer"
    assert call(world, "read_file")["error"].startswith("read_file: missing argument(s) path")
    assert call(world, "read_file", path="../../etc/passwd")["ok"] is False


def test_bash_and_write_file_work_in_the_repository(world: SweWorld):
    assert call(world, "write_file", path="NOTES.md", content="hi\n") == {"ok": True,
                                                                         "output": "wrote 3 bytes to NOTES.md"}
    status = call(world, "bash", command="git status --porcelain && git log --format=%s && pwd")
    assert status == {"ok": True, "exit_code": 0, "output": "?? NOTES.md\nbase\n/workspace\n"}
    tests = call(world, "bash", command="python3 -m pytest -q -p no:cacheprovider tests 2>&1 | tail -1")
    # every test but the bug's hidden one, which is not there yet
    assert tests["output"].startswith(f"{len(world.task.pass_to_pass)} passed")
    assert call(world, "frobnicate")["error"].startswith("unknown tool 'frobnicate'")


def test_the_oracle_command_is_a_quoted_here_document():
    command = oracle_command("diff --git a/x b/x\n+$(touch pwned)\n")
    assert command.startswith("git apply --whitespace=nowarn - <<'CLAWR1_GOLD_PATCH_END'\n")
    assert command.endswith("+$(touch pwned)\nCLAWR1_GOLD_PATCH_END\n")
    with pytest.raises(ValueError, match="end marker"):
        oracle_command("a\nCLAWR1_GOLD_PATCH_END\nb\n")


# --- containment: a hostile patch in an SWE episode ---

def test_a_hostile_patch_is_contained(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    env = SweEnv({"command_timeout_s": 5, "test_timeout_s": 20, "max_processes": 64, "memory_mb": 512})
    tag = f"swe-hostile-{uuid.uuid4().hex}"
    secret = tmp_path / "secret.txt"
    secret.write_text(f"TOPSECRET-{tag}")
    monkeypatch.setenv("OPENAI_API_KEY", f"sk-{tag}")
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    # The patch's code runs at import: through bash during the episode, and in the grading sandbox.
    hostile = (f"import os, socket, subprocess\n"
               f"for probe in (lambda: socket.create_connection(('127.0.0.1', {port}), timeout=2),\n"
               f"              lambda: open({str(secret)!r}).read(),\n"
               f"              lambda: os.environ['OPENAI_API_KEY']):\n"
               f"    try:\n        print('LEAK', probe(), flush=True)\n    except Exception as e:\n"
               f"        print('blocked', type(e).__name__, flush=True)\n"
               f"subprocess.Popen(['bash', '-c', 'bomb() {{ bomb | bomb & }}; bomb; sleep 60 # {tag}'])\n")
    started = time.monotonic()
    try:
        with SweWorld(by_id(env, SLUG), env.cfg) as world:
            patched = call(world, "str_replace", path="slugkit/__init__.py", old_str='"""slugkit:',
                           new_str=hostile + '"""slugkit:')
            ran = call(world, "bash", command=f"python3 -c 'import slugkit'; sleep 30 # {tag}")
            grade = world.grade([])
        with pytest.raises(BlockingIOError):  # nothing ever reached the host's listener
            listener.accept()
    finally:
        listener.close()
    assert patched["ok"]
    probes = ran["output"].splitlines()[:3]  # bwrap's own loopback refuses; unshare's is down
    assert probes[0] in ("blocked ConnectionRefusedError", "blocked OSError")
    assert probes[1:] == ["blocked FileNotFoundError", "blocked KeyError"]
    assert ran["timed_out"] and "LEAK" not in ran["output"]
    assert not grade.passed and grade.reward == -1.0
    assert set(grade.details["PASS_TO_PASS"].values()) == {"PASSED"}  # the patched package still imports
    assert f"TOPSECRET-{tag}" not in json.dumps(grade.details) and f"sk-{tag}" not in json.dumps(grade.details)
    assert processes_with(tag) == []
    assert time.monotonic() - started < 90


def test_episodes_leave_no_sandbox_behind(env: SweEnv, monkeypatch: pytest.MonkeyPatch):
    made = []
    real = swe_env.Sandbox

    def recorded(*args, **kwargs):
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(swe_env, "Sandbox", recorded)
    play(env, env.scripted_agent("oracle"), [by_id(env, SLUG)])
    assert made and all(not s.workspace_path.parent.exists() for s in made)


# --- text mode (mini-swe-agent's format) ---

class Recording(ScriptedAgent):
    """A scripted agent that keeps the messages and tools of every chat call."""

    def __init__(self, turns: list[AssistantTurn]):
        super().__init__(lambda task_id: turns)
        self.seen: list[tuple[list[dict], object]] = []

    async def chat(self, session_id, messages, *, tools=None, **kw) -> AssistantTurn:
        self.seen.append(([dict(m) for m in messages], tools))
        return await super().chat(session_id, messages, tools=tools, **kw)


def test_text_mode_plays_one_bash_block_per_turn_until_the_sentinel():
    env = SweEnv({"mode": "text"})
    task = by_id(env, SLUG)
    fix = f"sed -i 's/slug = slug\\[:max_length\\]$/slug = slug[:max_length].rstrip(separator)/' {SLUG_FIX[0]}"
    agent = Recording([AssistantTurn("I will look first."),  # no block: a format reminder
                       AssistantTurn("two\n```bash\nls\n```\n```bash\npwd\n```"),  # two blocks: another
                       text_turn(fix, "Fix it."), text_turn(SUBMIT_COMMAND), text_turn("echo never reached")])
    result = play(env, agent, [task], side=False)[0]
    assert result.passed and agent.outcomes == {"s-0": 1.0}, result.details
    assert (result.turns, result.tool_calls, result.tool_errors) == (4, 2, 2)
    messages, tools = agent.seen[-1]
    assert tools is None and messages[0]["content"].startswith("You are a software engineer")
    assert SUBMIT_COMMAND in messages[0]["content"] and task.problem_statement in messages[1]["content"]
    assert [m["role"] for m in messages] == ["system", "user"] + ["assistant", "user"] * 3
    assert messages[3]["content"] == FORMAT_REMINDER.format(found=0)
    assert messages[5]["content"] == FORMAT_REMINDER.format(found=2)
    assert json.loads(messages[7]["content"]) == {"ok": True, "exit_code": 0, "output": ""}


def test_text_mode_oracle_and_null_calibrate(tmp_path: Path):
    env = SweEnv({"mode": "text"})
    tasks = [by_id(env, "spans-1"), by_id(env, "tinystats-2")]
    assert [r.passed for r in play(env, env.scripted_agent("oracle"), tasks)] == [True, True]
    assert [r.passed for r in play(env, env.scripted_agent("null"), tasks)] == [False, False]
    assert parse_command("Thought.\n```bash\n  git diff\n```\n") == "git diff"
    with pytest.raises(ValueError, match="mode must be one of tools, text"):
        SweEnv({"mode": "chat"})


def test_file_tools_name_themselves_in_path_errors(world: SweWorld):
    assert call(world, "read_file", path="/etc/passwd")["error"] == \
        "read_file: path must be a file in /workspace, relative to it, got '/etc/passwd'"
    assert call(world, "str_replace", path="", old_str="a", new_str="b")["error"].startswith("str_replace: path must")
