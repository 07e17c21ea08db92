"""The four loops on one GPU (issue 44): `clawr1 run` of the combined recipe with every process on one device.

On CUDA the model is a random bf16 Qwen2 of Qwen2.5-0.5B's shape (written here, no download) with the real
Qwen tokenizer from npm (clawr1/tokenizer_packages.py; pass --tokenizer-dir where it was carried). The run:
the policy engine and the frozen teacher engine (embedded, `serve.device=cuda`, bf16, each within
serve.memory_budget_gb of GPU memory), the gateway, the rules judge, the pool, the rollout's simulated users
and the trainer (bf16, the rest of the GPU), for --steps steps, weights handed over by `trainer.weight_sync`
(disk or http). Throughout, external clients (the official `openai` client) stream chat completions through
the gateway; they stop two steps before the end, so the run's own teardown never fails one of them.

`--device cpu` runs the same on CPU with clawr1's tiny model (tests/benchmarks/test_gpu_loops.py).

Whatever happens, the script stops every process it started (the `clawr1 run` supervisor, by PID, which
stops its loops; then any loop still alive, by PID) within its --budget-s and prints one JSON line (also
written to $OUT/gpu_loops.json when OUT is set): each stage's status, the error of a failed one, and:
  step_s            median wall time between the trainer's steps, and its parts: wait_s (waiting for a batch:
                    generation and judging), train_s, handover_s (the trainer's publish: weights to the engines)
  judge_latency_s   the judge's mean latency per turn
  engine_tokens_per_s  tokens the policy engine generated per second of the run (its /metrics counter)
  handover_ms_per_gb   publish time per GB of published weights
  logprob_gap       the trainer's mean |rollout log-prob - trainer log-prob| on served tokens (all steps, and the
                    steps whose samples all came from the trainer's own version: no staleness in the gap)
  client            requests, failed, chunks of the external clients
  peak_rss_mb / peak_gpu_mb  per process (VmHWM from /proc; nvidia-smi's per-process use, sampled each second)

Usage:
  python benchmarks/gpu_loops.py --tokenizer-dir .whl/tokenizer-qwen3     # CUDA, the 0.5B shape
  python benchmarks/gpu_loops.py --device cpu --steps 4                   # CPU, the tiny model

On a GPU machine that lacks the project's other wheels: `scripts/gpu_carry.sh` here (wheels and the tokenizer into
.whl/, about 30 MB), carry .whl with the run, and there
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
  python3 benchmarks/gpu_loops.py --tokenizer-dir .whl/tokenizer-qwen3 --budget-s 300 --workdir /tmp/gl
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Optional

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

MODULES = ("torch", "transformers", "safetensors", "megatron.core", "pydantic", "msgspec", "zmq", "orjson",
           "httptools", "httpx", "yaml", "fastapi", "uvicorn", "uvloop", "openai", "aiohttp")
TEARDOWN_S = 40.0  # kept from the budget for stopping the run
CLIENTS = 4
GIB = 1 << 30


def log(msg: str) -> None:
    print(f"[gpu_loops] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- stages
class Stages:
    """Runs named stages in order within a deadline; a failed stage records its error and the ones that need it
    are skipped."""

    def __init__(self, deadline: float):
        self.deadline = deadline
        self.status: dict[str, Any] = {}

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def run(self, name: str, fn: Callable[[], Any], *needs: str) -> Any:
        missing = [n for n in needs if self.status.get(n) != "ok"]
        if missing:
            self.status[name] = f"skipped: {', '.join(missing)} did not pass"
            return None
        t0 = time.monotonic()
        log(f"{name} ...")
        try:
            result = fn()
            self.status[name] = "ok"
            return result
        except Exception as e:  # recorded in the JSON line; the script goes on to its teardown
            self.status[name] = f"error: {type(e).__name__}: {e}"[:2000]
            log(f"{name} failed:\n{traceback.format_exc()}")
            return None
        finally:
            log(f"{name} {self.status[name][:200]} ({time.monotonic() - t0:.1f}s)")


def check_imports() -> dict[str, str]:
    import importlib

    found = {}
    for module in MODULES:
        try:
            m = importlib.import_module(module)
            found[module] = str(getattr(m, "__version__", "?"))
        except Exception as e:  # a missing wheel: named in the JSON line
            found[module] = f"missing: {type(e).__name__}"
    return found


# ---------------------------------------------------------------- the model
def qwen25_05b_config():
    from transformers import Qwen2Config

    # Qwen2.5-0.5B's config.json, by hand; eos 151645 (the end of a turn), as the instruct model's generation config
    return Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                       num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                       tie_word_embeddings=True, rope_theta=1e6, rms_norm_eps=1e-6, bos_token_id=151643,
                       eos_token_id=151645)


def write_random_model(out: Path, tokenizer_dir: Path) -> Path:
    """A random bf16 Qwen2 of Qwen2.5-0.5B's shape with the tokenizer files of `tokenizer_dir`."""
    import torch
    from transformers import Qwen2ForCausalLM

    for name in ("tokenizer.json", "tokenizer_config.json"):
        if not (tokenizer_dir / name).is_file():
            raise FileNotFoundError(f"{tokenizer_dir / name} is missing (carry the npm tokenizer's files)")
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Qwen2ForCausalLM(qwen25_05b_config()).to(torch.bfloat16)
    model.generation_config.eos_token_id = 151645
    model.to("cpu").save_pretrained(out)
    del model
    torch.cuda.empty_cache()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_dir / name, out / name)
    return out


