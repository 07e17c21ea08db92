"""The terminal environment: Terminal-Bench-style tasks played in a kernel sandbox, graded by their own tests.

`TerminalEnv(args, seed)` implements `clawr1.environment.TaskEnvironment`; `clawr1 bench envs/terminal`
finds it through `ENVIRONMENT`. Env args (`TerminalEnvConfig`):

- `tasks`: a task directory, or a directory of task directories (default: the bundled `tasks/`).
- `backend`: the sandbox backend (`auto`, `bwrap`, `unshare`; see envs/agentic/sandbox.py).
- `max_turns` (12): assistant turns per episode. `heldout_every` (5): every 5th task by sorted id is
  held out for `evaluate`; `episode` trains on the others.
- `command_timeout_s` (30): wall limit of one bash call. `memory_mb`, `max_processes`, `file_size_mb`,
  `tmp_mb`, `max_output_bytes`: the sandbox's per-command limits.

One episode is one `TerminalWorld`: a sandbox holding a fresh copy of the task's workspace, set up by
the task's `setup.sh`, in which the agent's tools run:

- `bash(command)`: `bash -c command` in a new process tree, cwd = the workspace; a fresh shell each call;
- `write_file(path, content)`: create or replace a workspace file;
- `submit()`: end the episode.

Each result goes back as one line of JSON (`ok`, `exit_code`, `timed_out`, `error`, `output`). The
commands' total wall time is bounded by the task's `max_agent_timeout_sec`. After the agent is done,
the grader replaces whatever is at `./tests` with the task's tests (and the shared runner), feeds the
task's own run-tests.sh on stdin to bash in the sandbox, and reads only that script's stdout: +1 when it
exits 0 and every test passed, else -1. See README.md.
"""
from __future__ import annotations

import asyncio
import json
import os
import random
import stat
import statistics
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, ClassVar, Optional

from clawr1.environment import ChatClient, EpisodeResult
from envs.agentic.agent import (AgentTask, Grade, ScriptedAgent, ToolOutcome, call_turn, evaluate_tasks, group_metrics,
                                pass_rates, play_group, run_episode, tally_episodes)
from envs.agentic.sandbox import WORKSPACE, CommandResult, Sandbox, SandboxError, SandboxLimits
from envs.terminal.tasks import BUNDLED_TASKS, TerminalTask, failing_tests, grader_files, load_tasks, \
    parse_test_output

EVAL_CONCURRENCY = 2  # held-out episodes at a time (each runs real processes)
SETUP_TIMEOUT_S = 60.0  # setup.sh
CLEAR_TIMEOUT_S = 30.0  # removing what the agent left at ./tests
OVERHEAD_SAMPLES = 5

SYSTEM_PROMPT = f"""\
You are an agent working in a Linux terminal. Your current directory, {WORKSPACE}, holds the task's files.
Tools:
- bash(command): runs the command with bash in {WORKSPACE}. Each call is a fresh shell: cd, variables and \
background processes do not carry over to the next call. There is no network access and no root.
- write_file(path, content): creates or replaces a file (path relative to {WORKSPACE}).
- submit(): call it when the task is done; it ends the episode.
Each tool result is one line of JSON: ok, exit_code, timed_out, error and output."""


def _function(name: str, description: str, properties: dict[str, str]) -> dict:
    props = {key: {"type": "string", "description": text} for key, text in properties.items()}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": props, "required": list(properties)}}}


TOOLS = [
    _function("bash", "Run a bash command in the task's directory; returns its exit code and output.",
              {"command": "the command (a whole bash script is fine)"}),
    _function("write_file", "Create or replace a file in the task's directory with the given text.",
              {"path": "the file's path, relative to the task's directory", "content": "the file's whole text"}),
    _function("submit", "Finish: call it when the task is done.", {}),
]
TOOL_PARAMETERS = {t["function"]["name"]: t["function"]["parameters"]["required"] for t in TOOLS}

# Run in the sandbox before the tests are installed: whatever the agent left at ./tests goes, a link
# without being followed, a directory made writable first in case the agent locked it.
CLEAR_TESTS = ("if [ -d tests ] && [ ! -L tests ]; then chmod -R u+rwx tests; fi; "
               "rm -rf -- tests 2>/dev/null; [ ! -e tests ] && [ ! -L tests ]")



