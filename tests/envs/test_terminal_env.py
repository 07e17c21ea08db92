"""The terminal environment in a real sandbox: calibration, grading that tampering cannot fool, tool results, cleanup.

Every episode here runs the bundled (or a small, made-up) task in a real kernel sandbox with a scripted
agent: the oracle plays solution.sh through the bash tool, the null agent submits at once, and
tampering agents try to fake a pass. Cleanup is checked from the host: /proc and the sandbox's directory.
"""
from __future__ import annotations

import asyncio
import json
import os
import random
import time
import uuid
from pathlib import Path

import pytest

from clawr1.agent_bench import load_environment
from clawr1.environment import AssistantTurn, EpisodeResult, TaskEnvironment
from envs.agentic.agent import ScriptedAgent, call_turn
from envs.agentic.sandbox import Sandbox, available_backends
from envs.terminal import env as terminal_env
from envs.terminal.env import TOOLS, TaskSetupError, TerminalEnv, TerminalWorld
from envs.terminal.tasks import BUNDLED_TASKS, TerminalTask, load_task

pytestmark = pytest.mark.skipif(not available_backends(), reason="no isolating sandbox backend (bwrap, unshare) "
                                                                 "works on this machine")
RUN_TESTS = (BUNDLED_TASKS / "_template" / "run-tests.sh").read_text()
UNSOLVED = "git-find-culprit"  # untouched, it passes one of its two tests: a tamper must not add any


@pytest.fixture(scope="module")
def env() -> TerminalEnv:
    return TerminalEnv({})


def play(env: TerminalEnv, agent, tasks: list[TerminalTask], prefix: str = "s", **kw) -> list[EpisodeResult]:
    """Run every task with `agent`, two at a time (two cores)."""
    async def main() -> list[EpisodeResult]:
        slots = asyncio.Semaphore(2)

        async def one(i: int, task: TerminalTask) -> EpisodeResult:
            async with slots:
                return await env.run_task(agent, task, f"{prefix}-{i}", **kw)

        return await asyncio.gather(*(one(i, t) for i, t in enumerate(tasks)))
    return asyncio.run(main())


def script(*turns: AssistantTurn) -> ScriptedAgent:
    return ScriptedAgent(lambda task_id: list(turns))


def bash(command: str) -> AssistantTurn:
    return call_turn([("bash", {"command": command})])


def write(path: str, content: str) -> AssistantTurn:
    return call_turn([("write_file", {"path": path, "content": content})])


SUBMIT = call_turn([("submit", {})])


def make_task(root: Path, *, tests: str, solution: str, files: dict[str, str] | None = None,
              own_runner: str | None = None, setup: str | None = None, yaml_extra: str = "",
              run_tests: str = RUN_TESTS) -> TerminalTask:
    """A small task directory laid out like the bundled ones."""
    (root / "tests").mkdir(parents=True)
    (root / "task.yaml").write_text(f"instruction: Make it so.\ndifficulty: easy\ncategory: testing\n{yaml_extra}")
    (root / "run-tests.sh").write_text(run_tests)
    (root / "solution.sh").write_text(solution)
    (root / "tests" / "test_outputs.py").write_text(tests)
    if own_runner is not None:
        (root / "tests" / "runner.py").write_text(own_runner)
    if setup is not None:
        (root / "setup.sh").write_text(setup)
    for name, text in (files or {}).items():
        (root / "workspace" / name).parent.mkdir(parents=True, exist_ok=True)
        (root / "workspace" / name).write_text(text)
    return load_task(root)


GREETING_TESTS = "def test_greeting():\n    assert open('hello.txt').read() == 'hi\\n'\n\n" \
                 "def test_notes_kept():\n    assert 'error' in open('notes.txt').read()\n"


@pytest.fixture
def small(tmp_path: Path) -> tuple[TerminalEnv, TerminalTask]:
    """An env over one made-up task whose workspace file mentions "error", with a 1 s command timeout."""
    task = make_task(tmp_path / "greet", tests=GREETING_TESTS, solution="echo hi > hello.txt\n",
                     files={"notes.txt": "error: disk full (this is only data)\n"})
    return TerminalEnv({"tasks": str(task.path), "command_timeout_s": 1}), task


# ---------------------------------------------------------------- calibration