def default_tokenizer_dir() -> Path:
    from clawr1.tokenizer_packages import tokenizer_dir

    return tokenizer_dir("qwen3")  # Qwen2.5's vocabulary; Qwen3 adds only special tokens (ids < 151936)


# ---------------------------------------------------------------- the run
def overrides(args, run_dir: Path, model: Optional[Path], ports: dict[str, int]) -> list[str]:
    common = [f"run.dir={run_dir}", f"run.max_steps={args.steps}", "tracking.wandb_mode=disabled",
              "rollout.eval_every=0", "judge.teacher=frozen", f"trainer.weight_sync={args.weight_sync}",
              f"gateway.port={ports['gateway']}", f"serve.port={ports['engine']}",
              f"judge.teacher_port={ports['teacher']}", "trainer.batch_wait_timeout_s=120"]
    common += args.set
    if args.device == "cpu":
        return common + ["pool.batch_size=8", "rollout.max_pool_backlog=12"] + ([f"model.path={model}"] if model else [])
    return common + [
        f"model.path={model}", "serve.device=cuda", "serve.dtype=bfloat16", f"serve.memory_budget_gb={args.engine_gb}",
        "serve.context_length=4096", "serve.max_running_requests=32", "trainer.precision=bf16",
        "trainer.transformer_engine=auto", "trainer.max_tokens_per_microbatch=8192", "trainer.num_threads=4",
        "rollout.concurrency=32", "rollout.max_pool_backlog=48", "rollout.max_tokens=64", "pool.batch_size=32",
        "judge.concurrency=32"]


class Run:
    """`clawr1 run` as a child process in its own session; its output kept; its loops' PIDs remembered."""

    def __init__(self, argv: list[str], run_dir: Path, engine_names: dict[str, str]):
        self.run_dir = run_dir
        self.engine_names = engine_names  # serve.port -> engine | teacher
        self.lines: list[str] = []
        self.proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())
            print(line, end="", file=sys.stderr, flush=True)

    def loop_pids(self) -> dict[int, str]:
        """{pid: name} of this run's loop processes (`python -m clawr1.cli LOOP --config RUN_DIR/...`)."""
        out = {}
        marker = str(self.run_dir).encode()
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            try:
                argv = cmdline.read_bytes().split(b"\0")
            except OSError:
                continue
            if b"clawr1.cli" in argv[:3] and any(marker in a for a in argv) and b"run" not in argv[3:4]:
                i = argv.index(b"clawr1.cli")
                port = next((a.decode().split("=")[1] for a in argv if a.startswith(b"serve.port=")), "")
                out[int(cmdline.parent.name)] = self.engine_names.get(port, argv[i + 1].decode())
        return out

    def stop(self, grace_s: float) -> None:
        """SIGTERM to the supervisor (it stops its loops, producers first), SIGKILL after grace_s; then any loop
        process still alive, by PID."""
        seen = self.loop_pids()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        for pid in seen:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.reader.join(timeout=5)


def trainer_steps(run_dir: Path) -> list[dict]:
    from clawr1.tracking import read_metrics

    return [r for r in read_metrics(run_dir, "trainer") if "pg_loss" in r]


