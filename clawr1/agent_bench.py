"""`clawr1 bench ENV`: score an agent on an environment's tasks (pass@1, unbiased pass@k, pass^k).

    clawr1 bench envs/terminal --agent oracle                  # calibrate: the reference solutions pass
    clawr1 bench envs/toolcall --tasks bfcl:simple --agent oracle
    clawr1 bench envs/toolcall --tasks learnable --agent policy --samples 4 --config recipes/toolcall/cpu.yaml
    clawr1 bench envs/toolcall --agent policy --gateway http://127.0.0.1:8000

ENV is a package path whose `env` module names its class in `ENVIRONMENT` (envs/toolcall), or an
import path (package.module:Class); it must implement `clawr1.environment.TaskEnvironment`.
`--agent oracle|null` are the environment's scripted agents (no model); `policy` talks to a gateway:
a running one (`--gateway`), or an engine and gateway started here from `--config`. Policy episodes
are side turns: a benchmark never trains. Prints a per-task table and one JSON line; writes a
markdown report (and a PNG of the pass rate per category) next to `--out`.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import yaml

from clawr1.environment import EpisodeResult, TaskEnvironment, close_environment
from clawr1.runtime import load_object

CONCURRENCY = {"policy": 4, "oracle": 8, "null": 8, "wrong": 8}


# ---------------------------------------------------------------- the math (pure)
def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al., 2021): the chance that at least one of k of the n samples passed."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    return 1.0 if n - c < k else 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_hat_k(n: int, c: int, k: int) -> float:
    """pass^k (tau-bench): the chance that all of k of the n samples passed."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    return math.comb(c, k) / math.comb(n, k)


@dataclass
class TaskScore:
    task_id: str
    category: str
    results: list[EpisodeResult]

    @property
    def successes(self) -> int:
        return sum(r.passed for r in self.results)


def summarize(scores: list[TaskScore], k: int) -> dict[str, Any]:
    results = [r for s in scores for r in s.results]
    n_tasks = max(len(scores), 1)
    return {
        "tasks": len(scores), "samples": k,
        "pass@1": sum(pass_at_k(len(s.results), s.successes, 1) for s in scores) / n_tasks,
        f"pass@{k}": sum(pass_at_k(len(s.results), s.successes, k) for s in scores) / n_tasks,
        f"pass^{k}": sum(pass_hat_k(len(s.results), s.successes, k) for s in scores) / n_tasks,
        "mean_turns": statistics.fmean(r.turns for r in results) if results else 0.0,
        "tool_errors": sum(r.tool_errors for r in results), "timeouts": sum(r.timeouts for r in results),
        "failed": sum(s.successes < len(s.results) for s in scores),
        "failed_tasks": [s.task_id for s in scores if s.successes < len(s.results)][:20],  # the first 20: see the report
    }


# ---------------------------------------------------------------- running
def load_environment(spec: str, args: dict, seed: int = 0) -> TaskEnvironment:
    """`envs/toolcall` (its env module's ENVIRONMENT) or `package.module:Class`, built with `args`."""
    if ":" in spec:
        cls = load_object(spec, "the environment")
    else:
        module = ".".join(Path(spec.rstrip("/")).parts) + ".env"
        cls = load_object(f"{module}:ENVIRONMENT", f"the environment of {spec}")
    env = cls(args, seed=seed)
    if not isinstance(env, TaskEnvironment):
        raise TypeError(f"{spec} is not a task environment (see clawr1.environment.TaskEnvironment)")
    return env


async def run_bench(env: TaskEnvironment, tasks: list[Any], agent_kind: str, client: Any, samples: int,
                    echo=print) -> list[TaskScore]:
    """Every task `samples` times (bounded concurrency); one TaskScore per task, in task order."""
    slots = asyncio.Semaphore(CONCURRENCY.get(agent_kind, 4))
    tag = f"bench-{random.getrandbits(32):08x}"
    done = 0

    async def attempt(task: Any, k: int) -> EpisodeResult:
        nonlocal done
        async with slots:
            agent = env.scripted_agent(agent_kind) if client is None else client
            result = await env.run_task(agent, task, f"{tag}-{task.id}-{k}", side=True)
        done += 1
        if done % 50 == 0:
            echo(f"[bench] {done}/{len(tasks) * samples} episodes")
        return result

    per_task = await asyncio.gather(*(asyncio.gather(*(attempt(t, k) for k in range(samples))) for t in tasks))
    return [TaskScore(t.id, t.category, list(rs)) for t, rs in zip(tasks, per_task)]


@contextlib.contextmanager
def serving_stack(config: str, overrides: list[str], run_dir: Path) -> Iterator[str]:
    """An engine and a gateway from a recipe, on free ports; the gateway's URL. Stopped on exit."""
    from clawr1.config import load_config, save_config
    from clawr1.ports import assign_free_ports
    from clawr1.runtime import start_process, stop_processes, wait_http

    cfg = assign_free_ports(load_config(config, [*overrides, f"run.dir={run_dir}"]))
    run_dir.mkdir(parents=True, exist_ok=True)
    save_config(cfg, run_dir / "config.yaml")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    procs = []
    try:
        for loop in ("serve", "gateway"):
            cmd = [sys.executable, "-m", "clawr1.cli", loop, "--config", str(run_dir / "config.yaml")]
            procs.append(start_process(cmd, run_dir / "logs" / f"{loop}.log", env))
        wait_http(f"{cfg.engine_url}/health", procs[0], cfg.run.startup_timeout_s)
        wait_http(f"{cfg.gateway_url}/health", procs[1], cfg.run.startup_timeout_s)
        yield cfg.gateway_url
    finally:
        stop_processes(procs, cfg.run.stop_timeout_s)


