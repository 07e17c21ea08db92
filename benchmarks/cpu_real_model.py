"""Qwen2.5-Coder-0.5B-Instruct with LoRA on this CPU: the trainer, the engine and the teacher, fp32 against bf16.

Prints one JSON line. Every figure is measured in this run beside its baseline, as a ratio:
- trainer: tokens/s of one LoRA step (rank 16, every linear, the recipe's micro-batch) on the same samples, for
  clawr1's Megatron trainer in fp32 (today's path) and in the dtype `trainer.precision=bf16` gives on this CPU
  (bf16, or fp32 where the CPU lacks bf16 instructions: clawr1/cpu_dtype.py), beside plain transformers
  (`AutoModelForCausalLM`, base frozen, gradients to the activations, logits at the response tokens only) in fp32
  and in bf16;
- engine: generated tokens/s at 1, 4 (today's recipe), 8 and 32 concurrent requests: today's engine (fp32, MKL's
  product), the fp32 engine with its weights prepacked for oneDNN (serve.cpu_prepack), and bf16 (run.cpu_bf16=on);
- teacher: scored tokens/s of 8 teacher-scoring requests (prompt log-probs of the response only);
- gap: mean |engine - trainer| log-prob over response tokens of sampled answers, in the engine's and trainer's dtype;
- run (--run): seconds from `clawr1 run` to the first trainer step, and per step, of the combined LoRA recipe.

Paths that torch emulates on this CPU (bf16 without avx512_bf16/AMX) run once, without a warm-up, on short samples
(--slow-samples of 40 tokens) or few requests: their rate is what matters, and a whole batch would take many
minutes.

Usage: python benchmarks/cpu_real_model.py [--parts trainer,engine,teacher,gap] [--run] [--threads 2]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from clawr1.config import ModelConfig, load_config  # noqa: E402
from clawr1.cpu_dtype import cpu_dtype, cpu_flags, cpu_has_bf16  # noqa: E402
from clawr1.model_path import resolve_model_path  # noqa: E402
from clawr1.protocol import Sample  # noqa: E402

MODEL = "qwen2.5-coder-0.5b-instruct"
RECIPE = "recipes/combined/cpu_qwen05_lora.yaml"


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def samples(n: int, seed: int = 0, short: bool = False) -> list[Sample]:
    """Shaped like the personal environment's turns: 80-130 prompt tokens, 25-45 response tokens (short: 30 and 10,
    for paths torch emulates)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        p, r = (30, 10) if short else (rng.randint(80, 130), rng.randint(25, 45))
        out.append(Sample(sample_id=f"s{i}", group_id=f"g{i // 4}", tokens=[rng.randrange(1000, 50000) for _ in range(p + r)],
                          prompt_len=p, loss_mask=[1] * r, rollout_logprobs=[-2.0] * r, versions=[0] * r,
                          reward=float(i % 2), teacher_logprobs=[-1.5] * r))
    return out


# ---------------------------------------------------------------- trainer
def megatron_rate(path: Path, dtype: torch.dtype, batch: list[Sample], rounds: int) -> float:
    from clawr1.trainer.lora import TARGETS, LoraAdapters, LoraShape
    from clawr1.trainer.model import build_policy
    from clawr1.trainer.optim import SlotAdamW
    from clawr1.trainer.step import train_step

    cfg = load_config(RECIPE)
    policy = build_policy(path, dtype=dtype)
    policy.model.requires_grad_(False)
    policy.lora = LoraAdapters(policy.model, policy.arch, LoraShape(cfg.lora.rank, cfg.lora.alpha, TARGETS, 1), 1, 0)
    optimizer = SlotAdamW([policy.lora.slot_parameters(0)], cfg.trainer, 16, 1, 1)
    mb = cfg.trainer.max_tokens_per_microbatch
    return timed_rate(lambda: train_step(policy, optimizer, batch, cfg.algo, mb), batch, rounds)


