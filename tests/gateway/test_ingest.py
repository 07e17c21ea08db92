"""`clawr1 ingest`: pre-collected conversations become judged samples; exact counts; nothing twice.

The log file is made here from the personal env's simulated users talking to a scripted agent,
plus malformed lines, conversations whose last turn has no next state, and ones over the context limit.
"""
from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from clawr1.environment import AssistantTurn
from clawr1.protocol import Sample
from clawr1.pool.store import read_samples
from envs.personal.env import PersonalEnv
from envs.personal.preferences import random_style, render_answer
from envs.personal.questions import Question
from tests.conftest import REPO, make_config

CONVERSATIONS = 300  # every kind of line and turn below occurs (4 over the context limit), in a third of a minute
MALFORMED = {3: "{not json", 17: '{"messages": []}', 150: '{"messages": "hi"}', 299: "[1, 2, 3]",
             305: '{"messages": [{"role": "robot", "content": "x"}]}'}  # the file's last line


class LoggingAgent:
    """A scripted agent answering in random styles; keeps the conversation as a logger would."""

    def __init__(self, rng: random.Random):
        self.rng, self.messages, self.reward = rng, [], None

    async def chat(self, session_id, messages, **_):
        q = Question("q", self.rng.randint(1, 9), self.rng.randint(1, 9), "km")
        answer = render_answer(q, random_style(self.rng))
        self.messages = [*messages, {"role": "assistant", "content": answer}]
        return AssistantTurn(answer)

    async def complete(self, session_id, reward, text=""):
        self.reward = reward


def make_log(path: Path, conversations: int = CONVERSATIONS, malformed: dict = MALFORMED) -> dict:
    """Write the file; return the counts a correct ingest must report."""
    env = PersonalEnv({"questions_per_session": 2, "max_corrections": 1})
    rng = random.Random(0)
    lines, expect = [], {"conversations": 0, "turns": 0, "no next state": 0, "over the context limit": 0}
    for i in range(conversations):
        agent = LoggingAgent(rng)
        asyncio.run(env.episode(agent, f"s{i}", rng))
        conversation = {"messages": agent.messages, "session_id": f"log-{i}"}
        assistant = sum(m["role"] == "assistant" for m in agent.messages)
        if i % 3 == 0:
            conversation["reward"] = agent.reward  # the outcome: the last turn's next state
        elif i % 3 == 1:
            expect["no next state"] += 1  # the last turn was never followed
        else:
            conversation["feedback"] = [{"turn": assistant - 1, "score": -1, "text": "Please answer in one line."}]
        if i % 97 == 5:  # a huge first question: every turn is over the context limit
            conversation["messages"][1]["content"] += " filler" * 3000
            expect["over the context limit"] += assistant - (i % 3 == 1)
        expect["conversations"] += 1
        expect["turns"] += assistant
        lines.append(json.dumps(conversation))
    for at, bad in sorted(malformed.items()):
        lines.insert(at - 1, bad)  # line numbers are 1-based
    path.write_text("\n".join(lines) + "\n")
    expect["ingested"] = expect["turns"] - expect["no next state"] - expect["over the context limit"]
    return expect


def ingest(path: Path, url: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "clawr1.cli", "ingest", str(path), "--gateway", url], cwd=REPO,
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def run(tiny_model, tmp_path_factory):
    from tests.conftest import LoopProcess

    cfg = make_config(tmp_path_factory.mktemp("ingest"), "gateway.max_prompt_tokens=900", "judge.concurrency=8")
    processes = []
    try:
        for loop in ("pool", "serve", "judge", "gateway"):
            processes.append(LoopProcess(cfg, loop))
        processes[0].wait_file(cfg.run_dir / "state" / "pool.ready")
        processes[1].wait_http(f"{cfg.engine_url}/health")
        processes[2].wait_file(cfg.run_dir / "state" / "judge.ready")
        processes[3].wait_http(f"{cfg.gateway_url}/health")
        yield cfg
    finally:
        for p in reversed(processes):
            p.stop()


def pool_samples(cfg) -> list[Sample]:
    return read_samples(cfg.run_dir / "pool")


def test_ingest_counts_exactly_adds_nothing_twice_and_reaches_the_pool(run, tmp_path):
    expect = make_log(tmp_path / "logs.jsonl")
    first = ingest(tmp_path / "logs.jsonl", run.gateway_url)
    assert first["lines"] == CONVERSATIONS + len(MALFORMED)
    assert [m["line"] for m in first["malformed_lines"]] == sorted(MALFORMED)
    assert "not JSON" in first["malformed_lines"][0]["error"] and "role" in first["malformed_lines"][-1]["error"]
    assert (first["conversations"], first["turns"], first["ingested"], first["duplicates"]) == \
        (expect["conversations"], expect["turns"], expect["ingested"], 0)
    assert first["skipped"] == {"no next state": expect["no next state"],
                                "over the context limit": expect["over the context limit"]}

    again = ingest(tmp_path / "logs.jsonl", run.gateway_url)
    assert (again["ingested"], again["duplicates"]) == (0, expect["ingested"])

    deadline = time.monotonic() + 300
    while len(pool_samples(run)) < expect["ingested"] and time.monotonic() < deadline:
        time.sleep(1.0)
    samples = [s for s in pool_samples(run) if s.session_id.startswith("ingest-")]
    ids = [s.sample_id for s in samples]
    assert len(ids) == len(set(ids)) == expect["ingested"]  # every turn with a next state earns a signal here
    assert all(s.reward is not None for s in samples if s.teacher_logprobs is None)
    with_hints = [s for s in samples if s.hint and s.teacher_logprobs is not None]
    assert len(with_hints) > len(samples) // 10 and {s.reward for s in samples} >= {1.0, -1.0}
    assert any(s.hint == "Please answer in one line." for s in with_hints)  # explicit feedback became a hint
    assert all(len(s.rollout_logprobs) == s.response_len and s.temperature == 1.0 for s in samples)
    status = httpx.get(f"{run.gateway_url}/v1/status").json()
    assert status["ingested_turns"] == expect["ingested"]


@pytest.mark.slow
def test_ingest_with_a_run_of_its_own_trains_and_stops(tiny_model, tmp_path):
    expect = make_log(tmp_path / "logs.jsonl", conversations=60, malformed={2: "{oops"})
    run_dir = tmp_path / "run"
    out = subprocess.run([sys.executable, "-m", "clawr1.cli", "ingest", str(tmp_path / "logs.jsonl"),
                          "--config", "recipes/live/cpu.yaml", f"run.dir={run_dir}", "gateway.port=0"],
                         cwd=REPO, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["ingested"] == expect["ingested"] and summary["malformed_lines"][0]["line"] == 2
    trained = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()
               if '"pg_loss"' in line]
    assert len(trained) >= expect["ingested"] // 16 - 1  # the run trained on what came in before it stopped
    assert "[run] done" in out.stdout