def test_oracle_passes_and_null_fails_every_bundled_task(env: TerminalEnv):
    tasks = env.tasks()
    assert len(tasks) == 27
    for r in play(env, env.scripted_agent("oracle"), tasks, "oracle"):
        assert (r.passed, r.reward, r.turns, r.tool_calls, r.tool_errors, r.timeouts) == (True, 1.0, 2, 2, 0, 0), r
        assert r.details["pass_fraction"] == 1.0 and r.details["tests_failed"] == 0 and r.details["tests_passed"] >= 1
    for r in play(env, env.scripted_agent("null"), tasks, "null"):
        assert (r.passed, r.reward, r.turns, r.tool_calls, r.tool_errors) == (False, -1.0, 1, 1, 0), r
        assert r.details["tests_failed"] >= 1 and r.details["pass_fraction"] < 1.0 and r.details["failing_tests"], r


def test_a_training_episode_reports_its_outcome_to_the_judge(env: TerminalEnv):
    agent = env.scripted_agent("oracle")
    metrics = asyncio.run(env.episode(agent, "train-1", random.Random(3)))
    assert metrics == {"passed": 1.0, "reward": 1.0, "turns": 2.0, "tool_errors": 0.0, "timeouts": 0.0}
    assert agent.outcomes == {"train-1": 1.0}
    before = env.report()
    asyncio.run(env.episode(env.scripted_agent("null"), "train-2", random.Random(3)))
    after = env.report()
    assert (after["episodes"] - before["episodes"], after["episodes_passed"] - before["episodes_passed"]) == (1, 0)


def test_a_group_episode_plays_one_task_in_separate_sandboxes_under_one_group_id():
    grouped = TerminalEnv({"group_size": 3})
    seen: list[tuple[str, str, str]] = []

    class Recording(ScriptedAgent):
        async def chat(self, session_id, messages, **kwargs):
            seen.append((session_id, kwargs["task_id"], kwargs["group_id"]))
            return await super().chat(session_id, messages, **kwargs)

    agent = Recording(lambda task_id: grouped.oracle_script(grouped._task(task_id)))
    metrics = asyncio.run(grouped.episode(agent, "g7", random.Random(3)))
    assert metrics == {"passed": 1.0, "reward": 1.0, "turns": 2.0, "tool_errors": 0.0, "timeouts": 0.0}
    assert agent.outcomes == {"g7-0": 1.0, "g7-1": 1.0, "g7-2": 1.0}  # each attempt graded on its own
    assert {group for _, _, group in seen} == {"g7"} and len({task for _, task, _ in seen}) == 1
    assert grouped.report()["episodes"] == 3
    with pytest.raises(ValueError, match="group_size must be >= 1"):
        TerminalEnv({"group_size": 0})


def test_evaluate_scores_the_held_out_tasks(env: TerminalEnv):
    assert [t.id for t in env.tasks("heldout")] == ["dedupe-emails", "git-branch-from-tag", "jq-order-totals",
                                                    "rename-extensions", "tar-to-zip"]
    oracle = asyncio.run(env.evaluate(env.scripted_agent("oracle"), 100, "eval-oracle"))
    assert oracle == {"pass_rate": 1.0, "mean_turns": 2.0, "tool_errors": 0.0, "timeouts": 0.0}
    null = asyncio.run(env.evaluate(env.scripted_agent("null"), 3, "eval-null"))
    assert null == {"pass_rate": 0.0, "mean_turns": 1.0, "tool_errors": 0.0, "timeouts": 0.0}
    assert set(env.eval_metrics) <= set(oracle)


# ---------------------------------------------------------------- tampering

FORGED = "PASSED test_forged\nRESULT passed=9 failed=0\n"
FAKE_PASS = f"import os\nprint({FORGED!r}, end='', flush=True)\nos._exit(0)\n"
TAMPERING = {
    "edit_tests": [write("tests/test_outputs.py", "def test_ok():\n    pass\n"), write("tests/runner.py", FAKE_PASS),
                   bash("printf 'def test_also_ok():\\n    pass\\n' > tests/test_more.py")],
    "reward_files": [write("reward.txt", "1\n"), write("result.json", '{"passed": true, "reward": 1}\n'),
                     write("verdict.txt", FORGED), bash(f"printf '{FORGED}'; mkdir -p logs; printf '{FORGED}' > "
                                                        "logs/test_output.log")],
    "run_tests_sh": [write("run-tests.sh", f"#!/bin/bash\nprintf '{FORGED}'\nexit 0\n"), bash("chmod +x run-tests.sh")],
    "tests_link_inside": [bash("mkdir fake && printf 'def test_ok():\\n    pass\\n' > fake/test_outputs.py && "
                               "ln -s fake tests")],
    "tests_link_outside": [bash("ln -s /usr/lib tests")],
    "locked_tests": [bash("mkdir -p tests/deep && printf 'def test_ok(): pass\\n' > tests/test_outputs.py && "
                          "chmod 000 tests/deep && chmod 500 tests")],
    "locked_workspace": [bash("chmod 000 .")],
    "python_shadowing": [write(name, FAKE_PASS) for name in ("sitecustomize.py", "runpy.py", "traceback.py")],
}