def stdin_script(name: str, before: str = "") -> str:
    """The command that runs the bash script given on stdin (the task directory is never visible in the sandbox).

    Like `bash -s`, but the script is read whole first, so that its commands get an empty stdin and
    none of them can swallow the rest of the script.
    """
    return f'{before}script=$(cat) && exec bash -c "$script" {name} </dev/null'


@dataclass
class TerminalEnvConfig:
    env_name: ClassVar[str] = "terminal"  # in error messages (subclasses configure other environments)

    tasks: str = ""  # a task directory or a directory of them; "": the bundled set
    backend: str = "auto"
    max_turns: int = 12
    group_size: int = 1  # attempts of the same task per training episode, one GRPO group (match pool.group_size)
    heldout_every: int = 5  # every Nth task by sorted id is held out for evaluate
    command_timeout_s: float = 30.0  # one bash call
    memory_mb: int = 2048  # address space of each process
    max_processes: int = 256
    file_size_mb: int = 256  # the largest file a command may write
    tmp_mb: int = 256  # the private /tmp of each command
    max_output_bytes: int = 16_000  # output kept per command (head and tail), for the agent and the grader

    @classmethod
    def from_args(cls, args: dict[str, Any]) -> "TerminalEnvConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(args) - known)
        if unknown:
            raise ValueError(f"{cls.env_name} env: unknown arg(s) {', '.join(unknown)}; "
                             f"known: {', '.join(sorted(known))}")
        cfg = cls(**args)
        if cfg.max_turns < 1:
            raise ValueError(f"{cls.env_name} env: max_turns must be >= 1, got {cfg.max_turns}")
        if cfg.group_size < 1:
            raise ValueError(f"{cls.env_name} env: group_size must be >= 1, got {cfg.group_size}")
        if cfg.heldout_every < 2:
            raise ValueError(f"{cls.env_name} env: heldout_every must be >= 2 (1 would hold out every task), "
                             f"got {cfg.heldout_every}")
        cfg.limits()  # SandboxLimits refuses non-positive values
        return cfg

    def limits(self) -> SandboxLimits:
        try:
            return SandboxLimits(memory_mb=self.memory_mb, max_processes=self.max_processes,
                                 file_size_mb=self.file_size_mb, timeout_s=self.command_timeout_s, tmp_mb=self.tmp_mb,
                                 max_output_bytes=self.max_output_bytes)
        except ValueError as e:
            raise ValueError(f"{self.env_name} env: {e}") from None


class TaskSetupError(RuntimeError):
    """A task's setup.sh failed: the task is broken, not the agent."""


class BadCall(ValueError):
    """A tool call the world refuses: malformed JSON, an unknown tool, missing or wrong arguments."""


def decode_arguments(name: str, arguments: str, tools: dict, required: list[str], known: list[str]) -> dict[str, Any]:
    """The call's arguments as a JSON object holding every `required` key and no key outside `known`."""
    if name not in tools:
        raise BadCall(f"unknown tool {name!r}; the tools are {', '.join(tools)}")
    try:
        args = json.loads(arguments) if arguments.strip() else {}
    except json.JSONDecodeError as e:
        raise BadCall(f"arguments are not valid JSON: {e}") from None
    if not isinstance(args, dict):
        raise BadCall(f"arguments must be a JSON object, got {type(args).__name__}")
    missing = [key for key in required if key not in args]
    extra = sorted(set(args) - set(known))
    if missing or extra:
        problems = ([f"missing argument(s) {', '.join(missing)}"] if missing else []) + \
                   ([f"unexpected argument(s) {', '.join(extra)}"] if extra else [])
        raise BadCall(f"{name}: {'; '.join(problems)}; it takes ({', '.join(known)})")
    return args


def parse_arguments(name: str, arguments: str) -> dict[str, str]:
    """The call's arguments, checked against the tool's schema (every argument a required string)."""
    expected = TOOL_PARAMETERS.get(name, [])
    args = decode_arguments(name, arguments, TOOL_PARAMETERS, expected, expected)
    wrong = [key for key in expected if not isinstance(args[key], str)]
    if wrong:
        raise BadCall(f"{name}: argument(s) {', '.join(wrong)} must be strings")
    unusable = [key for key in expected if not is_text(args[key], allow_nul=key == "content")]
    if unusable:
        raise BadCall(f"{name}: argument(s) {', '.join(unusable)} must be UTF-8 text without NUL characters")
    return args