# ---------------------------------------------------------------- reporting
def task_table(scores: list[TaskScore]) -> str:
    lines = ["| task | category | passed | mean turns | tool errors | wall s | why the first failure failed |",
             "|---|---|---|---|---|---|---|"]
    for s in scores:
        rs = s.results
        lines.append(f"| {s.task_id} | {s.category} | {s.successes}/{len(rs)} | "
                     f"{statistics.fmean(r.turns for r in rs):.1f} | {sum(r.tool_errors for r in rs)} | "
                     f"{statistics.fmean(r.wall_s for r in rs):.1f} | {_first_failure(rs)} |")
    return "\n".join(lines) + "\n"


def _first_failure(results: list[EpisodeResult]) -> str:
    """The reason the environment gave for the first failed attempt (its details' `reason`), table-safe."""
    failed = [r for r in results if not r.passed]
    reason = str(failed[0].details.get("reason", "")) if failed else ""
    return reason.replace("|", "\\|").replace("\n", " ")[:200]


def category_rates(scores: list[TaskScore]) -> dict[str, float]:
    by: dict[str, list[float]] = {}
    for s in scores:
        by.setdefault(s.category, []).append(s.successes / len(s.results))
    return {c: statistics.fmean(v) for c, v in sorted(by.items())}


def report_prefix(env: str, tasks: str | None, agent: str, out: str | None = None) -> Path:
    """`out` when given, else runs/bench/<env>-<task set>-<agent>, the task set named by its last path component."""
    if out:
        return Path(out)
    # the last path component: "/abs/dir/" -> "dir", "." -> the current directory's name; "bfcl:simple" stays whole
    task_set = Path(os.path.abspath(tasks)).name if tasks else "default"
    return Path("runs/bench") / f"{Path(env).name}-{task_set or 'root'}-{agent}".replace(":", "_")


def write_report(out: Path, title: str, summary: dict, scores: list[TaskScore]) -> list[Path]:
    out.parent.mkdir(parents=True, exist_ok=True)
    md = out.with_name(out.name + ".md")  # appended: a prefix may hold a dot that is not a suffix
    rates = category_rates(scores)
    body = [f"# {title}", "", "```json", json.dumps(summary, indent=1), "```", "",
            "| category | pass rate |", "|---|---|", *(f"| {c} | {r:.3f} |" for c, r in rates.items()), "",
            task_table(scores)]
    written = [md]
    if len(rates) > 1:
        png = out.with_name(out.name + ".png")
        _plot(rates, png, title)
        body.insert(2, f"![pass rate per category]({png.name})\n")
        written.append(png)
    md.write_text("\n".join(body))
    return written


def _plot(rates: dict[str, float], png: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(5, len(rates) * 0.9), 3.5))
    ax.bar(list(rates), list(rates.values()), color="#4c78a8")
    ax.set_ylim(0, 1)
    ax.set_ylabel("pass rate")
    ax.set_title(title, fontsize=10)
    plt.setp(ax.get_xticklabels(), rotation=30, ha="right")
    fig.tight_layout()
    fig.savefig(png, dpi=80)
    plt.close(fig)


# ---------------------------------------------------------------- the command
def _env_args(pairs: list[str]) -> dict:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"clawr1 bench: --env-arg {pair!r} is not key=value")
        out[key] = yaml.safe_load(value)
    return out


def main(args) -> int:
    """`clawr1 bench` (args from clawr1/cli.py)."""
    if args.agent == "policy" and not (args.gateway or args.config):
        print("clawr1 bench: --agent policy needs --gateway URL (a running gateway) or --config RECIPE", file=sys.stderr)
        return 2
    env = load_environment(args.env, _env_args(args.env_arg), seed=args.seed)
    tasks = env.tasks(args.tasks)
    if args.limit:
        tasks = tasks[: args.limit]
    if not tasks:
        print(f"clawr1 bench: no tasks in {args.env} for {args.tasks!r}", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    echo = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731 (the table and JSON go to stdout)
    try:
        scores = asyncio.run(_with_agent(env, tasks, args, echo))
    finally:
        close_environment(env)  # an environment that holds a process (a browser) releases it
    summary = {"benchmark": "bench", "env": args.env, "task_set": args.tasks or "default", "agent": args.agent,
               **summarize(scores, args.samples), "wall_s": round(time.monotonic() - t0, 1)}
    if getattr(env, "pass_name", ""):  # what the environment calls a pass (SWE: resolved_rate), beside pass@1
        summary[env.pass_name] = summary["pass@1"]
    overhead = env.sandbox_overhead_s()
    summary["sandbox_overhead_ms_per_command"] = None if overhead is None else round(overhead * 1000, 2)
    out = report_prefix(args.env, args.tasks, args.agent, args.out)
    written = write_report(out, f"{args.env} {args.tasks or ''} ({args.agent} agent, {args.samples} samples)",
                           summary, scores)
    print(task_table(scores))
    print(f"wrote {', '.join(str(p) for p in written)}")
    print(json.dumps(summary), flush=True)
    return 0


async def _with_agent(env: TaskEnvironment, tasks: list[Any], args, echo) -> list[TaskScore]:
    if args.agent != "policy":
        return await run_bench(env, tasks, args.agent, None, args.samples, echo)
    from clawr1.chat_client import GatewayChat

    with contextlib.ExitStack() as stack:
        url = args.gateway or stack.enter_context(serving_stack(args.config, args.overrides, Path(args.run_dir)))
        chat = GatewayChat(url.rstrip("/").removesuffix("/v1"), os.environ.get(args.api_key_env), "clawr1-policy",
                           args.max_tokens, args.temperature)
        try:
            return await run_bench(env, tasks, "policy", chat, args.samples, echo)
        finally:
            await chat.close()
