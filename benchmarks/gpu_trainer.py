"""The trainer's speed without TransformerEngine (issues 44, 64): attention forms, a profile, fused kernels, MFU on
two shapes.

For each model shape (random bf16 weights of Qwen2.5-0.5B's and Qwen2.5-1.5B's shapes on CUDA; a tiny
Qwen2 in fp32 with --device cpu), built by the trainer's own `main.build`:

  attention  training steps on the same batches with three variants "<attention>/<rotary>" of
             `trainer.varlen_attention`: per_sequence/megatron (the old path: one SDPA call per sample,
             megatron's per-sample rotary) as the baseline, varlen/megatron (the whole pack in one flash
             call; masked, one SDPA call with a block-diagonal mask, on CPU or where varlen fails) and
             varlen/core (rotary applied to the whole pack in the core attention, the new default):
             tokens/s, model TFLOPS, MFU, peak memory (a variant that runs out of memory is retried once
             at half the micro-batch)
  parity     packed log-probs of the same samples, the new path against the old (no grad)
  profile    one training step of the new path under torch.profiler: device time by op, grouped
             (attention, matmul, norm, rotary, log-prob, optimizer, copy, other; by op name, see GROUPS),
             the top ops, and the share of the step's wall time the device was busy
  fused      (--fused, default rmsnorm,swiglu,rope,lmhead, if 60 s are left) the model rebuilt with each Triton kernel
             of trainer.fused_kernels alone and with all of them: the new path's steps against the plain model
             rebuilt the same way, the log-prob gap of all of them against plain, and all of them again at
             twice the micro-batch
  compiled   (--compile-shape, default 1.5b, CUDA only, if 90 s are left) the MLP and norms of every
             layer through torch.compile, then the new path's steps again

Every stage is guarded: a failing stage reports its error and the rest still runs; stages that would start
after the time budget (--budget-s) are skipped and say so. One JSON line is always printed last, and
written to $OUT/gpu_trainer.json when $OUT is set.

Usage:
  python benchmarks/gpu_trainer.py                          # CUDA: 0.5b and 1.5b shapes
  python benchmarks/gpu_trainer.py --device cpu --threads 1 # CPU: the tiny shape (tests/benchmarks)
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.guarded import error_result, guarded  # noqa: E402
from benchmarks.trainer_speed import measure_steps, peak_tflops, speed_figures  # noqa: E402

# Qwen2.5-0.5B's and Qwen2.5-1.5B's config.json, by hand (tied embeddings, qkv bias)
SHAPES = {
    "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2),
    "0.5b": dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                 num_attention_heads=14, num_key_value_heads=2),
    "1.5b": dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                 num_attention_heads=12, num_key_value_heads=2),
}
# profile groups by op name, first match wins (self device time of each op; a kernel counts for the op that ran it)
GROUPS = [
    ("attention", r"attn|attention|flash|scaled_dot_product"),
    ("optimizer", r"_foreach|multi_tensor|adam|clip_grad|_amp_"),
    ("log-prob", r"log_softmax|logsumexp|softmax|gather|isfinite|where|entropy|nll"),
    ("matmul", r"::mm\b|addmm|bmm|matmul|linear|gemm"),
    ("norm", r"rms_norm|layer_norm|rsqrt|::pow\b|::mean\b"),
    ("rotary", r"::cat\b|::neg\b|::cos\b|::sin\b|rotary|rope"),
    ("copy", r"copy_|_to_copy|::to\b|::contiguous|clone"),
]


def log(msg: str) -> None:
    print(f"[gpu_trainer] {msg}", file=sys.stderr, flush=True)


class Bench:
    def __init__(self, args):
        import torch

        self.args = args
        self.cuda = args.device == "cuda"
        self.dtype = torch.bfloat16 if self.cuda else torch.float32
        self.deadline = time.monotonic() + args.budget_s
        self.sync = torch.cuda.synchronize if self.cuda else (lambda: None)
        self.device_name = torch.cuda.get_device_name() if self.cuda else "cpu"
        self.peak, self.peak_source = (peak_tflops(self.device_name, args.peak_tflops) if self.cuda
                                       else (None, "no bf16 peak for a CPU"))
        self.result: dict = {"benchmark": "gpu_trainer", "device": self.device_name, "torch": torch.__version__,
                             "precision": str(self.dtype).removeprefix("torch."), "peak_tflops": self.peak,
                             "peak_source": self.peak_source, "budget_s": args.budget_s, "shapes": {}}
        self.policy = self.optimizer = self.arch = None

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def stage(self, shape: str, name: str, fn, min_left_s: float = 0.0) -> dict:
        out = self.result["shapes"].setdefault(shape, {})
        if self.left() < min_left_s:
            res = {"ok": False, "skipped": f"time budget: {self.left():.0f}s left, stage wants {min_left_s:.0f}s"}
        else:
            res, seconds = guarded(fn)
            if "error" in res:
                self.free_cuda_cache()
            res["seconds"] = round(seconds, 1)
        out[name] = res
        write_out(self.result)
        log(f"{shape}.{name}: {'ok' if res.get('ok') else 'FAILED'} {json.dumps(res, default=str)[:1500]}")
        return res

    def free_cuda_cache(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.empty_cache()

    # ---------------------------------------------------------------- stages
    def build(self, shape: str, work: Path, fused: tuple[str, ...] = ()) -> dict:
        """The trainer's model and optimizer for random weights of `shape` (saved once, as an HF checkpoint),
        with the Triton kernels `fused` (trainer.fused_kernels)."""
        import torch
        from transformers import Qwen2Config, Qwen2ForCausalLM

        from clawr1.config import Config, RunConfig, TrainerConfig
        from clawr1.trainer.main import build

        if not (work / shape / "config.json").exists():
            hf_config = Qwen2Config(**SHAPES[shape], max_position_embeddings=32768, tie_word_embeddings=True,
                                    rope_theta=1e6, rms_norm_eps=1e-6)
            torch.manual_seed(0)
            with torch.device("cuda" if self.cuda else "cpu"):
                hf = Qwen2ForCausalLM(hf_config).to(self.dtype)
            hf.save_pretrained(work / shape)
            del hf
        self.drop_model()
        cfg = Config(run=RunConfig(max_steps=1000), trainer=TrainerConfig(
            lr=1e-5, precision="bf16" if self.cuda else "fp32", transformer_engine="off",
            max_tokens_per_microbatch=self.args.microbatch_tokens, fused_kernels=list(fused)))
        self.cfg = cfg
        self.microbatch_tokens = self.args.microbatch_tokens
        self.policy, self.optimizer = build(cfg, self.par, work / shape)
        self.arch = self.policy.arch
        params = sum(p.numel() for p in self.policy.model.parameters())
        return {"ok": True, "params": params, "optimizer": type(self.optimizer).__name__,
                "arch": {k: getattr(self.arch, k) for k in ("num_layers", "hidden", "heads", "kv_heads", "head_dim",
                                                             "ffn", "vocab")}}

    def batches(self, count: int, seed: int) -> list:
        from benchmarks.gpu_smoke import make_batch

        n, lo, hi = (8, 16, 64) if self.args.device == "cpu" else (32, 256, 2048)
        return [make_batch(n, self.arch.vocab, lo, hi, seed=seed + i) for i in range(count)]

    def train(self, batch) -> dict:
        from clawr1.config import AlgoConfig
        from clawr1.trainer.step import train_step

        return train_step(self.policy, self.optimizer, batch, AlgoConfig(), self.microbatch_tokens,
                          self.cfg.trainer.logprob_chunk_tokens)

    def measure(self, variant: str, batches: list) -> dict:
        """Steps with one variant, "<attention kind>/<rotary>": rotary "megatron" (its per-sequence path, as
        before) or "core" (each token's angles applied by our core attention to the whole pack)."""
        import torch

        from clawr1.trainer.varlen_attention import resolve_attention

        kind, rotary = variant.split("/")
        self.select(variant)
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
        timing = measure_steps({variant: self.train}, batches, self.sync, deadline=self.deadline)[variant]
        res = {"ran_as": resolve_attention(kind, torch.device(self.args.device), self.dtype), "rotary": rotary,
               **speed_figures(timing, self.arch, self.peak)}
        if self.cuda:
            res["peak_memory_gb"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        return res

    def guarded_measure(self, variant: str, batches: list) -> dict:
        """measure, with one retry at half the micro-batch when the device runs out of memory."""
        import torch

        for attempt in range(2):
            try:
                return {**self.measure(variant, batches), "microbatch_tokens": self.microbatch_tokens}
            except torch.OutOfMemoryError as e:
                self.free_cuda_cache()
                if attempt:
                    return error_result(e)
                self.microbatch_tokens //= 2
            except Exception as e:  # noqa: BLE001 (the other variants still run)
                self.free_cuda_cache()
                return error_result(e)

    def attention(self) -> dict:
        """The old path (per-sequence attention, megatron's rotary) as the baseline, then the one-call form
        with megatron's rotary, then with rotary in the core attention; masked where varlen cannot run."""
        one_call = "varlen" if self.cuda else "masked"
        variants = ["per_sequence/megatron", f"{one_call}/megatron", f"{one_call}/core"]
        batches = self.batches(self.args.steps + 1, seed=100)
        res: dict = {"batch": f"{len(batches[0])} samples per step", "microbatch_tokens": self.args.microbatch_tokens,
                     "baseline": variants[0]}
        for variant in variants:
            res[variant] = self.guarded_measure(variant, batches)
            if variant.startswith("varlen") and "tokens_per_s" not in res[variant]:  # the other one-call form
                variant = variant.replace("varlen", "masked")
                res[variant] = self.guarded_measure(variant, batches)
        ran = [v for v in res if "/" in v and "tokens_per_s" in res[v]]
        if ran and ran[0] == variants[0]:
            res["speedup"] = {v: round(res[v]["tokens_per_s"] / res[variants[0]]["tokens_per_s"], 3) for v in ran[1:]}
        # the new path (one call, rotary in the core attention) is what parity, profile and compile look at
        self.new_variant = next((v for v in reversed(ran) if v.endswith("/core")), variants[0])
        res["new_path"] = self.new_variant
        res["ok"] = variants[0] in ran
        return res

    @staticmethod
    def select(variant: str) -> None:
        """Run the model with this variant ("<attention kind>/<rotary>") from now on."""
        from clawr1.trainer.varlen_attention import use_attention, use_rotary_in_core

        kind, rotary = variant.split("/")
        use_attention(kind)
        use_rotary_in_core(rotary == "core")

    def parity(self) -> dict:
        """Packed log-probs of the same samples under each attention form (no grad): the one-call form computes
        what the loop does, up to the rounding of the run's dtype."""
        import torch

        from benchmarks.gpu_smoke import megatron_logprobs

        samples = self.batches(1, seed=300)[0][:8]
        baseline = "per_sequence/megatron"
        logprobs = {}
        for variant in (baseline, self.new_variant):
            self.select(variant)
            logprobs[variant] = megatron_logprobs(self.policy, samples)
        diff = (logprobs[self.new_variant] - logprobs[baseline]).abs()
        spread = float((logprobs[baseline] - logprobs[baseline].mean()).abs().mean())
        # the mean gap: a few roundings of the run's dtype at the log-probs' magnitude (the layers' differences
        # average out over tokens); a form that attended across samples would be off by the spread itself
        tolerance = 4 * torch.finfo(self.dtype).eps * float(logprobs[baseline].abs().max())
        res = {"compared": [self.new_variant, baseline], "tokens": int(diff.numel()),
               "max_abs_diff": float(diff.max()), "mean_abs_diff": float(diff.mean()), "logprob_spread": spread,
               "mean_tolerance": tolerance}
        res["ok"] = res["mean_abs_diff"] < tolerance and res["mean_abs_diff"] < 0.1 * spread
        return res

    def profile(self) -> dict:
        from torch.profiler import ProfilerActivity, profile

        self.select(self.new_variant)
        batch = self.batches(1, seed=500)[0]
        self.train(batch)  # warm
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        self.sync()
        t0 = time.perf_counter()
        with profile(activities=activities) as prof:
            self.train(batch)
            self.sync()
        wall = time.perf_counter() - t0
        return {"ok": True, "variant": self.new_variant, **group_profile(prof.key_averages(), self.cuda, wall)}

    def fused(self, shape: str, work: Path) -> dict:
        """The new path's steps with each Triton kernel (trainer.fused_kernels) alone and with all of them, each
        against the plain model in the same run, and the log-probs of all of them against the plain ones."""
        from benchmarks.gpu_smoke import megatron_logprobs

        kernels = [k for k in self.args.fused.split(",") if k]
        batches = self.batches(self.args.steps + 1, seed=100)
        samples = self.batches(1, seed=300)[0][:8]
        self.select(self.new_variant)
        res: dict = {"variant": self.new_variant, "baseline": "plain"}
        logprobs = {}
        for name, fused in [("plain", ())] + [(k, (k,)) for k in kernels] + [("all", tuple(kernels))]:
            try:
                self.build(shape, work, fused)
                self.select(self.new_variant)
                res[name] = self.guarded_measure(self.new_variant, batches)
                if name in ("plain", "all"):
                    logprobs[name] = megatron_logprobs(self.policy, samples)
            except Exception as e:  # noqa: BLE001 (a kernel that cannot build here is a finding; the rest still run)
                res[name] = error_result(e)
        if "tokens_per_s" in res.get("all", {}):  # the memory the kernels free, spent on twice the micro-batch
            self.microbatch_tokens = 2 * res["all"]["microbatch_tokens"]
            res["all_2x_microbatch"] = self.guarded_measure(self.new_variant, batches)
        ran = [n for n in res if isinstance(res[n], dict) and "tokens_per_s" in res[n]]
        if "plain" in ran:
            res["speedup"] = {n: round(res[n]["tokens_per_s"] / res["plain"]["tokens_per_s"], 3) for n in ran[1:]}
        if len(logprobs) == 2:
            diff = (logprobs["all"] - logprobs["plain"]).abs()
            res["logprob_gap"] = {"max_abs_diff": float(diff.max()), "mean_abs_diff": float(diff.mean()),
                                  "magnitude": float(logprobs["plain"].abs().max())}
        res["ok"] = "plain" in ran and "all" in ran
        return res

    def compiled(self, shape: str, work: Path) -> dict:
        """The plain model's MLP and norms under torch.compile (rebuilt first if the fused stage left its own)."""
        if self.args.fused:
            self.build(shape, work)
        compiled = compile_blocks(self.policy.model)
        res = {"compiled_modules": compiled, "variant": self.new_variant}
        batches = self.batches(self.args.steps + 1, seed=100)
        res.update(self.measure(self.new_variant, batches))
        res["ok"] = True
        return res

    def drop_model(self) -> None:
        import gc

        self.policy = self.optimizer = None
        gc.collect()
        self.free_cuda_cache()

    def run(self, work: Path) -> dict:
        from clawr1.trainer.megatron_setup import init_parallel

        self.par = init_parallel(tp=1, seed=0)
        self.new_variant = "per_sequence/megatron"
        for shape in self.args.shapes:
            build = self.stage(shape, "build", lambda: self.build(shape, work), min_left_s=30)
            if not build.get("ok"):
                self.drop_model()
                continue
            self.stage(shape, "attention", self.attention, min_left_s=10)
            self.stage(shape, "parity", self.parity, min_left_s=10)
            self.stage(shape, "profile", self.profile, min_left_s=10)
            if self.args.fused:  # before compiled, which rebuilds nothing and changes the model in place
                self.stage(shape, "fused", lambda: self.fused(shape, work), min_left_s=self.args.fused_min_left_s)
            if shape == self.args.compile_shape and self.cuda:
                self.stage(shape, "compiled", lambda: self.compiled(shape, work), min_left_s=self.args.compile_min_left_s)
            self.drop_model()
        self.result["summary"] = summary(self.result["shapes"])
        self.result["ok"] = all(st.get("ok") for sh in self.result["shapes"].values()
                                for name, st in sh.items() if name in ("build", "attention", "parity"))
        return self.result


def group_profile(events, cuda: bool, wall_s: float) -> dict:
    """Self device time (CPU time on a CPU) per op, grouped by GROUPS; top ops; device busy share of the step."""
    def self_time(e) -> float:
        return (getattr(e, "self_device_time_total", 0) or 0) if cuda else e.self_cpu_time_total

    ops = [(e.key, self_time(e), e.count) for e in events if self_time(e) > 0]
    total = sum(t for _, t, _ in ops)
    groups = {name: 0.0 for name, _ in GROUPS} | {"other": 0.0}
    for key, t, _ in ops:
        groups[next((name for name, pattern in GROUPS if re.search(pattern, key)), "other")] += t
    top = sorted(ops, key=lambda o: -o[1])[:20]
    return {"step_wall_ms": round(wall_s * 1e3, 1), "timed_ms": round(total / 1e3, 1),
            "device_busy_share": round(total / 1e6 / wall_s, 3) if cuda else None,
            "time_basis": "self CUDA time of each op" if cuda else "self CPU time of each op",
            "groups_ms": {k: round(v / 1e3, 1) for k, v in groups.items()},
            "groups_share": {k: round(v / max(total, 1e-9), 3) for k, v in groups.items()},
            "top_ops": [{"op": k, "ms": round(t / 1e3, 2), "calls": c} for k, t, c in top]}


def compile_blocks(model) -> list[str]:
    """torch.compile every decoder layer's MLP and norms in place (attention and rotary stay eager)."""
    names = []
    for name, module in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if leaf in ("mlp", "input_layernorm", "pre_mlp_layernorm", "final_layernorm"):
            module.compile(dynamic=True)
            names.append(leaf)
    return sorted(set(names))


def summary(shapes: dict) -> dict:
    out = {}
    for shape, stages in shapes.items():
        att = stages.get("attention", {})
        row = {}
        for variant, figures in att.items():
            if isinstance(figures, dict) and "tokens_per_s" in figures:
                row[variant] = {k: figures.get(k) for k in ("tokens_per_s", "mfu", "peak_memory_gb")}
        fused = stages.get("fused", {})
        for name in ("plain", "all"):
            if "tokens_per_s" in fused.get(name, {}):
                row[f"fused_{name}"] = {k: fused[name].get(k) for k in ("tokens_per_s", "mfu", "peak_memory_gb")}
        comp = stages.get("compiled", {})
        if "tokens_per_s" in comp:
            row["compiled"] = {k: comp.get(k) for k in ("tokens_per_s", "mfu", "peak_memory_gb")}
        prof = stages.get("profile", {})
        if "groups_share" in prof:
            row["profile_share"] = prof["groups_share"]
            row["device_busy_share"] = prof["device_busy_share"]
        out[shape] = row
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--shapes", default=None, help="comma-separated of tiny,0.5b,1.5b (default: 0.5b,1.5b on CUDA, "
                                                   "tiny on CPU)")
    ap.add_argument("--steps", type=int, default=None, help="timed steps per form after one warm-up (CUDA 3, CPU 1)")
    ap.add_argument("--microbatch-tokens", type=int, default=None, help="default: 8192 on CUDA, 4096 on CPU")
    ap.add_argument("--budget-s", type=float, default=240.0, help="no stage starts after this many seconds")
    ap.add_argument("--compile-shape", default="1.5b", help="the shape whose MLP and norms go through torch.compile "
                                                            "(CUDA only; 'none' to skip)")
    ap.add_argument("--compile-min-left-s", type=float, default=90.0)
    ap.add_argument("--fused", default="rmsnorm,swiglu,rope,lmhead", help="the Triton kernels the fused stage measures, "
                    "each alone and all together against the plain model ('' to skip; on a CPU they need "
                    "TRITON_INTERPRET=1 and triton)")
    ap.add_argument("--fused-min-left-s", type=float, default=60.0)
    ap.add_argument("--peak-tflops", type=float, default=None)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # before torch: init_parallel picks CUDA whenever it sees one
    args.shapes = (args.shapes or ("0.5b,1.5b" if args.device == "cuda" else "tiny")).split(",")
    args.steps = args.steps or (3 if args.device == "cuda" else 1)
    args.microbatch_tokens = args.microbatch_tokens or (8192 if args.device == "cuda" else 4096)
    result = {"benchmark": "gpu_trainer", "ok": False}
    stop_on_sigterm()
    t0 = time.monotonic()
    try:
        result = run(args)
    except BaseException as e:  # noqa: BLE001 (the JSON line is printed whatever happened)
        result.update(error_result(e))
    result["seconds"] = round(time.monotonic() - t0, 1)
    emit(result)
    return 0 if result.get("ok") else 1


def run(args) -> dict:
    import warnings

    warnings.filterwarnings("ignore")
    import torch
    import transformers

    transformers.utils.logging.disable_progress_bar()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        return {"benchmark": "gpu_trainer", "ok": False, "error": "no CUDA device here; run --device cpu"}
    from clawr1.trainer.megatron_setup import shutdown_parallel

    bench = Bench(args)
    try:
        with tempfile.TemporaryDirectory(prefix="gpu_trainer-") as tmp:
            return bench.run(Path(tmp))
    except BaseException as e:  # noqa: BLE001
        bench.result.update(error_result(e))
        return bench.result
    finally:
        shutdown_parallel()


def write_out(result: dict) -> None:
    """The result so far to $OUT/gpu_trainer.json (after every stage: a killed run leaves what it had)."""
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "gpu_trainer.json").write_text(json.dumps(result, default=str) + "\n")


def emit(result: dict) -> None:
    write_out(result)
    print(json.dumps(result, default=str), flush=True)


def stop_on_sigterm() -> None:
    """`timeout` sends SIGTERM: end as if interrupted, so the JSON line is still printed."""
    import signal

    def stop(signum, frame):
        raise SystemExit(f"stopped by signal {signum}")

    signal.signal(signal.SIGTERM, stop)


if __name__ == "__main__":
    sys.exit(main())