def is_text(value: str, allow_nul: bool) -> bool:
    """Whether `value` can become a command line or a file (JSON may carry lone surrogates and NULs)."""
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return allow_nul or "\x00" not in value


def workspace_relative(path: str, tool: str = "write_file") -> str:
    """A file tool's path relative to the workspace (an absolute path under /workspace is accepted)."""
    if path == WORKSPACE or path.startswith(WORKSPACE + "/"):
        path = path[len(WORKSPACE):].lstrip("/")
    if not path or path.startswith("/"):
        raise BadCall(f"{tool}: path must be a file in {WORKSPACE}, relative to it, got {path!r}")
    return path


def command_error(result: CommandResult, timeout_s: float) -> str:
    if result.timed_out:
        return f"the command timed out after {timeout_s:g} s and was killed"
    if result.limit_hit:
        return f"the command hit the sandbox's {result.limit_hit} limit"
    return ""


class TerminalWorld:
    """One episode: a sandbox with a fresh, set-up copy of the task's workspace; runs tools, then grades."""

    def __init__(self, task: TerminalTask, cfg: TerminalEnvConfig):
        self.task, self.cfg = task, cfg
        self.sandbox = Sandbox(task.workspace_dir, backend=cfg.backend, limits=cfg.limits())
        self.command_s = 0.0  # wall time of the agent's commands, against the task's agent timeout
        try:
            self._setup()
        except BaseException:
            self.sandbox.close()
            raise

    def _setup(self) -> None:
        if self.task.setup_path is None:
            return
        result = self.sandbox.run(stdin_script("setup.sh"), timeout_s=SETUP_TIMEOUT_S,
                                  stdin=self.task.setup_path.read_text())
        if result.exit_code != 0:
            raise TaskSetupError(f"task {self.task.id}: setup.sh failed (exit code {result.exit_code}, "
                                 f"timed out: {result.timed_out}): {result.output[-500:]}")

    @property
    def agent_timeout_s(self) -> float:
        """Wall seconds of commands the agent may use in the episode."""
        return self.task.agent_timeout_s

    # -- tools
    def call(self, name: str, arguments: str) -> ToolOutcome:
        try:
            args = parse_arguments(name, arguments)
            if name == "bash":
                return self._bash(args["command"])
            if name == "write_file":
                return self._write_file(workspace_relative(args["path"]), args["content"])
            return ToolOutcome("submitted", submitted=True)
        except BadCall as e:
            return ToolOutcome("", ok=False, error=str(e))

    def _bash(self, command: str) -> ToolOutcome:
        remaining = self.agent_timeout_s - self.command_s
        if remaining <= 0:
            return ToolOutcome("", ok=False, submitted=True, error=f"the task's time limit "
                               f"({self.agent_timeout_s:g} s of commands) is used up: the episode ends")
        timeout = min(self.cfg.command_timeout_s, remaining)
        result = self.sandbox.run(command, timeout_s=timeout)
        self.command_s += result.wall_s
        return ToolOutcome(result.output, ok=result.exit_code == 0, error=command_error(result, timeout),
                           exit_code=result.exit_code, timed_out=result.timed_out, wall_s=result.wall_s)

    def _write_file(self, path: str, content: str) -> ToolOutcome:
        try:
            self.sandbox.write_file(path, content)
        except (SandboxError, OSError) as e:
            return ToolOutcome("", ok=False, error=f"write_file: cannot write {path!r}: {e}")
        return ToolOutcome(f"wrote {len(content.encode())} bytes to {path}")

    # -- grading
    def grade(self, messages: list[dict]) -> Grade:
        """Install the task's tests, run its run-tests.sh, read the verdict from that script's stdout only."""
        try:
            result = self._run_tests()
        except (SandboxError, OSError) as e:
            details = {"tests_passed": 0, "tests_failed": 0, "pass_fraction": 0.0, "failing_tests": []}
            return Grade(False, -1.0, feedback=f"grading failed: {e}", details=details)
        verdict = parse_test_output(result.output)
        passed = result.exit_code == 0 and verdict.all_passed
        details = {"tests_passed": verdict.passed, "tests_failed": verdict.failed, "pass_fraction": verdict.fraction,
                   "failing_tests": failing_tests(result.output)[:5], "test_exit_code": result.exit_code,
                   "test_timed_out": result.timed_out}
        return Grade(passed, 1.0 if passed else -1.0, feedback=self._feedback(passed, result, verdict.passed),
                     details=details)

    def _run_tests(self) -> CommandResult:
        workspace = self.sandbox.workspace_path  # the sandbox's user owns it: the agent may have locked it
        os.chmod(workspace, stat.S_IMODE(os.lstat(workspace).st_mode) | stat.S_IRWXU)
        cleared = self.sandbox.run(CLEAR_TESTS, timeout_s=CLEAR_TIMEOUT_S)
        if cleared.exit_code != 0:
            raise SandboxError(f"could not remove ./tests before installing the task's tests: {cleared.output[-300:]}")
        for src, dest in grader_files(self.task):
            self.sandbox.copy_in(src, dest)
        # The task's own script comes on stdin, so nothing the agent left in the workspace runs in its
        # place; stderr is dropped: only the script's stdout carries the verdict.
        command = stdin_script("run-tests.sh", before=f"export TEST_DIR={WORKSPACE}/tests; exec 2>/dev/null; ")
        return self.sandbox.run(command, timeout_s=self.task.test_timeout_s,
                                stdin=self.task.run_tests_path.read_text())

    def _feedback(self, passed: bool, result: CommandResult, n_passed: int) -> str:
        if passed:
            return f"all {n_passed} tests passed"
        if result.timed_out:
            return f"the tests timed out after {self.task.test_timeout_s:g} s"
        failing = failing_tests(result.output)
        if not failing:
            return f"the tests did not pass (exit code {result.exit_code})"
        more = f" and {len(failing) - 3} more" if len(failing) > 3 else ""
        return "failed: " + ", ".join(failing[:3]) + more

    def close(self) -> None:
        self.sandbox.close()

    def __enter__(self) -> "TerminalWorld":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def agent_task(task: TerminalTask, max_turns: int) -> AgentTask:
    messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": task.instruction}]
    return AgentTask(id=task.id, category=task.category, messages=messages, tools=TOOLS, max_turns=max_turns,
                     needs_submit=True)