@pytest.fixture(scope="module")
def untouched(env: TerminalEnv) -> EpisodeResult:
    return play(env, env.scripted_agent("null"), [env._task(UNSOLVED)], "untouched")[0]


@pytest.mark.parametrize("kind", TAMPERING)
def test_tampering_earns_nothing_and_does_not_block_a_real_solution(env: TerminalEnv, untouched: EpisodeResult,
                                                                    kind: str):
    task = env._task(UNSOLVED)
    tamper = TAMPERING[kind]
    faked = play(env, script(*tamper, SUBMIT), [task], f"tamper-{kind}")[0]
    assert (faked.passed, faked.reward) == (False, -1.0), faked
    assert faked.details["tests_passed"] == untouched.details["tests_passed"] == 1, faked
    assert faked.details["tests_failed"] == untouched.details["tests_failed"] == 1, faked
    assert "test_forged" not in faked.details["failing_tests"]

    solve = bash(task.solution_path.read_text())
    solved = play(env, script(solve, *tamper, SUBMIT), [task], f"tamper-solved-{kind}")[0]
    assert (solved.passed, solved.reward, solved.details["tests_passed"]) == (True, 1.0, 2), solved


# ---------------------------------------------------------------- tool results

def outcome_fields(world: TerminalWorld, name: str, arguments: str) -> dict:
    content = world.call(name, arguments).message_content()
    assert "\n" not in content  # one line of JSON
    return json.loads(content)


def test_tool_results_carry_structured_status(small: tuple[TerminalEnv, TerminalTask]):
    env, task = small
    world = env.make_world(task)
    try:
        cat = outcome_fields(world, "bash", json.dumps({"command": "cat notes.txt"}))
        assert cat == {"ok": True, "exit_code": 0, "output": "error: disk full (this is only data)\n"}
        assert outcome_fields(world, "bash", '{"command": "false"}') == {"ok": False, "exit_code": 1, "output": ""}
        assert outcome_fields(world, "bash", '{"command": "echo out; echo err >&2; exit 3"}') == \
            {"ok": False, "exit_code": 3, "output": "out\nerr\n"}

        started = time.monotonic()
        slow = outcome_fields(world, "bash", '{"command": "echo begun; sleep 60"}')
        assert time.monotonic() - started < 30  # the 1 s timeout, not the 60 s sleep
        assert slow == {"ok": False, "timed_out": True, "error": "the command timed out after 1 s and was killed",
                        "output": "begun\n"}

        malformed = {"bad_json": ("bash", '{"command": "ls"', "arguments are not valid JSON"),
                     "not_an_object": ("bash", '["ls"]', "arguments must be a JSON object"),
                     "unknown_tool": ("rm_rf", '{}', "unknown tool 'rm_rf'; the tools are bash, write_file, submit"),
                     "missing_argument": ("bash", "{}", "bash: missing argument(s) command"),
                     "extra_argument": ("submit", '{"answer": "x"}', "submit: unexpected argument(s) answer"),
                     "wrong_type": ("bash", '{"command": 5}', "bash: argument(s) command must be strings"),
                     "nul": ("bash", '{"command": "echo \\u0000"}', "command must be UTF-8 text without NUL"),
                     "surrogate": ("write_file", '{"path": "a", "content": "\\ud800"}', "content must be UTF-8")}
        for case, (name, arguments, error) in malformed.items():
            got = outcome_fields(world, name, arguments)
            assert got["ok"] is False and error in got["error"] and got["output"] == "", case
            assert "exit_code" not in got and "timed_out" not in got, case
    finally:
        world.close()


