"""The SWE environment: SWE-bench instances played in a kernel sandbox, graded like SWE-bench.

`SweEnv(args, seed)` is a `clawr1.environment.TaskEnvironment` (`clawr1 bench envs/swe` finds it
through `ENVIRONMENT`); it is the terminal environment's machinery (envs/terminal/env.py: config,
task sets, episodes, evaluation, scripted agents) with SWE tasks, tools and grading. Env args: those
of `TerminalEnvConfig` (`tasks` is a JSONL file here, default the bundled envs/swe/tasks.jsonl), plus
`agent_timeout_s` (wall seconds of commands per episode) and `test_timeout_s` (the grading run).

One episode is one `SweWorld`: a sandbox holding a fresh copy of the task's repository at its base
commit (envs/swe/tasks.py), with these tools, each answering one line of JSON (`ok`, `exit_code`,
`timed_out`, `error`, `output`):

- `bash(command)`: `bash -c command` in the repository, a fresh shell each call;
- `read_file(path, start_line?, end_line?)`: the file's lines, numbered;
- `str_replace(path, old_str, new_str)`: replace the one occurrence of `old_str` (an error names a
  missing or repeated `old_str`, and nothing is written);
- `write_file(path, content)`: create or replace a file;
- `submit()`: end the episode.

Grading (envs/swe/grading.py) takes the agent's `git diff` and grades it in a fresh sandbox: +1 when
resolved, else -1, reported through the outcome endpoint with the failing tests' names as the text.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Optional

from clawr1.environment import ChatClient, EpisodeResult
from envs.agentic.agent import AgentTask, Grade, ScriptedAgent, ToolOutcome, call_turn
from envs.agentic.sandbox import WORKSPACE, Sandbox, SandboxError
from envs.swe.grading import agent_diff, grade_patch
from envs.swe.tasks import BUNDLED_TASKS, SweTask, TaskFormatError, load_tasks, prepared_repo
from envs.swe.text_mode import SUBMIT_COMMAND, TEXT_SYSTEM_PROMPT, run_text_episode, text_turn
from envs.terminal.env import (BadCall, TerminalEnv, TerminalEnvConfig, TerminalWorld, is_text, decode_arguments,
                               workspace_relative)

GOLD_PATCH_END = "CLAWR1_GOLD_PATCH_END"

SYSTEM_PROMPT = f"""\
You are a software engineer fixing an issue in a Python repository. The repository is checked out at \
{WORKSPACE} (your current directory), a git repository at its base commit.
Tools:
- bash(command): runs the command with bash in {WORKSPACE}; a fresh shell each call, no network, no root. \
`python3 -m pytest` runs the tests.
- read_file(path, start_line, end_line): shows a file's lines, numbered (the line range is optional).
- str_replace(path, old_str, new_str): replaces old_str, which must occur exactly once in the file, with new_str.
- write_file(path, content): creates or replaces a file.
- submit(): call it when the issue is fixed; it ends the episode.
Each tool result is one line of JSON: ok, exit_code, timed_out, error and output.
Your change is graded by the repository's tests, including tests you cannot see; edits to test files are discarded."""

USER_PROMPT = "Fix this issue in the repository {repo}:\n\n{problem}"


def _function(name: str, description: str, properties: dict[str, tuple[str, str]], required: list[str]) -> dict:
    props = {key: {"type": kind, "description": text} for key, (kind, text) in properties.items()}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": props, "required": required}}}