def split(tasks: list[TerminalTask], every: int) -> tuple[list[TerminalTask], list[TerminalTask]]:
    """(train, heldout): every `every`-th task by sorted id is held out."""
    ordered = sorted(tasks, key=lambda t: t.id)
    heldout = [t for i, t in enumerate(ordered) if i % every == every - 1]
    return [t for t in ordered if t not in heldout], heldout


class TerminalEnv:
    """A `clawr1.environment.TaskEnvironment` over Terminal-Bench-style task directories, in a sandbox.

    Other sandboxed task environments (envs/swe) subclass it and replace the hooks: `config_class`,
    `load_tasks`, `agent_task`, `make_world`, `play` and `oracle_script`.
    """

    eval_metrics = ("pass_rate", "mean_turns")
    config_class: ClassVar[type[TerminalEnvConfig]] = TerminalEnvConfig

    def __init__(self, args: dict[str, Any], seed: int = 0):
        self.cfg = self.config_class.from_args(args)
        self.name = self.cfg.env_name
        self.seed = seed
        self.all_tasks = self.load_tasks(self.cfg.tasks or None)
        self.train_set, self.heldout_set = split(self.all_tasks, self.cfg.heldout_every)
        self._known: dict[str, TerminalTask] = {t.id: t for t in self.all_tasks}
        self._overhead_s: Optional[float] = None
        self.counts = {"episodes": 0, "episodes_passed": 0, "tool_calls": 0, "tool_errors": 0, "timeouts": 0,
                       "eval_episodes": 0, "eval_passed": 0}

    # -- task sets
    def tasks(self, spec: Optional[str] = None) -> list[TerminalTask]:
        """None or "all": every task of the configured set; "train" / "heldout": its split; else a task directory."""
        if spec in (None, "", "all"):
            chosen = self.all_tasks
        elif spec in ("train", "heldout"):
            chosen = self.train_set if spec == "train" else self.heldout_set
        else:
            chosen = self.load_tasks(spec)
        self._known.update({t.id: t for t in chosen})
        return list(chosen)

    def load_tasks(self, path: Optional[str]) -> list[TerminalTask]:
        """The tasks at `path` (None: the bundled set)."""
        return load_tasks(Path(path) if path else BUNDLED_TASKS)

    # -- playing
    def agent_task(self, task: TerminalTask) -> AgentTask:
        return agent_task(task, self.cfg.max_turns)

    def make_world(self, task: TerminalTask) -> TerminalWorld:
        """A fresh episode world for `task` (blocking: copies the workspace and runs setup.sh)."""
        return TerminalWorld(task, self.cfg)

    async def _open_world(self, task: TerminalTask) -> TerminalWorld:
        pending = asyncio.ensure_future(asyncio.to_thread(self.make_world, task))
        try:
            return await asyncio.shield(pending)
        except asyncio.CancelledError:  # the world is still being made: close it once it exists
            pending.add_done_callback(_close_when_made)
            raise

    async def run_task(self, client: ChatClient, task: TerminalTask, session_id: str, *,
                       side: bool = True, group_id: str = "") -> EpisodeResult:
        """One episode of `task` through `client` in a fresh sandbox, closed whatever happens."""
        self._known[task.id] = task
        world = await self._open_world(task)
        try:
            return await self.play(client, task, world, session_id, side=side, group_id=group_id)
        finally:
            world.close()

    async def play(self, client: ChatClient, task: TerminalTask, world: TerminalWorld, session_id: str, *,
                   side: bool, group_id: str) -> EpisodeResult:
        """One episode of `task` in `world` (the agent loop of envs/agentic/agent.py)."""
        return await run_episode(client, self.agent_task(task), world, session_id, side=side, group_id=group_id)

    async def episode(self, client: ChatClient, session_id: str, rng: random.Random) -> dict[str, float]:
        """`group_size` attempts at one random training task (one GRPO group), reported to the judge; their mean
        metrics."""
        if not self.train_set:
            raise ValueError(f"{self.name} env: no training tasks (the set has {len(self.all_tasks)})")
        results = await play_group(self.run_task, client, rng.choice(self.train_set), session_id, self.cfg.group_size)
        tally_episodes(self.counts, results)
        return group_metrics(results)

    async def evaluate(self, client: ChatClient, n: int, session_prefix: str) -> dict[str, float]:
        """Up to `n` held-out tasks (the same ones every time) as side turns, EVAL_CONCURRENCY at a time."""
        results = await evaluate_tasks(self.run_task, client, self.heldout_set[:max(0, n)], session_prefix,
                                       EVAL_CONCURRENCY)
        self.counts["eval_episodes"] += len(results)
        self.counts["eval_passed"] += sum(r.passed for r in results)
        return pass_rates(results)

    # -- calibration
    def scripted_agent(self, kind: str) -> ScriptedAgent:
        """"oracle": runs each task's solution.sh with one bash call, then submits; "null": submits at once."""
        if kind == "oracle":
            return ScriptedAgent(lambda task_id: self.oracle_script(self._task(task_id)))
        if kind == "null":
            return ScriptedAgent(lambda task_id: [call_turn([("submit", {})])])
        raise ValueError(f"{self.name} env: unknown scripted agent {kind!r}; use 'oracle' or 'null'")

    def oracle_script(self, task: TerminalTask) -> list:
        return oracle_script(task)

    def _task(self, task_id: str) -> TerminalTask:
        if task_id not in self._known:
            raise KeyError(f"{self.name} env: task {task_id!r} is not among the tasks this env has loaded")
        return self._known[task_id]

    def sandbox_overhead_s(self) -> Optional[float]:
        """Median wall time of `true` in this env's sandbox (measured once)."""
        if self._overhead_s is None:
            with Sandbox(None, backend=self.cfg.backend, limits=self.cfg.limits()) as sandbox:
                self._overhead_s = statistics.median(sandbox.run("true").wall_s for _ in range(OVERHEAD_SAMPLES))
        return self._overhead_s

    # -- reporting
    def describe(self) -> dict[str, Any]:
        return {"tasks": self.cfg.tasks or "bundled (envs/terminal/tasks)", "backend": self.cfg.backend,
                "train_tasks": len(self.train_set), "heldout_tasks": [t.id for t in self.heldout_set],
                "max_turns": self.cfg.max_turns, "command_timeout_s": self.cfg.command_timeout_s}

    def report(self) -> dict[str, float]:
        return {k: float(v) for k, v in self.counts.items()}


def oracle_script(task: TerminalTask) -> list:
    """The reference solution through the tools: one bash call with solution.sh's text, then submit."""
    return [call_turn([("bash", {"command": task.solution_path.read_text()})]), call_turn([("submit", {})])]


def _close_when_made(pending: "asyncio.Future[TerminalWorld]") -> None:
    if not pending.cancelled() and pending.exception() is None:
        pending.result().close()


ENVIRONMENT = TerminalEnv