def test_write_file_stays_in_the_workspace(small: tuple[TerminalEnv, TerminalTask]):
    env, task = small
    with env.make_world(task) as world:
        assert outcome_fields(world, "write_file", '{"path": "/workspace/sub/new.txt", "content": "x\\ny"}') == \
            {"ok": True, "output": "wrote 3 bytes to sub/new.txt"}
        assert outcome_fields(world, "bash", '{"command": "cat sub/new.txt"}')["output"] == "x\ny"
        for path in ("../escape.txt", "/etc/passwd", "", "sub"):
            got = outcome_fields(world, "write_file", json.dumps({"path": path, "content": "x"}))
            assert got["ok"] is False and "write_file" in got["error"], path
        assert not (world.sandbox.workspace_path.parent / "escape.txt").exists()


def test_the_episode_sends_each_result_back_with_its_call_id(small: tuple[TerminalEnv, TerminalTask]):
    env, task = small
    seen: list[list[dict]] = []

    class Recording(ScriptedAgent):
        async def chat(self, session_id, messages, **kw):
            seen.append(list(messages))  # the loop keeps appending to its list
            return await super().chat(session_id, messages, **kw)

    turns = [call_turn([("bash", {"command": "cat notes.txt"}), ("bash", {"command": "false"}), ("nope", {})]),
             bash("echo hi > hello.txt"), SUBMIT]
    result = asyncio.run(env.run_task(Recording(lambda task_id: turns), task, "ids"))
    assert (result.passed, result.turns, result.tool_calls, result.tool_errors) == (True, 3, 5, 2)
    assert seen[0][0]["role"] == "system" and seen[0][1] == {"role": "user", "content": "Make it so.\n"}
    tool_messages = [m for m in seen[1] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_messages] == ["call_0", "call_1", "call_2"]
    assert [json.loads(m["content"])["ok"] for m in tool_messages] == [True, False, False]
    assert [t["function"]["name"] for t in TOOLS] == ["bash", "write_file", "submit"]


def test_the_shared_runner_is_installed_and_a_tasks_own_runner_is_kept(tmp_path: Path,
                                                                       small: tuple[TerminalEnv, TerminalTask]):
    env, task = small
    assert play(env, env.scripted_agent("oracle"), [task])[0].details["tests_passed"] == 2
    null = play(env, env.scripted_agent("null"), [task])[0]
    assert (null.reward, null.details["failing_tests"]) == (-1.0, ["test_greeting"])

    own = "print('PASSED test_own_runner')\nprint('RESULT passed=1 failed=0')\n"
    custom = make_task(tmp_path / "own", tests="def test_never():\n    assert False\n", solution="true\n",
                       own_runner=own)
    result = play(env, env.scripted_agent("null"), [custom])[0]
    assert (result.passed, result.details["tests_passed"]) == (True, 1)  # the task's runner, not the shared one


# Terminal-Bench style: the task's own run-tests.sh, pytest's output format, tests found through $TEST_DIR.
PYTEST_LIKE = """#!/bin/bash
read -r line || true  # a command reading stdin gets nothing, and cannot swallow the rest of this script
python3 -I - "$TEST_DIR" <<'PY'
import os, runpy, sys
assert os.getcwd() == "/workspace" and sys.argv[1] == "/workspace/tests"
namespace = runpy.run_path(os.path.join(sys.argv[1], "test_outputs.py"))
failed = []
for name, fn in namespace.items():
    if name.startswith("test_"):
        try:
            fn()
            print(f"PASSED tests/test_outputs.py::{name}")
        except Exception:
            failed.append(name)
            print(f"FAILED tests/test_outputs.py::{name} - AssertionError")
passed = sum(n.startswith("test_") for n in namespace) - len(failed)
print(f"==== {len(failed)} failed, {passed} passed in 0.01s ====" if failed else f"==== {passed} passed in 0.01s ====")
sys.exit(1 if failed else 0)
PY
"""


def test_a_terminal_bench_style_task_runs_unchanged(tmp_path: Path):
    task = make_task(tmp_path / "tb", tests=GREETING_TESTS, solution="echo hi > hello.txt\n",
                     files={"notes.txt": "error\n"}, run_tests=PYTEST_LIKE,
                     setup="read -r line || true\necho set > setup-ran.txt\n")
    env = TerminalEnv({"tasks": str(task.path)})
    check_setup = bash("test \"$(cat setup-ran.txt)\" = set")
    oracle = play(env, script(check_setup, *env.scripted_agent("oracle").turns_for(task.id)), [task])[0]
    assert (oracle.passed, oracle.tool_errors, oracle.details["tests_passed"]) == (True, 0, 2), oracle
    null = play(env, env.scripted_agent("null"), [task])[0]
    assert (null.passed, null.details["failing_tests"]) == (False, ["tests/test_outputs.py::test_greeting"])


