"""Device smoke test (issue 15): the trainer's GPU path, end to end, on a random Qwen2 of Qwen2.5-0.5B's shape.

Everything goes through clawr1's own trainer code (clawr1/trainer/): the HF weights are
written locally (no download) and built by `main.build` exactly as `clawr1 train` builds
them (bf16, TransformerEngine when installed, megatron's DDP + distributed optimizer on
CUDA). In order:

  1. build    a random bf16 Qwen2 (hidden 896, 24 layers, 14 heads, 2 kv heads, ffn 4864,
              vocab 151936, tied embeddings, qkv bias); its weights are rounded to bf16
              first, so the fp32 HF reference below holds exactly the same values
  2. logprobs packed Megatron log-probs (`model.packed_logprobs`) vs an HF fp32 forward of each
              sample on its own; max/mean abs diff against a bf16 tolerance
  3. train    two `step.train_step` optimizer steps: loss finite, grad norm > 0, weights changed
  4. checkpoint  `checkpoint.save`, then `checkpoint.load` into a freshly built model and
              optimizer: identical weights, and the next step on both agrees (optimizer state)
  5. publish  `publish.gather_hf_state`: names, shapes and dtype against the HF model's
              state_dict, and the published values loaded into the HF model reproduce the
              trained Megatron log-probs
  7. throughput  trainer steps on a batch of mixed lengths: tokens/s and MFU against the
              device's dense bf16 peak (model FLOPs, see `model_flops`)
  6. weight_sender  clawr1's NCCL strategy (`engine_api.weight_push.DistributedWeightSync`,
              what `publish.NcclSink` runs) pushes the published state into an SGLang
              stand-in engine (a second process of this script that joins the weight-update
              group the way SGLang does: rendezvous at the trainer's store, then torch's own
              group helper), and the stand-in reports a checksum of every tensor it received.
              Always over gloo (the whole protocol, every byte checked); on CUDA also over
              NCCL. With two or more GPUs the stand-in sits on GPU 1 and the NCCL push is
              checked byte for byte. With one GPU, NCCL refuses two ranks on one device
              ("Duplicate GPU detected", NCCL >= 2.5), so what runs is the group setup (the
              trainer's TCPStore, /init_weights_update_group, both ends' ProcessGroupNCCL on
              the shared store scope, the SGLang 0.5.23 session protocol) up to the first
              broadcast, whose refusal must come back as the engine's error within the bound
              instead of a hang. (Run last, after the throughput, so a crash here loses nothing.)

Usage:
  python benchmarks/gpu_smoke.py                       # CUDA, bf16, the 0.5B shape
  python benchmarks/gpu_smoke.py --device cpu --tiny   # CPU, fp32, a tiny Qwen2, gloo (tests/benchmarks)

Prints progress lines (`[gpu_smoke] ...`, each step's result as it finishes) and one final
JSON line; exits 0 when every check passed. On CPU megatron-core's distributed optimizer is
not available (it needs CUDA), so the CPU mode steps with the trainer's CPU optimizer
(TorchAdamW) and says so; the NCCL push is skipped with the reason.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.guarded import guarded  # noqa: E402
from benchmarks.trainer_speed import measure_steps, peak_tflops, speed_figures  # noqa: E402

STANDIN_VERSION = "0.5.23"  # the SGLang release the stand-in engine claims: weight-update sessions, retract pauses


def log(msg: str) -> None:
    print(f"[gpu_smoke] {msg}", flush=True)


# ---------------------------------------------------------------- the model and the data
def qwen2_config(tiny: bool):
    from transformers import Qwen2Config

    if tiny:
        return Qwen2Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                           tie_word_embeddings=True, rope_theta=1e6, rms_norm_eps=1e-6)
    # Qwen2.5-0.5B's config.json, by hand
    return Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                       num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                       tie_word_embeddings=True, rope_theta=1e6, rms_norm_eps=1e-6)


def write_random_model(hf_config, out_dir: Path, device, bf16_values: bool):
    """A random HF Qwen2 written to out_dir (safetensors + config); returns it in fp32 on `device`, eval mode."""
    import torch
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(0)
    with torch.device(device):
        hf = Qwen2ForCausalLM(hf_config)
    if bf16_values:  # the bf16 trainer model then holds exactly these values: the comparison sees compute only
        hf.to(torch.bfloat16)
    hf.save_pretrained(out_dir)
    hf.float().eval()
    hf.config.use_cache = False
    return hf


def make_batch(n: int, vocab: int, lo: int, hi: int, seed: int):
    """Samples in groups of two with opposite rewards (non-zero GRPO advantages), a teacher on every other one."""
    from clawr1.protocol import Sample

    rng = random.Random(seed)
    out = []
    for i in range(n):
        length = rng.randint(lo, hi)
        p = max(1, length // 4)
        r = length - p
        out.append(Sample(sample_id=f"{seed}-{i}", group_id=f"{seed}-{i // 2}",
                          tokens=[rng.randrange(vocab) for _ in range(length)], prompt_len=p, loss_mask=[1] * r,
                          rollout_logprobs=[-rng.random() * 4 for _ in range(r)], versions=[0] * r,
                          reward=1.0 if i % 2 else -1.0,
                          teacher_logprobs=[-rng.random() * 4 for _ in range(r)] if i % 2 else None))
    return out


def hf_reference_logprobs(hf, samples, device):
    """log p of every response token, each sample alone through the HF model in fp32."""
    import torch

    out = []
    with torch.no_grad():
        for s in samples:
            ids = torch.tensor([s.tokens], device=device)
            logits = hf(input_ids=ids).logits[0].float()
            logp = torch.log_softmax(logits, dim=-1)
            pos = torch.arange(s.prompt_len - 1, len(s.tokens) - 1, device=device)
            out.append(logp[pos].gather(1, torch.tensor(s.tokens[s.prompt_len:], device=device)[:, None])[:, 0])
    return torch.cat(out).cpu()


def megatron_logprobs(policy, samples):
    import torch

    from clawr1.trainer.model import pack, packed_logprobs

    packed = pack([s.tokens for s in samples], [s.prompt_len for s in samples])
    with torch.no_grad():
        return packed_logprobs(policy, packed).float().cpu()


def compare(got, ref) -> dict:
    diff = (got - ref).abs()
    return {"max_abs_diff": float(diff.max()), "mean_abs_diff": float(diff.mean()), "tokens": int(ref.numel()),
            # what a check that ignored the weights would be off by: the diffs must be far below it
            "ref_spread": float((ref - ref.mean()).abs().mean())}


def snapshot(policy) -> dict:
    from clawr1.trainer.model import megatron_state

    return {k: v.detach().clone() for k, v in megatron_state(policy.model).items()}


def state_diff(a: dict, b: dict) -> dict:
    changed = [k for k in a if not bool((a[k] == b[k]).all())]
    max_change = max((float((a[k].float() - b[k].float()).abs().max()) for k in changed), default=0.0)
    differing = sum(int((a[k] != b[k]).sum()) for k in changed)
    return {"changed_tensors": len(changed), "total_tensors": len(a), "max_abs_change": max_change,
            "frac_elements_changed": differing / max(sum(v.numel() for v in a.values()), 1)}


# ---------------------------------------------------------------- the SGLang stand-in engine (step 6)
def standin_main(backend: str, device: str) -> None:
    """An SGLang engine as the weight sender sees it (tp_size 1), serving HTTP until stdin closes.

    /init_weights_update_group joins the group as SGLang's init_custom_process_group does; each
    /update_weights_from_distributed receives one broadcast per name onto `device` and records
    the received tensor's checksum (GET /state). A failed receive answers HTTP 500 with the error,
    as SGLang reports a failed update.
    """
    from datetime import timedelta
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import torch
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _new_process_group_helper, _world
    from torch.distributed.rendezvous import rendezvous

    from clawr1.engine_api.nccl import local_nccl_version

    timeout = timedelta(seconds=120)
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # engines have a default group
    groups, calls, received = {}, [], {}
    lock = threading.Lock()

    def join(p: dict):
        store, rank, world = next(rendezvous(f"tcp://{p['master_address']}:{p['master_port']}", p["rank_offset"],
                                             p["world_size"], timeout=timeout))
        store.set_timeout(timeout)
        pg, _ = _new_process_group_helper(world, rank, [], dist.Backend(p["backend"]),
                                          dist.PrefixStore(p["group_name"], store), group_name=p["group_name"],
                                          timeout=timeout)
        _world.pg_group_ranks[pg] = {i: i for i in range(world)}
        return pg

    def handle(path: str, body):
        with lock:
            calls.append(path)
        if path == "/server_info":
            return 200, {"version": STANDIN_VERSION}
        if path == "/model_info":  # its torch's NCCL, as clawr1's embedded engine reports it (SGLang does not)
            return 200, {"model_path": "standin", "weight_version": "default", "nccl_version": local_nccl_version()}
        if path == "/flush_cache":
            return 200, "Cache flushed.\n"
        if path == "/state":
            with lock:
                return 200, {"calls": list(calls), "received": dict(received)}
        try:
            if path == "/init_weights_update_group":
                groups[body["group_name"]] = join(body)
            elif path == "/update_weights_from_distributed":
                for name, dtype, shape in zip(body["names"], body["dtypes"], body["shapes"]):
                    t = torch.empty(shape, dtype=getattr(torch, dtype), device=device)
                    dist.broadcast(t, src=0, group=groups[body["group_name"]])
                    with lock:
                        received[name] = [dtype, list(shape), float(t.cpu().double().sum())]
            elif path == "/destroy_weights_update_group":
                dist.destroy_process_group(groups.pop(body["group_name"]))
        except Exception as e:  # noqa: BLE001 (reported to the trainer, as SGLang does)
            return 500, {"success": False, "message": f"{type(e).__name__}: {e}"}
        if path in ("/pause_generation", "/continue_generation"):
            return 200, {"message": "ok", "status": "ok"}
        return 200, {"success": True, "message": "ok"}

    class Handler(BaseHTTPRequestHandler):
        def reply(self, status, obj):
            data = obj.encode() if isinstance(obj, str) else json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self):
            self.reply(*handle(self.path, json.loads(self.rfile.read(int(self.headers["Content-Length"])))))

        def do_GET(self):
            self.reply(*handle(self.path, None))

        def log_message(self, *a):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(json.dumps({"port": server.server_address[1]}), flush=True)
    sys.stdin.read()  # until the smoke test closes our stdin
    os._exit(0)  # a group abandoned mid-broadcast must not hold the exit


class Standin:
    """The stand-in engine in a process of its own; stopped by closing its stdin (then killed, by its pid)."""

    def __init__(self, backend: str, device: str):
        import subprocess

        self.proc = subprocess.Popen([sys.executable, __file__, "--engine-standin", backend, device],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO)
        while True:  # its first JSON line names its port (anything a library printed before is skipped)
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"the stand-in engine exited with {self.proc.wait()} before it served")
            if line.startswith("{"):
                break
        self.url = f"http://127.0.0.1:{json.loads(line)['port']}"

    def state(self) -> dict:
        import httpx

        return httpx.get(f"{self.url}/state", timeout=30).json()

    def stop(self) -> None:
        import subprocess

        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def push_to_standin(hf_state: dict, backend: str, standin_device: str, bucket_bytes: int, timeout_s: float,
                    started: list | None = None) -> dict:
    """Connect and push as NcclSink does (DistributedWeightSync.connect(trainer host, 0, [tp_size]), then push).

    The stand-in is appended to `started` as soon as it runs, so a caller that gave up waiting can stop it."""
    import torch

    from clawr1.config import TrainerConfig
    from clawr1.engine_api.weight_push import DistributedWeightSync, dtype_name

    expected = {n: [dtype_name(t.dtype), list(t.shape), float(t.detach().cpu().double().sum())]
                for n, t in hf_state.items()}
    engine = Standin(backend, standin_device)
    if started is not None:
        started.append(engine)
    out: dict = {"backend": backend, "standin_device": standin_device, "tensors": len(hf_state),
                 "bytes": sum(t.numel() * t.element_size() for t in hf_state.values()), "bucket_bytes": bucket_bytes}
    try:
        t0 = time.monotonic()
        with DistributedWeightSync([engine.url], bucket_bytes=bucket_bytes, backend=backend, timeout_s=timeout_s,
                                   refusal_grace_s=5.0) as sync:
            sync.connect(TrainerConfig().host, 0, [1])
            out["connect_s"] = round(time.monotonic() - t0, 3)
            out["trainer_nccl"] = sync.nccl_version  # checked against the stand-in's before it joined (nccl)
            t1 = time.monotonic()
            try:
                sync.push(hf_state, version=1)
                if backend == "nccl":
                    torch.cuda.synchronize()
                out["push_s"] = round(time.monotonic() - t1, 3)
                out["pushed"] = True
            except Exception as e:  # noqa: BLE001 (reported; whether it is expected is decided by the caller)
                out["pushed"] = False
                out["push_error"] = f"{type(e).__name__}: {e}"[:2000]
                out["push_failed_after_s"] = round(time.monotonic() - t1, 3)
            state = engine.state()
        calls = state["calls"]
        out["engine_calls"] = sorted(set(calls), key=calls.index)
        opening = ["/server_info", *(["/model_info"] if backend == "nccl" else []), "/init_weights_update_group"]
        out["protocol_ok"] = calls[:len(opening)] == opening and all(
            p in calls for p in ("/pause_generation", "/begin_weight_update", "/flush_cache",
                                 "/update_weights_from_distributed"))
        if out["pushed"]:
            got = state["received"]
            out["received_tensors"] = len(got)
            out["mismatched"] = sorted(n for n in expected if got.get(n) != expected[n])[:10]
            out["bytes_equal"] = not out["mismatched"] and set(got) == set(expected)
            out["protocol_ok"] = out["protocol_ok"] and all(p in calls for p in ("/end_weight_update",
                                                                                 "/continue_generation"))
    finally:
        engine.stop()
    return out


# ---------------------------------------------------------------- the steps
class Smoke:
    def __init__(self, args):
        import torch

        self.args = args
        self.cuda = args.device == "cuda"
        self.device = torch.device("cuda", torch.cuda.current_device()) if self.cuda else torch.device("cpu")
        self.bf16 = self.cuda and not args.fp32
        self.dtype = torch.bfloat16 if self.bf16 else torch.float32
        # bf16 weights and activations against an fp32 reference; fp32 against fp32 (different kernels only)
        self.tol = {"max": 0.5, "mean": 5e-2} if self.bf16 else {"max": 1e-3, "mean": 1e-4}
        self.work = Path(args.workdir)
        self.result: dict = {"benchmark": "gpu_smoke"}
        self.hung = False  # a step left a thread that will not finish

    def step(self, name: str, fn, *needs: str) -> None:
        missing = [n for n in needs if not self.result["steps"].get(n, {}).get("ok")]
        if missing:
            res = {"ok": False, "skipped": f"needs {', '.join(missing)}"}
        else:
            res, seconds = guarded(fn)
            res["seconds"] = round(seconds, 2)
        self.result["steps"][name] = res
        log(f"{name}: {'ok' if res.get('ok') else 'FAILED'} {json.dumps(res, default=str)}")

    def config(self, lr: float):
        from clawr1.config import Config, RunConfig, TrainerConfig

        return Config(run=RunConfig(max_steps=100), trainer=TrainerConfig(
            lr=lr, precision="bf16" if self.bf16 else "fp32", transformer_engine=self.args.transformer_engine,
            max_tokens_per_microbatch=self.args.microbatch_tokens))

    # 1
    def build(self) -> dict:
        import torch

        from clawr1.trainer.main import build, use_transformer_engine
        from clawr1.trainer.megatron_setup import init_parallel

        self.par = init_parallel(tp=1, seed=0)
        self.hf_config = qwen2_config(self.args.tiny)
        self.model_dir = self.work / "model"
        self.hf = write_random_model(self.hf_config, self.model_dir, self.device, self.bf16)
        self.cfg = self.config(self.args.lr)
        self.policy, self.optimizer = build(self.cfg, self.par, self.model_dir)
        arch = self.policy.arch
        params = sum(p.numel() for p in self.policy.model.parameters())
        self.use_te = use_transformer_engine(self.cfg.trainer.transformer_engine)
        dist_opt = type(self.optimizer).__name__ == "MegatronDistributedAdam"
        return {"ok": params == sum(p.numel() for p in self.hf.parameters()), "params": params,
                "params_hf": sum(p.numel() for p in self.hf.parameters()),
                "arch": {k: getattr(arch, k) for k in ("family", "num_layers", "hidden", "heads", "kv_heads",
                                                       "head_dim", "ffn", "vocab", "tied", "qkv_bias")},
                "dtype": str(next(self.policy.model.parameters()).dtype).removeprefix("torch."),
                "transformer_engine": self.use_te, "optimizer": type(self.optimizer).__name__,
                "distributed_optimizer": dist_opt,
                "note": None if dist_opt else "megatron-core's distributed optimizer needs CUDA: the trainer's CPU "
                                              "optimizer (TorchAdamW, own DP all-reduce and TP-aware clipping) steps",
                "backend": torch.distributed.get_backend()}

    # 2
    def logprobs(self) -> dict:
        import torch

        torch.backends.cuda.matmul.allow_tf32 = False  # a true fp32 reference
        lo, hi = (16, 48) if self.args.tiny else (64, 512)
        self.lp_samples = make_batch(4, self.hf_config.vocab_size, lo, hi, seed=1)
        got = megatron_logprobs(self.policy, self.lp_samples)
        ref = hf_reference_logprobs(self.hf, self.lp_samples, self.device)
        res = compare(got, ref)
        res["tolerance"] = self.tol
        res["ok"] = (res["max_abs_diff"] < self.tol["max"] and res["mean_abs_diff"] < self.tol["mean"]
                     and res["mean_abs_diff"] < 0.2 * res["ref_spread"])
        return res

    def train(self, batch, optimizer=None, policy=None) -> dict:
        from clawr1.config import AlgoConfig
        from clawr1.trainer.step import train_step

        t = self.cfg.trainer
        return train_step(policy or self.policy, optimizer or self.optimizer, batch, AlgoConfig(),
                          t.max_tokens_per_microbatch, t.logprob_chunk_tokens)

    # 3
    def optimizer_steps(self) -> dict:
        lo, hi = (16, 64) if self.args.tiny else (128, 1024)
        vocab = self.hf_config.vocab_size
        before = snapshot(self.policy)
        steps = []
        for i in range(2):
            stats = self.train(make_batch(8, vocab, lo, hi, seed=10 + i))
            steps.append({k: stats[k] for k in ("pg_loss", "grad_norm", "lr", "tokens")})
        diff = state_diff(before, snapshot(self.policy))
        res = {"optimizer": type(self.optimizer).__name__, "steps": steps,
               "loss_finite": all(math.isfinite(s["pg_loss"]) for s in steps),
               "grad_norm_positive": all(math.isfinite(s["grad_norm"]) and s["grad_norm"] > 0 for s in steps),
               "weights_changed": diff["changed_tensors"] > 0, **diff}
        res["ok"] = res["loss_finite"] and res["grad_norm_positive"] and res["weights_changed"]
        return res

    # 4
    def checkpoint_round_trip(self) -> dict:
        import torch

        from clawr1.trainer import checkpoint
        from clawr1.trainer.main import build

        meta = checkpoint.CheckpointMeta(step=2, version=2, last_batch_id=2, base_model=str(self.model_dir), tp=1,
                                         dp=1, family=self.policy.arch.family)
        path = checkpoint.save(self.work / "checkpoints", meta, self.policy.model, self.optimizer)
        files = sorted(f.name for f in path.iterdir())
        fresh_policy, fresh_opt = build(self.cfg, self.par, self.model_dir)
        saved = snapshot(self.policy)
        differed = state_diff(saved, snapshot(fresh_policy))["changed_tensors"] > 0
        loaded = checkpoint.load(path, fresh_policy.model, fresh_opt, tp=1, dp=1)
        after_load = state_diff(saved, snapshot(fresh_policy))
        # the optimizer state: the next step from the checkpoint must be the next step of the run
        lo, hi = (16, 64) if self.args.tiny else (128, 1024)
        batch = make_batch(8, self.hf_config.vocab_size, lo, hi, seed=20)
        a, b = self.train(batch), self.train(batch, fresh_opt, fresh_policy)
        nxt = state_diff(snapshot(self.policy), snapshot(fresh_policy))
        res = {"files": files, "meta_step": loaded.step, "fresh_model_differed_before_load": differed,
               "weights_equal": after_load["changed_tensors"] == 0,
               "next_step_loss": [a["pg_loss"], b["pg_loss"]], "next_step_grad_norm": [a["grad_norm"], b["grad_norm"]],
               "next_step_weights_max_abs_diff": nxt["max_abs_change"],
               "next_step_weights_frac_differ": nxt["frac_elements_changed"]}
        rel = abs(a["grad_norm"] - b["grad_norm"]) / max(abs(a["grad_norm"]), 1e-12)
        # fp32 on CPU is deterministic; bf16 kernels on GPU may not be (atomics), so a few elements may
        # round the other way, but an optimizer state that was not restored changes nearly all of them
        frac_tol, rel_tol = (0.0, 1e-6) if not self.bf16 else (0.05, 1e-2)
        res["next_step_matches"] = nxt["frac_elements_changed"] <= frac_tol and rel <= rel_tol
        res["ok"] = differed and res["weights_equal"] and res["next_step_matches"] and loaded.step == 2
        del fresh_policy, fresh_opt
        if self.cuda:
            torch.cuda.empty_cache()
        return res

    # 5
    def publish(self) -> dict:
        import torch

        from clawr1.trainer.publish import gather_hf_state

        self.hf_state = gather_hf_state(self.policy)
        reference = self.hf.state_dict()
        tied = {"lm_head.weight"} if self.hf_config.tie_word_embeddings else set()  # HF checkpoints leave it out
        want = {k: tuple(v.shape) for k, v in reference.items() if k not in tied}
        got = {k: tuple(v.shape) for k, v in self.hf_state.items()}
        mismatched = sorted(k for k in set(want) & set(got) if want[k] != got[k])
        dtypes = sorted({str(v.dtype).removeprefix("torch.") for v in self.hf_state.values()})
        res = {"tensors": len(got), "missing": sorted(set(want) - set(got))[:10],
               "unexpected": sorted(set(got) - set(want))[:10], "shape_mismatches": mismatched[:10],
               "dtypes": dtypes}
        res["names_match"] = not res["missing"] and not res["unexpected"]
        res["shapes_match"] = res["names_match"] and not mismatched
        # the published values are the trained weights: loaded into the HF model they give the trained log-probs
        with torch.no_grad():
            missing, unexpected = self.hf.load_state_dict({k: v.float() for k, v in self.hf_state.items()},
                                                          strict=False)
        ref = hf_reference_logprobs(self.hf, self.lp_samples, self.device)
        trained = compare(megatron_logprobs(self.policy, self.lp_samples), ref)
        res.update({f"trained_{k}": v for k, v in trained.items()})
        res["hf_load_missing"] = sorted(set(missing) - tied)
        res["values_ok"] = (not res["hf_load_missing"] and not unexpected
                            and res["trained_max_abs_diff"] < self.tol["max"]
                            and res["trained_mean_abs_diff"] < self.tol["mean"])
        res["dtype_ok"] = dtypes == [str(self.dtype).removeprefix("torch.")]
        res["ok"] = res["names_match"] and res["shapes_match"] and res["dtype_ok"] and res["values_ok"]
        return res

    # 6
    def weight_sender(self) -> dict:
        import torch

        tiny_bucket = 16 << 10
        bucket = tiny_bucket if self.args.tiny else 256 << 20
        res: dict = {"strategy": "clawr1.engine_api.weight_push.DistributedWeightSync (publish.NcclSink's)",
                     "standin_sglang_version": STANDIN_VERSION}
        res["gloo"] = push_to_standin(self.hf_state, "gloo", "cpu", bucket, timeout_s=300)
        ok = bool(res["gloo"].get("pushed") and res["gloo"].get("bytes_equal") and res["gloo"].get("protocol_ok"))
        if not self.cuda:
            res["nccl"] = {"skipped": "no CUDA: NCCL needs GPUs (the gloo push above ran the same sender and "
                                      "protocol, with RankZeroGroup on ProcessGroupGloo)"}
        elif not torch.distributed.is_nccl_available():
            res["nccl"] = {"skipped": "this torch build has no NCCL"}
            ok = False
        else:
            gpus = torch.cuda.device_count()
            other = 1 if gpus > 1 else 0
            nccl = self.bounded_nccl_push(f"cuda:{other}", bucket, timeout_s=120)
            if gpus > 1:
                nccl["exercised"] = "everything: group setup and every bucket's broadcast, checked byte for byte"
                nccl_ok = bool(nccl.get("pushed") and nccl.get("bytes_equal") and nccl.get("protocol_ok"))
            else:
                nccl["exercised"] = (
                    "one GPU: the trainer's TCPStore, /init_weights_update_group, ProcessGroupNCCL on both ends "
                    "on the shared store scope, pause/begin/flush and the first bucket's announcement; NCCL then "
                    "refuses two ranks on one device at the first broadcast, which must surface as the engine's "
                    "error within the bound (no hang). The broadcast itself needs two GPUs.")
                err = nccl.get("push_error", "")
                refused = any(s in err for s in ("Duplicate GPU", "invalid usage", "ncclInvalidUsage"))
                # either NCCL allowed it after all (then every byte is checked) or it refused, and the refusal
                # came back as an error (the engine's, or the broadcast's) instead of a hang
                nccl_ok = nccl.get("protocol_ok", False) and (
                    bool(nccl.get("pushed") and nccl.get("bytes_equal")) or refused)
                nccl["refused_as_expected"] = refused
            res["nccl"] = nccl
            ok = ok and nccl_ok
        res["ok"] = ok
        return res

    def bounded_nccl_push(self, standin_device: str, bucket: int, timeout_s: float) -> dict:
        """The NCCL push in a thread of its own: whatever NCCL does, the smoke test still reports."""
        box: dict = {}
        started: list = []

        def run() -> None:
            try:
                box["result"] = push_to_standin(self.hf_state, "nccl", standin_device, bucket, timeout_s, started)
            except Exception as e:  # noqa: BLE001
                box["result"] = {"protocol_ok": False, "error": f"{type(e).__name__}: {e}"[:2000],
                                 "traceback": traceback.format_exc()[-4000:]}

        worker = threading.Thread(target=run, name="gpu-smoke-nccl", daemon=True)
        worker.start()
        worker.join(timeout_s + 120)
        if worker.is_alive():
            self.hung = True  # the process exits without waiting for it (see main)
            for engine in started:
                engine.stop()
            return {"protocol_ok": False, "hung": f"no result within {timeout_s + 120:g}s: the sender hangs"}
        return box["result"]

    # 7
    def throughput(self) -> dict:
        import torch

        steps = self.args.throughput_steps
        if self.args.tiny:
            n, lo, hi = 8, 16, 64
        else:
            n, lo, hi = 32, 256, 2048
        batches = [make_batch(n, self.hf_config.vocab_size, lo, hi, seed=100 + i) for i in range(steps + 1)]
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
        sync = torch.cuda.synchronize if self.cuda else (lambda: None)
        timing = measure_steps({"train": self.train}, batches, sync)["train"]
        name = torch.cuda.get_device_name() if self.cuda else "cpu"
        peak, peak_source = peak_tflops(name, self.args.peak_tflops) if self.cuda else (None, "no bf16 peak for a CPU")
        speed = speed_figures(timing, self.policy.arch, peak)
        res = {"device": name, "batch": f"{n} samples, lengths {lo}..{hi}",
               "microbatch_tokens": self.cfg.trainer.max_tokens_per_microbatch, **speed,
               "peak_tflops": peak, "peak_source": peak_source, "transformer_engine": self.use_te}
        if self.cuda:
            res["peak_memory_gb"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        res["ok"] = timing["tokens"] > 0 and timing["seconds"] > 0
        return res

    def run(self) -> dict:
        import torch

        import megatron.core

        r = self.result
        r.update({"mode": ("tiny" if self.args.tiny else "qwen2.5-0.5b-shape"),
                  "device": torch.cuda.get_device_name() if self.cuda else "cpu",
                  "gpus": torch.cuda.device_count() if self.cuda else 0, "precision": str(self.dtype).split(".")[-1],
                  "torch": torch.__version__, "megatron_core": megatron.core.__version__, "ok": None, "summary": None,
                  "steps": {}})
        log(f"mode {r['mode']} on {r['device']} ({r['precision']}), work dir {self.work}")
        self.step("build", self.build)
        self.step("logprobs", self.logprobs, "build")
        self.step("train", self.optimizer_steps, "build")
        self.step("checkpoint", self.checkpoint_round_trip, "train")
        self.step("publish", self.publish, "logprobs", "train")
        if self.args.throughput_steps:
            self.step("throughput", self.throughput, "build")
        self.step("weight_sender", self.weight_sender, "publish")
        s = r["steps"]
        r["ok"] = all(v.get("ok") for v in s.values())
        # the headline numbers, flat
        r["summary"] = {
            "logprob_max_abs_diff": s["logprobs"].get("max_abs_diff"),
            "logprob_mean_abs_diff": s["logprobs"].get("mean_abs_diff"),
            "logprob_tolerance": self.tol,
            "loss_finite": s["train"].get("loss_finite"), "grad_norm_positive": s["train"].get("grad_norm_positive"),
            "weights_changed": s["train"].get("weights_changed"),
            "distributed_optimizer": s["build"].get("distributed_optimizer"),
            "checkpoint_weights_equal": s["checkpoint"].get("weights_equal"),
            "checkpoint_next_step_matches": s["checkpoint"].get("next_step_matches"),
            "publish_names_match": s["publish"].get("names_match"),
            "publish_shapes_match": s["publish"].get("shapes_match"),
            "sender_gloo_bytes_equal": s["weight_sender"].get("gloo", {}).get("bytes_equal"),
            "sender_nccl": s["weight_sender"].get("nccl", {}).get("skipped")
            or s["weight_sender"].get("nccl", {}).get("exercised"),
            "tokens_per_s": s.get("throughput", {}).get("tokens_per_s"), "mfu": s.get("throughput", {}).get("mfu"),
        }
        return r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--tiny", action="store_true", help="a tiny Qwen2 instead of the 0.5B shape")
    ap.add_argument("--fp32", action="store_true", help="fp32 on CUDA too (bf16 by default)")
    ap.add_argument("--lr", type=float, default=1e-3,
                    help="large enough that two Adam steps move bf16 weights by more than their rounding")
    ap.add_argument("--microbatch-tokens", type=int, default=None, help="default: 8192 on CUDA, 4096 on CPU")
    ap.add_argument("--throughput-steps", type=int, default=None, help="timed steps after one warm-up (default: 5; "
                                                                       "--tiny: 1; 0: skip)")
    ap.add_argument("--transformer-engine", choices=["auto", "on", "off"], default="auto")
    ap.add_argument("--peak-tflops", type=float, default=None, help="the device's dense bf16 peak, if not in the table")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    ap.add_argument("--workdir", default=None, help="keep the model, checkpoint and logs here (default: a temp dir)")
    ap.add_argument("--engine-standin", nargs=2, metavar=("BACKEND", "DEVICE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.engine_standin:
        standin_main(*args.engine_standin)
        return 0
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # before torch: init_parallel picks CUDA whenever it sees one
    if args.microbatch_tokens is None:
        args.microbatch_tokens = 8192 if args.device == "cuda" else 4096
    if args.throughput_steps is None:
        args.throughput_steps = 1 if args.tiny else 5
    import warnings

    warnings.filterwarnings("ignore")
    import torch
    import transformers

    transformers.utils.logging.disable_progress_bar()

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        print(json.dumps({"benchmark": "gpu_smoke", "ok": False,
                          "error": "no CUDA device here; for the CPU check run --device cpu --tiny"}))
        return 2
    from clawr1.trainer.megatron_setup import shutdown_parallel

    with tempfile.TemporaryDirectory(prefix="gpu_smoke-") as tmp:
        work = Path(args.workdir) if args.workdir else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        args.workdir = str(work)
        t0 = time.monotonic()
        smoke = Smoke(args)
        try:
            result = smoke.run()
        finally:
            shutdown_parallel()
        result["seconds"] = round(time.monotonic() - t0, 1)
    print(json.dumps(result, default=str), flush=True)
    if smoke.hung:
        os._exit(1)  # a hung NCCL thread would hold the interpreter's exit
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