def engine_tokens(url: str) -> Optional[int]:
    import httpx

    try:
        text = httpx.get(f"{url}/metrics", timeout=5).text
    except httpx.HTTPError:
        return None
    for line in text.splitlines():
        if line.startswith("clawr1_engine_generated_tokens_total "):
            return int(float(line.split()[1]))
    return None


class Sampler:
    """Every second: each loop's peak RSS (VmHWM) and, on CUDA, its GPU memory (nvidia-smi), keeping maxima."""

    def __init__(self, run: Run):
        self.run = run
        self.rss_mb: dict[str, float] = {}
        self.gpu_mb: dict[str, float] = {}
        self.gpu_used_mb = 0.0
        self.stop = threading.Event()
        self.smi = shutil.which("nvidia-smi")
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self.stop.wait(1.0):
            try:
                self.sample()
            except Exception as e:  # sampling must never end the run
                log(f"sampler: {type(e).__name__}: {e}")

    def sample(self) -> None:
        names = self.run.loop_pids()
        for pid, name in names.items():
            hwm = _status_kb(pid, "VmHWM:")
            if hwm is not None:
                self.rss_mb[name] = max(self.rss_mb.get(name, 0.0), hwm / 1024)
        if self.smi:
            for pid, mb in _gpu_processes(self.smi).items():
                if pid in names:
                    self.gpu_mb[names[pid]] = max(self.gpu_mb.get(names[pid], 0.0), mb)
            self.gpu_used_mb = max(self.gpu_used_mb, _gpu_used_mb(self.smi))


def _status_kb(pid: int, key: str) -> Optional[int]:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def _gpu_processes(smi: str) -> dict[int, float]:
    out = subprocess.run([smi, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=10).stdout
    rows = [line.split(",") for line in out.splitlines() if line.strip()]
    return {int(pid): float(mb) for pid, mb in rows if mb.strip().replace(".", "").isdigit()}


def _gpu_used_mb(smi: str) -> float:
    out = subprocess.run([smi, "--query-gpu=memory.used", "--format=csv,noheader,nounits"], capture_output=True,
                         text=True, timeout=10).stdout.split()
    return float(out[0]) if out else 0.0


# ---------------------------------------------------------------- the external clients
class Clients:
    """CLIENTS official openai clients, each streaming one chat completion after another through the gateway."""

    def __init__(self, gateway_url: str, max_tokens: int):
        self.url, self.max_tokens = gateway_url, max_tokens
        self.requests = self.failed = self.chunks = 0
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)
        self.thread.start()

    async def _main(self) -> None:
        import httpx
        import openai

        c = openai.AsyncOpenAI(base_url=f"{self.url}/v1", api_key="unused-on-loopback", max_retries=0, timeout=120)
        async with httpx.AsyncClient(base_url=self.url, timeout=60) as http:
            await asyncio.gather(*(self._client(i, c, http) for i in range(CLIENTS)))
        await c.close()

    async def _client(self, i: int, c, http) -> None:
        k = 0
        while not self.stop.is_set():
            sid, k = f"ext{i}-{k}", k + 1
            self.requests += 1
            try:
                stream = await c.chat.completions.create(
                    model="clawr1-policy", messages=[{"role": "user", "content": f"Convert {k} miles to km, client {i}."}],
                    max_tokens=self.max_tokens, stream=True, extra_headers={"X-Session-Id": sid})
                async for chunk in stream:
                    self.chunks += 1
                    if getattr(chunk, "error", None):
                        raise RuntimeError(str(chunk))
                (await http.post(f"/v1/sessions/{sid}/complete", json={})).raise_for_status()
            except Exception as e:  # every failure counts; the goal is zero
                self.failed += 1
                self.errors.append(f"{type(e).__name__}: {e}"[:300])
                await asyncio.sleep(0.5)

    def finish(self, timeout_s: float) -> None:
        self.stop.set()
        self.thread.join(timeout=timeout_s)

    def report(self) -> dict:
        return {"clients": CLIENTS, "requests": self.requests, "failed": self.failed, "chunks": self.chunks,
                "errors": self.errors[:5]}


def wait_for(check: Callable[[], bool], until: float, what: str, run: Run) -> None:
    while not check():
        if run.proc.poll() is not None:
            raise RuntimeError(f"`clawr1 run` exited with code {run.proc.returncode} before {what}:\n"
                               + "\n".join(run.lines[-25:]))
        if time.monotonic() > until:
            raise TimeoutError(f"{what} not reached within the time budget")
        time.sleep(0.5)