# Terminal-Bench's own form: pytest from the sandbox's toolchain, run on $TEST_DIR (no runner.py involved).
PYTEST_RUN_TESTS = '#!/bin/bash\npython3 -m pytest -q "$TEST_DIR"\n'
WORDCOUNT_TESTS = """\
import pytest


def wordcount():
    import wordcount  # the agent's module: `python3 -m` puts the workspace (the cwd) on sys.path
    return wordcount


@pytest.mark.parametrize("text, expected", [("a b a", {"a": 2, "b": 1}), ("", {})])
def test_counts(text, expected):
    assert wordcount().count_words(text) == expected


def test_case_is_folded():
    assert wordcount().count_words("A a") == {"a": 2}


@pytest.mark.timeout(20)
def test_report_is_written(tmp_path, mocker):
    spy = mocker.spy(wordcount(), "count_words")
    wordcount().write_report("b a b", tmp_path / "r.txt")
    assert (tmp_path / "r.txt").read_text() == "b 2\\na 1\\n" and spy.call_count == 1
"""
WORDCOUNT = """\
def count_words(text):
    counts = {}
    for word in text.{split}:
        counts[word] = counts.get(word, 0) + 1
    return counts


def write_report(text, path):
    counts = count_words(text)
    with open(path, "w") as f:
        f.writelines(f"{w} {n}\\n" for w, n in sorted(counts.items(), key=lambda item: -item[1]))
"""


def test_a_pytest_task_passes_with_the_oracle_and_fails_with_null(tmp_path: Path):
    solution = "cat > wordcount.py <<'EOF'\n" + WORDCOUNT.replace("{split}", "lower().split()") + "EOF\n"
    task = make_task(tmp_path / "pytest-task", tests=WORDCOUNT_TESTS, solution=solution, run_tests=PYTEST_RUN_TESTS)
    env = TerminalEnv({"tasks": str(task.path)})
    oracle = play(env, env.scripted_agent("oracle"), [task])[0]
    assert (oracle.passed, oracle.reward, oracle.tool_errors) == (True, 1.0, 0), oracle
    assert {k: oracle.details[k] for k in ("tests_passed", "tests_failed", "failing_tests", "test_exit_code")} == \
        {"tests_passed": 4, "tests_failed": 0, "failing_tests": [], "test_exit_code": 0}
    null = play(env, env.scripted_agent("null"), [task])[0]
    assert (null.passed, null.reward, null.details["tests_passed"], null.details["tests_failed"]) == \
        (False, -1.0, 0, 4), null
    assert null.details["test_exit_code"] == 1 and len(null.details["failing_tests"]) == 4
    partial = play(env, script(write("wordcount.py", WORDCOUNT.replace("{split}", "split()")), SUBMIT), [task])[0]
    assert (partial.passed, partial.details["tests_passed"], partial.details["tests_failed"]) == (False, 3, 1)
    assert partial.details["failing_tests"] == ["tests/test_outputs.py::test_case_is_folded"]


def test_the_tasks_time_limit_ends_the_episode(tmp_path: Path):
    task = make_task(tmp_path / "slow", tests=GREETING_TESTS, solution="true\n",
                     yaml_extra="max_agent_timeout_sec: 1\n")
    env = TerminalEnv({"tasks": str(task.path)})
    result = play(env, script(bash("sleep 60"), bash("echo never"), bash("echo never")), [task])[0]
    assert (result.turns, result.tool_calls, result.timeouts, result.tool_errors, result.passed) == (2, 2, 1, 2, False)
    assert result.tool_s < 30  # the task's 1 s, not the 60 s sleep


# ---------------------------------------------------------------- cleanup