def hf_rate(path: Path, dtype: torch.dtype, batch: list[Sample], rounds: int) -> float:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).requires_grad_(False)

    def step() -> None:
        for s in batch:  # one sample at a time: no padding
            ids = torch.tensor([s.tokens])
            embeds = model.model.embed_tokens(ids).detach().requires_grad_(True)
            hidden = model.model(inputs_embeds=embeds).last_hidden_state[0, s.prompt_len - 1:-1]
            logp = torch.log_softmax(model.lm_head(hidden).float(), dim=-1)
            logp.gather(1, torch.tensor(s.tokens[s.prompt_len:])[:, None]).sum().backward()

    return timed_rate(step, batch, rounds)


def timed_rate(step, batch: list[Sample], rounds: int) -> float:
    """Tokens/s: the median of `rounds` timed steps after one warm-up step (rounds 0: one step, no warm-up)."""
    if not rounds:
        t0 = time.perf_counter()
        step()
        return sum(len(s.tokens) for s in batch) / (time.perf_counter() - t0)
    step()
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return sum(len(s.tokens) for s in batch) / sorted(times)[len(times) // 2]


def trainer_part(path: Path, args) -> dict:
    from clawr1.trainer.megatron_setup import init_parallel

    init_parallel(1)
    fast, _ = cpu_dtype(torch.bfloat16, "auto")
    full, few = samples(args.samples), samples(args.slow_samples, seed=1, short=True)
    native = cpu_has_bf16()
    out = {"samples": len(full), "tokens": sum(len(s.tokens) for s in full),
           "response_tokens": sum(s.response_len for s in full),
           "megatron_fp32_tok_s": megatron_rate(path, torch.float32, full, args.rounds),
           "hf_fp32_tok_s": hf_rate(path, torch.float32, full, args.rounds)}
    bf16_batch = full if native else few  # emulated bf16: fewer samples
    out["hf_bf16_tok_s"] = hf_rate(path, torch.bfloat16, bf16_batch, args.rounds if native else 0)
    out["hf_bf16_tokens"] = sum(len(s.tokens) for s in bf16_batch)
    if fast == torch.bfloat16:
        out["megatron_bf16_tok_s"] = megatron_rate(path, torch.bfloat16, full, args.rounds)
    out["megatron_chosen_tok_s"] = out["megatron_bf16_tok_s"] if fast == torch.bfloat16 else out["megatron_fp32_tok_s"]
    out["chosen_vs_fp32"] = out["megatron_chosen_tok_s"] / out["megatron_fp32_tok_s"]
    out["chosen_vs_hf_bf16"] = out["megatron_chosen_tok_s"] / out["hf_bf16_tok_s"]
    out["chosen_vs_hf_fp32"] = out["megatron_chosen_tok_s"] / out["hf_fp32_tok_s"]
    return out


# ---------------------------------------------------------------- engine, teacher and the log-prob gap
def start_engine(run_dir: Path, threads: int, running: int, overrides: list[str]):
    from clawr1.devtools import LoopProcess, local_config

    cfg = local_config(run_dir, f"model.name={MODEL}", f"serve.num_threads={threads}",
                       f"serve.max_running_requests={running}", "serve.context_length=2048", *overrides, recipe=RECIPE)
    engine = LoopProcess(cfg, "serve")
    engine.wait_http(f"{cfg.engine_url}/health", timeout=600)
    return cfg, engine


async def generate_all(url: str, bodies: list[dict]) -> tuple[list[dict], float]:
    import httpx

    async with httpx.AsyncClient(timeout=3600) as client:
        t0 = time.perf_counter()
        replies = await asyncio.gather(*(client.post(f"{url}/generate", json=b) for b in bodies))
        elapsed = time.perf_counter() - t0
    for r in replies:
        r.raise_for_status()
    return [r.json() for r in replies], elapsed


def decode_rates(url: str, prompt: list[int], levels: list[int], tokens: int) -> dict:
    body = {"input_ids": prompt, "sampling_params": {"max_new_tokens": tokens, "ignore_eos": True, "temperature": 1.0}}
    asyncio.run(generate_all(url, [body] * 2))  # warm-up
    out = {}
    for n in levels:
        replies, elapsed = asyncio.run(generate_all(url, [body] * n))
        out[str(n)] = sum(len(r["output_ids"]) for r in replies) / elapsed
    return out


def teacher_rate(url: str, batch: list[Sample]) -> float:
    """Scored response tokens/s of teacher requests: max_new_tokens 0, log-probs from the response's first token."""
    bodies = [{"input_ids": s.tokens, "sampling_params": {"max_new_tokens": 0, "temperature": 0.0},
               "return_logprob": True, "logprob_start_len": s.prompt_len - 1} for s in batch]
    _, elapsed = asyncio.run(generate_all(url, bodies))
    return sum(len(s.tokens) for s in batch) / elapsed


def sampled_answers(url: str, prompts: list[list[int]], tokens: int) -> list[Sample]:
    bodies = [{"input_ids": p, "sampling_params": {"max_new_tokens": tokens, "temperature": 1.0, "sampling_seed": i},
               "return_logprob": True} for i, p in enumerate(prompts)]
    replies, _ = asyncio.run(generate_all(url, bodies))
    out = []
    for i, (p, r) in enumerate(zip(prompts, replies)):
        ids = r["output_ids"]
        lps = [e[0] for e in r["meta_info"]["output_token_logprobs"]]
        out.append(Sample(sample_id=f"a{i}", group_id="g", tokens=p + ids, prompt_len=len(p), loss_mask=[1] * len(ids),
                          rollout_logprobs=lps, versions=[0] * len(ids)))
    return out


def logprob_gap(path: Path, answers: list[Sample], dtype: torch.dtype) -> float:
    """Mean |engine - trainer| log-prob over the answers' response tokens, the trainer's base in `dtype`."""
    from clawr1.trainer.megatron_setup import init_parallel
    from clawr1.trainer.model import build_policy, pack, packed_logprobs

    init_parallel(1)
    policy = build_policy(path, dtype=dtype)
    with torch.no_grad():
        trainer = packed_logprobs(policy, pack([a.tokens for a in answers], [a.prompt_len for a in answers]))
    engine = torch.tensor([x for a in answers for x in a.rollout_logprobs])
    return float((trainer - engine).abs().mean())


def prompts(path: Path, n: int) -> list[list[int]]:
    from transformers import AutoTokenizer

    from clawr1.chat import ChatRenderer

    renderer = ChatRenderer(AutoTokenizer.from_pretrained(path))
    return [renderer.encode_messages([{"role": "user", "content": f"What is {3 + i} km plus {4 + 2 * i} km?"}])
            for i in range(n)]


ENGINES = {  # label: the engine's settings
    "today": ["serve.dtype=float32", "serve.cpu_prepack=false"],  # before this benchmark's changes
    "fp32": ["serve.dtype=float32", "serve.cpu_prepack=true"],
    "bf16": ["serve.dtype=bfloat16", "run.cpu_bf16=on"],  # bf16 even where torch emulates it
}


def engine_part(path: Path, args, label: str, parts: set[str]) -> dict:
    slow = label == "bf16" and not cpu_has_bf16()
    out: dict = {}
    with tempfile.TemporaryDirectory() as d:
        cfg, engine = start_engine(Path(d), args.threads, max(args.levels), ENGINES[label])
        try:
            asked = prompts(path, max(args.levels))
            if "engine" in parts:
                levels = [1, 4] if slow else args.levels
                out["decode_tok_s"] = decode_rates(cfg.engine_url, asked[0], levels, 8 if slow else args.decode_tokens)
            if "teacher" in parts:
                out["teacher_tok_s"] = teacher_rate(cfg.engine_url, samples(1 if slow else 8, seed=2))
            if "gap" in parts:
                answers = sampled_answers(cfg.engine_url, asked[:2 if slow else 4], 16 if slow else 32)
                trainer_dtype = torch.bfloat16 if label == "bf16" else torch.float32
                out["logprob_gap"] = logprob_gap(path, answers, trainer_dtype)
                out["gap_tokens"] = sum(a.response_len for a in answers)
        finally:
            engine.stop()
    if slow:
        out["emulated"] = "torch emulates bf16 on this CPU: fewer requests and tokens"
    return out


def ratios(new: dict, today: dict) -> dict:
    """Decode at each level against today's at the same level and at 4 (today's recipe), teacher scoring."""
    out = {}
    dn, dt = new.get("decode_tok_s", {}), today.get("decode_tok_s", {})
    for n, v in dn.items():
        if n in dt:
            out[f"decode_{n}_vs_today_{n}"] = v / dt[n]
        if "4" in dt:
            out[f"decode_{n}_vs_today_4"] = v / dt["4"]
    if "teacher_tok_s" in new and "teacher_tok_s" in today:
        out["teacher_vs_today"] = new["teacher_tok_s"] / today["teacher_tok_s"]
    return out


# ---------------------------------------------------------------- a whole run
def run_part(args) -> dict:
    """`clawr1 run` of the recipe for --run-steps steps: when its first step ended and how long each took."""
    import subprocess

    from clawr1.tracking import read_metrics

    with tempfile.TemporaryDirectory() as d:
        cmd = [sys.executable, "-m", "clawr1.cli", "run", RECIPE, f"run.dir={d}/run", f"run.max_steps={args.run_steps}",
               "rollout.eval_every=0", *args.run_set]
        t0 = time.time()
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
        wall = time.time() - t0
        if proc.returncode:
            return {"error": (proc.stdout + proc.stderr)[-3000:]}
        rows = [r for r in read_metrics(Path(d) / "run", "trainer") if "step_s" in r]
    return {"steps": len(rows), "wall_s": wall, "overrides": args.run_set,
            "samples_per_step": [r["samples"] for r in rows], "tokens_per_step": [r["tokens"] for r in rows],
            "first_step_done_s": rows[0]["time"] - t0 if rows else None,
            "step_interval_s": [b["time"] - a["time"] for a, b in zip(rows, rows[1:])],
            "trainer_step_s": [r["step_s"] for r in rows], "trainer_tok_s": [r["tokens_per_s"] for r in rows]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--parts", default="trainer,engine,teacher,gap")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--samples", type=int, default=8, help="the trainer's batch (the recipe's pool.batch_size)")
    ap.add_argument("--slow-samples", type=int, default=1, help="samples for paths torch emulates on this CPU")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--levels", type=int, nargs="+", default=[1, 4, 8, 32])
    ap.add_argument("--decode-tokens", type=int, default=32)
    ap.add_argument("--engines", nargs="+", default=list(ENGINES), choices=list(ENGINES))
    ap.add_argument("--run", action="store_true", help="also time a whole run of the recipe")
    ap.add_argument("--run-steps", type=int, default=2)
    ap.add_argument("--run-set", nargs="*", default=[])
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    parts = set(args.parts.split(",")) if args.parts else set()
    path = resolve_model_path(ModelConfig(name=MODEL))
    chosen, why = cpu_dtype(torch.bfloat16, "auto")
    result: dict = {"benchmark": "cpu_real_model", "model": MODEL, "cpu": cpu_name(), "threads": args.threads,
                    "torch": torch.__version__, "cpu_bf16_flags": sorted(cpu_flags() & {"avx512_bf16", "amx_bf16"}),
                    "bf16_runs_as": str(chosen).removeprefix("torch."), "fallback": why}
    if "trainer" in parts:
        result["trainer"] = trainer_part(path, args)
    engine_parts = parts & {"engine", "teacher", "gap"}
    if engine_parts:
        engines = {label: engine_part(path, args, label, engine_parts) for label in args.engines}
        result["engines"] = engines
        new = "bf16" if chosen == torch.bfloat16 else "fp32"  # what the recipe's settings give on this CPU
        if new in engines and "today" in engines:
            result["engine_ratios"] = {"chosen": new, **ratios(engines[new], engines["today"])}
    if args.run:
        result["run"] = run_part(args)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