def healthy(url: str) -> Callable[[], bool]:
    def check() -> bool:
        import httpx

        try:
            return httpx.get(f"{url}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False
    return check


def drive(args, run: Run, stages: Stages, urls: dict[str, str], result: dict) -> None:
    """Clients on from the gateway's and the engine's start until two steps before the end; the engine's token
    counter around it."""
    for name in ("gateway", "engine"):
        wait_for(healthy(urls[name]), stages.deadline - TEARDOWN_S, f"the {name}'s start", run)
    t0, tok0 = time.monotonic(), engine_tokens(urls["engine"]) or 0
    clients = Clients(urls["gateway"], args.client_max_tokens)
    try:
        last = max(args.steps - 2, 1)
        wait_for(lambda: len(trainer_steps(run.run_dir)) >= last, stages.deadline - TEARDOWN_S,
                 f"trainer step {last}", run)
    finally:
        clients.finish(timeout_s=60)
        result["client"] = clients.report()
        tok1 = engine_tokens(urls["engine"])
        if tok1 is not None:
            result["engine_tokens_per_s"] = round((tok1 - tok0) / (time.monotonic() - t0), 1)
    wait_for(lambda: run.proc.poll() is not None, stages.deadline - TEARDOWN_S, "the run's end", run)
    if run.proc.returncode != 0:
        raise RuntimeError(f"`clawr1 run` exited with code {run.proc.returncode}:\n" + "\n".join(run.lines[-25:]))


def _median(values: list[float]) -> Optional[float]:
    return round(statistics.median(values), 4) if values else None


def summarize(run_dir: Path) -> dict:
    """Step time and its parts, handover, log-prob gap from metrics.jsonl (the first step is startup: left out)."""
    from clawr1.tracking import read_metrics

    steps = trainer_steps(run_dir)
    out: dict[str, Any] = {"steps": len(steps)}
    if not steps:
        return out
    gaps = [b["time"] - a["time"] for a, b in zip(steps, steps[1:])]
    waits = [b["time"] - b["step_s"] - a["time"] for a, b in zip(steps, steps[1:])]
    out.update(step_s=_median(gaps), wait_s=_median(waits), train_s=_median([s["train_s"] for s in steps[1:]]),
               handover_s=_median([s.get("publish_s", float("nan")) for s in steps[1:]]),
               trainer_tokens_per_s=_median([s["tokens_per_s"] for s in steps[1:]]))
    published = [(s["publish_s"], s["published_bytes"]) for s in steps if s.get("published_bytes")]
    if published:
        out["handover_gb"] = round(published[-1][1] / 1e9, 3)
        out["handover_ms_per_gb"] = round(statistics.median(t * 1000 / (b / 1e9) for t, b in published), 1)
    fresh = [s["logprob_abs_diff"] for s in steps if s.get("staleness_max") == 0]
    out["logprob_gap"] = {"mean_all_steps": _median([s["logprob_abs_diff"] for s in steps]),
                          "mean_fresh_steps": _median(fresh), "fresh_steps": len(fresh),
                          "kl_rollout": _median([s["kl_rollout"] for s in steps])}
    judge = read_metrics(run_dir, "judge")
    if judge:
        out["judge_latency_s"] = round(judge[-1].get("mean_latency_s", 0.0), 4)
        out["judged"] = judge[-1].get("judged")
    return out


# ---------------------------------------------------------------- main
def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--budget-s", type=float, default=300.0, help="the whole script, teardown included")
    p.add_argument("--workdir", default="", help="model and run directory (default: a temporary one)")
    p.add_argument("--tokenizer-dir", default="", help="the Qwen tokenizer's files (default: the npm cache)")
    p.add_argument("--weight-sync", choices=("disk", "http", "ipc"), default="disk")
    p.add_argument("--engine-gb", type=float, default=8.0, help="serve.memory_budget_gb of each engine (GPU memory)")
    p.add_argument("--client-max-tokens", type=int, default=32)
    p.add_argument("--model", default="", help="cpu: an HF model directory instead of the tiny model")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a config override for the run (repeatable), e.g. pool.max_staleness=0 for on-policy steps")
    args = p.parse_args()
    start = time.monotonic()
    stages = Stages(start + args.budget_s)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="clawr1-gpu-loops-"))
    work.mkdir(parents=True, exist_ok=True)
    run_dir = work / "run"
    result: dict[str, Any] = {"benchmark": "gpu_loops", "device": args.device, "steps_asked": args.steps,
                              "weight_sync": args.weight_sync, "stages": stages.status}
    run: Optional[Run] = None
    sampler: Optional[Sampler] = None
    try:
        result["imports"] = stages.run("imports", check_imports)
        missing = [m for m, v in (result["imports"] or {}).items() if v.startswith("missing")]
        if missing:
            stages.status["imports"] = f"error: missing {', '.join(missing)}"
        result["gpu"] = stages.run("device", lambda: describe_device(args.device), "imports")
        model = None
        if args.device == "cuda":
            tok = Path(args.tokenizer_dir) if args.tokenizer_dir else None
            model = stages.run("model", lambda: write_random_model(work / "model", tok or default_tokenizer_dir()),
                               "device")
        else:
            model = Path(args.model) if args.model else None  # None: the tiny model clawr1 builds and caches itself
            stages.status["model"] = "ok"
        from clawr1.ports import free_port

        ports = {name: free_port() for name in ("gateway", "engine", "teacher")}
        urls = {"gateway": f"http://127.0.0.1:{ports['gateway']}", "engine": f"http://127.0.0.1:{ports['engine']}"}
        argv = [sys.executable, "-m", "clawr1.cli", "run", "recipes/combined/cpu.yaml", "--overwrite",
                *overrides(args, run_dir, model, ports)]
        result["command"] = " ".join(argv[1:])

        def start_run() -> None:
            nonlocal run, sampler
            run = Run(argv, run_dir, {str(ports["engine"]): "engine", str(ports["teacher"]): "teacher"})
            sampler = Sampler(run)

        stages.run("start", start_run, "model")
        stages.run("loops", lambda: drive(args, run, stages, urls, result), "start")
    finally:
        if sampler is not None:
            sampler.stop.set()
        if run is not None:
            run.stop(grace_s=max(min(TEARDOWN_S - 10, stages.left()), 5))
            result["run_exit_code"] = run.proc.returncode
            if stages.status.get("loops") != "ok":
                result["run_output_tail"] = run.lines[-30:]
        if sampler is not None:
            result["peak_rss_mb"] = {k: round(v) for k, v in sorted(sampler.rss_mb.items())}
            result["peak_gpu_mb"] = {k: round(v) for k, v in sorted(sampler.gpu_mb.items())}
            result["gpu_used_peak_mb"] = round(sampler.gpu_used_mb)
        try:
            result.update(summarize(run_dir))
        except Exception as e:  # a partial metrics file: say so, print the rest
            result["summary_error"] = f"{type(e).__name__}: {e}"
        result["wall_s"] = round(time.monotonic() - start, 1)
        emit(result, run_dir)
    return 0 if all(v == "ok" for v in stages.status.values()) else 1