def processes_with(text: str) -> list[int]:
    """Host pids whose command line contains `text`."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            if text.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                found.append(int(entry))
        except OSError:
            continue
    return found


@pytest.fixture
def sandboxes(monkeypatch: pytest.MonkeyPatch) -> list[Sandbox]:
    """Every sandbox the terminal env makes during the test."""
    made: list[Sandbox] = []

    class Recorded(Sandbox):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(terminal_env, "Sandbox", Recorded)
    return made


def assert_gone(made: list[Sandbox], tag: str) -> None:
    assert made and all(not s.workspace_path.parent.exists() for s in made)
    assert processes_with(tag) == []


def test_nothing_outlives_an_episode(small: tuple[TerminalEnv, TerminalTask], sandboxes: list[Sandbox]):
    env, task = small
    tag = f"terminal-marker-{uuid.uuid4().hex}"
    agent = script(bash(f"sleep 1000 & setsid sleep 1000 & nohup sleep 1000 >/dev/null 2>&1 & echo started # {tag}"),
                   bash(f"sleep 1000 # {tag}"), SUBMIT)
    result = play(env, agent, [task])[0]
    assert (result.tool_calls, result.timeouts) == (3, 1)
    assert_gone(sandboxes, tag)


def test_a_cancelled_episode_is_cleaned_up(tmp_path: Path, sandboxes: list[Sandbox]):
    task = make_task(tmp_path / "t", tests=GREETING_TESTS, solution="true\n")
    env = TerminalEnv({"tasks": str(task.path), "command_timeout_s": 120})
    tag = f"terminal-marker-{uuid.uuid4().hex}"

    async def main() -> None:
        running = asyncio.create_task(env.run_task(script(bash(f"sleep 1000 # {tag}")), task, "cancel"))
        deadline = time.monotonic() + 10
        while not processes_with(tag) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert processes_with(tag), "the command never started"
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running

    asyncio.run(main())
    deadline = time.monotonic() + 10  # the command's thread returns once its sandbox is closed
    while processes_with(tag) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert_gone(sandboxes, tag)


def test_a_failing_agent_or_setup_leaves_nothing(tmp_path: Path, small: tuple[TerminalEnv, TerminalTask],
                                                 sandboxes: list[Sandbox]):
    env, task = small

    class Broken(ScriptedAgent):
        async def chat(self, session_id, messages, **kw):
            if len(messages) > 2:
                raise RuntimeError("the gateway went away")
            return bash("echo working")

    with pytest.raises(RuntimeError, match="gateway went away"):
        play(env, Broken(lambda task_id: []), [task])
    broken_setup = make_task(tmp_path / "bad", tests=GREETING_TESTS, solution="true\n", setup="echo oops; exit 3\n")
    with pytest.raises(TaskSetupError, match=r"bad: setup.sh failed \(exit code 3.*oops"):
        play(env, env.scripted_agent("null"), [broken_setup])
    assert len(sandboxes) == 2
    assert_gone(sandboxes, "terminal-marker-none")


# ---------------------------------------------------------------- configuration

def test_task_sets_and_configuration(env: TerminalEnv, tmp_path: Path):
    assert isinstance(env, TaskEnvironment) and terminal_env.ENVIRONMENT is TerminalEnv
    assert isinstance(load_environment("envs/terminal", {"max_turns": 4}), TerminalEnv)
    everything = [t.id for t in env.tasks()]
    assert everything == sorted(everything) and len(everything) == 27
    train, heldout = [t.id for t in env.tasks("train")], [t.id for t in env.tasks("heldout")]
    assert sorted(train + heldout) == everything and not set(train) & set(heldout) and len(heldout) == 5
    assert heldout == everything[4::5]
    assert [t.id for t in env.tasks(str(BUNDLED_TASKS / "tar-backup"))] == ["tar-backup"]
    assert env.describe()["train_tasks"] == 22 and env.describe()["heldout_tasks"] == heldout

    for bad, message in [({"max_turn": 3}, "unknown arg.*max_turn"), ({"heldout_every": 1}, "heldout_every"),
                         ({"command_timeout_s": 0}, "timeout_s must be positive"), ({"max_turns": 0}, "max_turns"),
                         ({"tasks": str(tmp_path)}, "no task directories")]:
        with pytest.raises(ValueError, match=message):
            TerminalEnv(bad)
    with pytest.raises(ValueError, match="unknown scripted agent 'smart'"):
        env.scripted_agent("smart")


def test_sandbox_overhead_is_measured_once(env: TerminalEnv):
    first = env.sandbox_overhead_s()
    assert 0 < first < 5 and env.sandbox_overhead_s() == first
