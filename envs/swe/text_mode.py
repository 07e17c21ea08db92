"""A text-only agent loop in mini-swe-agent's style, for models without tool calling.

Each assistant turn holds exactly one fenced bash block; it runs as the `bash` tool of the episode's
world, and its result comes back as a user message: the same one line of JSON a tool message holds
(`ok`, `exit_code`, `timed_out`, `error`, `output`). A turn with no block or several blocks gets a
format reminder instead (counted as a tool error). The agent submits by running
`echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`: a command whose output starts with that line ends the
episode, as in mini-swe-agent. Grading and the outcome report are those of the tool mode.
"""
from __future__ import annotations

import asyncio
import json
import re
import time

from clawr1.environment import AssistantTurn, ChatClient, EpisodeResult
from envs.agentic.agent import AgentTask, World, finish_episode
from envs.agentic.sandbox import WORKSPACE

SUBMIT_SENTINEL = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
SUBMIT_COMMAND = f"echo {SUBMIT_SENTINEL}"
BASH_BLOCK = re.compile(r"```bash[ \t]*\n(.*?)```", re.DOTALL)

TEXT_SYSTEM_PROMPT = f"""\
You are a software engineer fixing an issue in a Python repository, checked out at {WORKSPACE} (your current \
directory), a git repository at its base commit.
Reply with a short thought and exactly ONE bash code block (```bash ... ```): its command runs in {WORKSPACE} \
in a fresh shell (no network, no root), and its result comes back as one line of JSON: ok, exit_code, timed_out, \
error and output. `python3 -m pytest` runs the tests. Your change is graded by the repository's tests, including \
tests you cannot see; edits to test files are discarded.
When the issue is fixed, submit with a block whose command is exactly: {SUBMIT_COMMAND}"""

FORMAT_REMINDER = (f"Your reply must hold exactly one ```bash code block (found {{found}}). Send one command "
                   f"in one block, or `{SUBMIT_COMMAND}` to submit.")


class FormatError(ValueError):
    """A reply without exactly one bash block."""


def parse_command(content: str) -> str:
    """The command of the reply's one bash block."""
    blocks = BASH_BLOCK.findall(content)
    if len(blocks) != 1:
        raise FormatError(FORMAT_REMINDER.format(found=len(blocks)))
    return blocks[0].strip()


def text_turn(command: str, thought: str = "") -> AssistantTurn:
    """An assistant turn in the text format (for scripted agents)."""
    return AssistantTurn(f"{thought}\n```bash\n{command}\n```".lstrip())


def submitted(output: str) -> bool:
    lines = output.lstrip().splitlines()
    return bool(lines) and lines[0].strip() == SUBMIT_SENTINEL


async def run_text_episode(client: ChatClient, task: AgentTask, world: World, session_id: str, *,
                           side: bool = False, group_id: str = "") -> EpisodeResult:
    """Play one text-mode episode of `task`, grade it, report the outcome (unless `side`)."""
    t0 = time.monotonic()
    messages = [dict(m) for m in task.messages]
    result = EpisodeResult(task.id, task.category, passed=False, reward=0.0, turns=0)
    while result.turns < task.max_turns:
        turn = await client.chat(session_id, messages, side=side, task_id=task.id, group_id=group_id)
        result.turns += 1
        messages.append({"role": "assistant", "content": turn.content})
        try:
            command = parse_command(turn.content)
        except FormatError as e:
            result.tool_errors += 1
            messages.append({"role": "user", "content": str(e)})
            continue
        out = await asyncio.to_thread(world.call, "bash", json.dumps({"command": command}))
        result.tool_calls += 1
        result.tool_errors += not out.ok
        result.timeouts += out.timed_out
        result.tool_s += out.wall_s
        if submitted(out.output) or out.submitted:
            break
        messages.append({"role": "user", "content": out.message_content()})
    return await finish_episode(client, world, messages, result, session_id, side=side, started=t0)