def describe_device(device: str) -> dict:
    import torch

    if device == "cpu":
        return {"name": "cpu", "threads": torch.get_num_threads()}
    if not torch.cuda.is_available():
        raise RuntimeError("CUDA is not available (use --device cpu)")
    props = torch.cuda.get_device_properties(0)
    return {"name": props.name, "memory_gb": round(props.total_memory / GIB, 1), "torch": torch.__version__}


def portable(text: str, work: Path) -> str:
    """`text` without this machine's paths (results are committed): the work directory, the repository and
    Python's standard library become WORKDIR, the repository-relative path and PYTHON_LIB."""
    for path, name in ((work, "WORKDIR"), (REPO, ""), (Path(sysconfig.get_paths()["stdlib"]), "PYTHON_LIB")):
        text = text.replace(f"{path}/", f"{name}/" if name else "").replace(str(path), name or ".")
    return text


def emit(result: dict, run_dir: Path) -> None:
    """The JSON line on stdout; with OUT set, also OUT/gpu_loops.json and the last 256 KB of each loop's log."""
    line = portable(json.dumps(result, default=str), run_dir.parent)
    print(line, flush=True)
    out = os.environ.get("OUT")
    if out:
        Path(out, "gpu_loops.json").write_text(line + "\n")
        for f in sorted((run_dir / "logs").glob("*.log")) if (run_dir / "logs").is_dir() else []:
            (Path(out) / "logs").mkdir(exist_ok=True)
            Path(out, "logs", f.name).write_bytes(f.read_bytes()[-(256 << 10):])


if __name__ == "__main__":
    sys.exit(main())