TOOLS = [
    _function("bash", "Run a bash command in the repository; returns its exit code and output.",
              {"command": ("string", "the command (a whole bash script is fine)")}, ["command"]),
    _function("read_file", "Show a file's lines, numbered; optionally only lines start_line to end_line.",
              {"path": ("string", "the file's path, relative to the repository"),
               "start_line": ("integer", "the first line to show (1-based)"),
               "end_line": ("integer", "the last line to show")}, ["path"]),
    _function("str_replace", "Replace the one occurrence of old_str in a file with new_str.",
              {"path": ("string", "the file's path, relative to the repository"),
               "old_str": ("string", "the exact text to replace; it must occur exactly once"),
               "new_str": ("string", "the text to put in its place")}, ["path", "old_str", "new_str"]),
    _function("write_file", "Create or replace a file with the given text.",
              {"path": ("string", "the file's path, relative to the repository"),
               "content": ("string", "the file's whole text")}, ["path", "content"]),
    _function("submit", "Finish: call it when the issue is fixed.", {}, []),
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
PYTHON_TYPES = {"string": str, "integer": int}
MODES = ("tools", "text")


def parse_arguments(name: str, arguments: str) -> dict[str, Any]:
    """The call's arguments checked against the tool's schema (required keys, no others, types)."""
    schema = SCHEMAS.get(name, {"required": [], "properties": {}})
    args = decode_arguments(name, arguments, SCHEMAS, schema["required"], list(schema["properties"]))
    for key, value in args.items():
        kind = schema["properties"][key]["type"]
        if not isinstance(value, PYTHON_TYPES[kind]) or isinstance(value, bool):
            raise BadCall(f"{name}: argument {key} must be {'a string' if kind == 'string' else 'an integer'}")
        if kind == "string" and not is_text(value, allow_nul=key in ("content", "old_str", "new_str")):
            raise BadCall(f"{name}: argument {key} must be UTF-8 text without NUL characters")
    return args


@dataclass
class SweEnvConfig(TerminalEnvConfig):
    env_name: ClassVar[str] = "swe"

    tasks: str = ""  # a JSONL file of SWE-bench rows; "": the bundled envs/swe/tasks.jsonl
    max_turns: int = 30
    agent_timeout_s: float = 600.0  # wall seconds of commands per episode
    test_timeout_s: float = 300.0  # the grading run of FAIL_TO_PASS and PASS_TO_PASS
    mode: str = "tools"  # "tools": function calls; "text": one bash block per turn (envs/swe/text_mode.py)

    @classmethod
    def from_args(cls, args: dict[str, Any]) -> "SweEnvConfig":
        cfg = super().from_args(args)
        if cfg.mode not in MODES:
            raise ValueError(f"swe env: mode must be one of {', '.join(MODES)}, got {cfg.mode!r}")
        return cfg


class SweWorld(TerminalWorld):
    """One episode: a sandbox holding the task's repository at its base commit; tools, then grading."""

    def __init__(self, task: SweTask, cfg: SweEnvConfig):
        self.task, self.cfg = task, cfg
        self.sandbox = Sandbox(prepared_repo(task), backend=cfg.backend, limits=cfg.limits())
        self.command_s = 0.0

    @property
    def agent_timeout_s(self) -> float:
        return self.cfg.agent_timeout_s

    # -- tools
    def call(self, name: str, arguments: str) -> ToolOutcome:
        try:
            args = parse_arguments(name, arguments)
            if name == "bash":
                return self._bash(args["command"])
            if name == "submit":
                return ToolOutcome("submitted", submitted=True)
            path = workspace_relative(args.pop("path"), name)
            if name == "write_file":
                return self._write_file(path, args["content"])
            if name == "read_file":
                return self._read_file(path, args.get("start_line"), args.get("end_line"))
            return self._str_replace(path, args["old_str"], args["new_str"])
        except BadCall as e:
            return ToolOutcome("", ok=False, error=str(e))

    def _text(self, tool: str, path: str) -> str:
        try:
            return self.sandbox.read_file(path)
        except FileNotFoundError:
            raise BadCall(f"{tool}: no such file {path!r}") from None
        except (SandboxError, OSError) as e:
            raise BadCall(f"{tool}: cannot read {path!r}: {e}") from None

    def _read_file(self, path: str, start: Optional[int], end: Optional[int]) -> ToolOutcome:
        lines = self._text("read_file", path).splitlines()
        start = 1 if start is None else start
        end = len(lines) if end is None else end
        if not 1 <= start <= max(len(lines), 1) or end < start:
            raise BadCall(f"read_file: lines {start} to {end} are not a range of {path!r}, "
                          f"which has {len(lines)} lines")
        numbered = "".join(f"{n:6}\t{lines[n - 1]}\n" for n in range(start, min(end, len(lines)) + 1))
        limit = self.cfg.max_output_bytes
        cut = "\n...[cut: ask for a smaller line range]\n" if len(numbered) > limit else ""
        return ToolOutcome(numbered[:limit] + cut)

    def _str_replace(self, path: str, old: str, new: str) -> ToolOutcome:
        if not old:
            raise BadCall("str_replace: old_str is empty")
        text = self._text("str_replace", path)
        count = text.count(old)
        if count == 0:
            raise BadCall(f"str_replace: old_str does not occur in {path}; nothing was changed")
        if count > 1:
            raise BadCall(f"str_replace: old_str occurs {count} times in {path}; include more of the "
                          f"surrounding text so that it occurs once; nothing was changed")
        outcome = self._write_file(path, text.replace(old, new))
        if outcome.ok:
            line = text[:text.index(old)].count("\n") + 1
            outcome.output = f"replaced the text at line {line} of {path}"
        return outcome

    # -- grading
    def grade(self, messages: list[dict]) -> Grade:
        """Take the agent's diff and grade it in a fresh sandbox (envs/swe/grading.py)."""
        try:
            diff = agent_diff(self.sandbox, self.task.base_commit)
            report = grade_patch(self.task, diff, backend=self.cfg.backend, limits=self.cfg.limits(),
                                 test_timeout_s=self.cfg.test_timeout_s)
        except (SandboxError, OSError, TaskFormatError) as e:
            return Grade(False, -1.0, feedback=f"grading failed: {e}", details={"resolved": False,
                                                                               "reason": f"grading failed: {e}"})
        details = {**report.details(), "diff_bytes": len(diff.encode())}
        return Grade(report.resolved, 1.0 if report.resolved else -1.0, feedback=report.feedback(), details=details)


class SweEnv(TerminalEnv):
    """A `clawr1.environment.TaskEnvironment` over SWE-bench instance rows, in a sandbox."""

    eval_metrics = ("pass_rate", "mean_turns")  # pass_rate is the resolved rate
    pass_name = "resolved_rate"  # `clawr1 bench` reports pass@1 under this name too
    config_class = SweEnvConfig

    def load_tasks(self, path: Optional[str]) -> list[SweTask]:
        return load_tasks(path or BUNDLED_TASKS)

    def agent_task(self, task: SweTask) -> AgentTask:
        text = self.cfg.mode == "text"
        messages = [{"role": "system", "content": TEXT_SYSTEM_PROMPT if text else SYSTEM_PROMPT},
                    {"role": "user", "content": USER_PROMPT.format(repo=task.repo, problem=task.problem_statement)}]
        return AgentTask(id=task.id, category=task.category, messages=messages, tools=[] if text else TOOLS,
                         max_turns=self.cfg.max_turns, needs_submit=True)

    async def play(self, client: ChatClient, task: SweTask, world: SweWorld, session_id: str, *,
                   side: bool, group_id: str) -> EpisodeResult:
        """One episode: the tool-calling loop, or the text loop in text mode."""
        if self.cfg.mode == "tools":
            return await super().play(client, task, world, session_id, side=side, group_id=group_id)
        return await run_text_episode(client, self.agent_task(task), world, session_id, side=side,
                                      group_id=group_id)

    def scripted_agent(self, kind: str) -> ScriptedAgent:
        """"oracle": applies the gold patch, then submits; "null": submits at once (in the configured mode)."""
        if kind == "null" and self.cfg.mode == "text":
            return ScriptedAgent(lambda task_id: [text_turn(SUBMIT_COMMAND)])
        return super().scripted_agent(kind)

    def make_world(self, task: SweTask) -> SweWorld:
        """A fresh episode world for `task` (blocking: copies the base repository)."""
        return SweWorld(task, self.cfg)

    def oracle_script(self, task: SweTask) -> list:
        """The gold patch through the tools: `git apply` of it in one bash call, then submit."""
        if self.cfg.mode == "text":
            return [text_turn(oracle_command(task.patch), "Apply the fix."), text_turn(SUBMIT_COMMAND)]
        return [call_turn([("bash", {"command": oracle_command(task.patch)})]), call_turn([("submit", {})])]

    def describe(self) -> dict[str, Any]:
        return {"tasks": self.cfg.tasks or "bundled (envs/swe/tasks.jsonl)", "backend": self.cfg.backend,
                "train_tasks": len(self.train_set), "heldout_tasks": [t.id for t in self.heldout_set],
                "max_turns": self.cfg.max_turns, "command_timeout_s": self.cfg.command_timeout_s,
                "mode": self.cfg.mode}


def oracle_command(patch: str) -> str:
    """A bash command that applies `patch` to the repository (a quoted here-document: nothing expands)."""
    if f"\n{GOLD_PATCH_END}\n" in f"\n{patch}":
        raise ValueError(f"the patch contains the here-document's end marker {GOLD_PATCH_END}")
    return f"git apply --whitespace=nowarn - <<'{GOLD_PATCH_END}'\n{patch.rstrip(chr(10))}\n{GOLD_PATCH_END}\n"


ENVIRONMENT = SweEnv
