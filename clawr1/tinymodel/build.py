"""`clawr1 init-model`: a tiny tokenizer and Qwen2 model, built and warm-started locally.

No downloads. The byte-level BPE tokenizer is trained on text shipped in the
repo plus warm-start conversations; the model is a small Qwen2-architecture
network in HF format, warm-started with a short supervised pass on those
conversations. The conversations come from a function (n, seed) -> [(messages,
tools)] named in the config by import path, so this module knows no environment.
Results are cached by a hash of everything that goes into them, so a second call
returns at once. The build runs in a child process whose numerics are pinned
(`pinned_build_env`): the same spec gives the same weights, bit for bit, on any
x86-64 machine with the pinned torch, and `clawr1_build.json` records their sha256.
torch is imported only where the build runs: every loop finds the cached model through
`ensure_tiny_model`, and the gateway and the judge never need torch.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

from clawr1.config import TinyModelConfig
from clawr1.runtime import die_with_parent, file_sha256, load_object
from clawr1.tinymodel.chatml import CHATML_JINJA, END_OF_TEXT, IM_END, IM_START, encode_for_training, render_text

if TYPE_CHECKING:
    import torch

# bump when the build procedure changes, to invalidate caches (3: the tokenizer trains as it loads; 4: built in a
# pinned process, its weights' sha256 recorded)
BUILD_VERSION = 4
# spec hash -> the weights' sha256 that build gives on x86-64 with AVX2, an AMD CPU and torch REFERENCE_TORCH (the
# default spec: docs/two_commands.md, "The tiny model, the same everywhere"); a build of one of these specs that
# gives other weights says so loudly.
# Pinned to AVX2, an Intel Xeon still built other weights (955b4fb6...), most likely by MKL's vendor-specific paths.
REFERENCE_TORCH = "2.13.0"
REFERENCE_CPU_VENDOR = "AuthenticAMD"
REFERENCE_SHA256: dict[str, str] = {
    "27b08558224e": "bb26b05b08c2edeaca9d73dbda35177975845d6a803370d41d6e80e5dc6bcaee",
}
CORPUS_DIR = Path(__file__).parent / "corpus"
Conversation = tuple[list[dict], Optional[list[dict]]]  # (messages, tools)
Conversations = Callable[[int, int], list[Conversation]]  # (how many, seed) -> conversations
# Qwen2's pre-tokenizer: digits one by one. transformers 5 rebuilds this pipeline when it loads a qwen2 model's
# tokenizer, whatever tokenizer.json says, so the tokenizer trains with it: the ids it learns are the ids served.
QWEN2_PRETOKENIZE_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIAL_TOKENS = [END_OF_TEXT, IM_START, IM_END, "<tool_call>", "</tool_call>", "<tool_response>",
                  "</tool_response>", "<think>", "</think>"]


def _log(msg: str) -> None:
    print(f"[init-model] {msg}", flush=True)


def _spec(cfg: TinyModelConfig) -> dict:
    """What the build depends on in the config (the warm-start import path is hashed through its data)."""
    return cfg.model_dump(exclude={"warm_start"})


def spec_hash(cfg: TinyModelConfig, conversations: Conversations) -> str:
    """Everything the build trains on: config, corpus, and a sample of the rendered warm-start data.

    Hashing the rendered data rather than source files means a refactor of the env or
    chat-template code does not force a rebuild, while any change to what the model sees does.
    """
    h = hashlib.sha256(json.dumps(_spec(cfg), sort_keys=True).encode())
    h.update(str(BUILD_VERSION).encode())
    for path in sorted(CORPUS_DIR.glob("*.txt")):
        h.update(path.read_bytes())
    for text in _conversation_texts(conversations(200, cfg.seed)):
        h.update(text.encode())
    return h.hexdigest()[:12]


def _conversation_texts(convs: list[Conversation]) -> list[str]:
    return [render_text(msgs, tools) for msgs, tools in convs]


def train_tokenizer(texts: list[str], vocab_size: int):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=IM_END, pad_token=END_OF_TEXT,
                                   additional_special_tokens=SPECIAL_TOKENS[3:])
    fast.chat_template = CHATML_JINJA
    return fast


def saved_tokenizer(trained, model: torch.nn.Module, out_dir: Path, probe_texts: list[str]):
    """Save the tokenizer beside the model's config and load it back the way every loop does (AutoTokenizer).

    The warm start trains on the loaded tokenizer's ids, so it teaches the ids the engine will serve;
    a loader that tokenizes differently from the trained tokenizer is an error here, not a silent drift.
    """
    from transformers import AutoTokenizer

    model.config.save_pretrained(out_dir)  # AutoTokenizer picks its class from the model's config
    trained.save_pretrained(out_dir)
    loaded = AutoTokenizer.from_pretrained(out_dir)
    for text in probe_texts:
        ids, loaded_ids = trained.encode(text, add_special_tokens=False), loaded.encode(text, add_special_tokens=False)
        if ids != loaded_ids:
            raise RuntimeError(f"the tiny tokenizer loads differently from how it was trained: {text[:80]!r} is "
                               f"{trained.convert_ids_to_tokens(ids)[:20]} trained, "
                               f"{loaded.convert_ids_to_tokens(loaded_ids)[:20]} loaded")
    return loaded


def build_model(cfg: TinyModelConfig, tokenizer) -> torch.nn.Module:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
        max_position_embeddings=cfg.max_position_embeddings, rope_theta=cfg.rope_theta, rms_norm_eps=1e-6,
        tie_word_embeddings=True, eos_token_id=tokenizer.convert_tokens_to_ids(IM_END),
        pad_token_id=tokenizer.convert_tokens_to_ids(END_OF_TEXT), bos_token_id=None, torch_dtype="float32",
    )
    torch.manual_seed(cfg.seed)
    return Qwen2ForCausalLM(config)


def _batches(examples: list[tuple[list[int], list[int]]], batch_size: int, steps: int, seed: int, pad_id: int):
    """Random batches of similar-length examples (a window of the length-sorted list): little padding."""
    import torch

    g = torch.Generator().manual_seed(seed)
    by_length = sorted(range(len(examples)), key=lambda i: len(examples[i][0]))
    for _ in range(steps):
        start = int(torch.randint(len(examples) - batch_size + 1, (1,), generator=g))
        idx = by_length[start : start + batch_size]
        width = max(len(examples[i][0]) for i in idx)
        ids = torch.full((batch_size, width), pad_id)
        mask = torch.zeros(batch_size, width)
        for row, i in enumerate(idx):
            toks, m = examples[i]
            ids[row, : len(toks)] = torch.tensor(toks)
            mask[row, : len(m)] = torch.tensor(m, dtype=torch.float)
        yield ids, mask


def warm_start(model: torch.nn.Module, tokenizer, convs: list[Conversation],
               cfg: TinyModelConfig) -> list[float]:
    """Supervised pass on assistant tokens; returns the loss curve (one value per 100 steps)."""
    import torch

    examples = [encode_for_training(tokenizer, msgs, tools) for msgs, tools in convs]
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.sft_lr, weight_decay=0.01)
    warmup = max(1, cfg.sft_steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, cfg.sft_steps) / cfg.sft_steps)))
    model.train()
    curve, running, t0 = [], 0.0, time.time()
    for step, (ids, mask) in enumerate(_batches(examples, cfg.sft_batch_size, cfg.sft_steps, cfg.seed, tokenizer.pad_token_id)):
        logits = model(input_ids=ids).logits[:, :-1]
        nll = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="none")
        target_mask = mask[:, 1:].reshape(-1)
        loss = (nll * target_mask).sum() / target_mask.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        running += loss.item()
        if (step + 1) % 100 == 0:
            curve.append(running / 100)
            _log(f"warm start step {step + 1}/{cfg.sft_steps} loss {running / 100:.3f} ({time.time() - t0:.0f}s)")
            running = 0.0
    model.eval()
    return curve


def build_tiny_model(cfg: TinyModelConfig, out_dir: Path, conversations: Conversations) -> Path:
    """Tokenizer, model and warm start, in this process as it is set up (`ensure_tiny_model` pins it first)."""
    import torch

    torch.manual_seed(cfg.seed)
    convs = conversations(cfg.sft_examples, cfg.seed)
    texts = [p.read_text() for p in sorted(CORPUS_DIR.glob("*.txt"))] + _conversation_texts(convs)
    _log(f"training a {cfg.vocab_size}-token byte-level BPE tokenizer on {len(texts)} texts")
    trained = train_tokenizer(texts, cfg.vocab_size)
    model = build_model(cfg, trained)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = saved_tokenizer(trained, model, out_dir, texts[-50:])
    n_params = sum(p.numel() for p in model.parameters())
    _log(f"Qwen2 model: {cfg.num_layers} layers, hidden {cfg.hidden_size}, {n_params / 1e6:.2f}M parameters")
    curve = warm_start(model, tokenizer, convs, cfg)
    model.save_pretrained(out_dir, safe_serialization=True)
    build = {"sha256": weights_sha256(out_dir), "torch": torch.__version__, "machine": platform.machine(),
             "cpu_capability": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads()}
    (out_dir / "clawr1_build.json").write_text(json.dumps({"spec": cfg.model_dump(), "loss_curve": curve,
                                                           **build}, indent=1))
    return out_dir


def weights_sha256(model_dir: Path) -> str:
    return file_sha256(model_dir / "model.safetensors")


def x86_64_with_avx2() -> bool:
    """Whether this machine runs the reference build's kernels (the build pins AVX2 here)."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return False
    try:
        return " avx2 " in f" {Path('/proc/cpuinfo').read_text()} ".replace("\n", " ")
    except OSError:
        return False


def cpu_vendor() -> str:
    """/proc/cpuinfo's vendor_id ("AuthenticAMD", "GenuineIntel"); "" where there is none."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return ""
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("vendor_id")), "")


def runs_reference_kernels() -> bool:
    """Whether this machine is of the kind that made the reference builds (x86-64, AVX2, the same CPU vendor)."""
    return x86_64_with_avx2() and cpu_vendor() == REFERENCE_CPU_VENDOR


def pinned_build_env(threads: int) -> dict[str, str]:
    """The environment of a build process: the same kernels, so the same rounding, on any x86-64 machine.

    torch picks its vectorized kernels by what the CPU offers (AVX-512 where present) and MKL and oneDNN pick
    theirs by CPU model; a different kernel sums in a different order. Pinned to AVX2, every x86-64 machine
    with AVX2 runs the same code. The thread count splits sums too (a small spec gave one checksum with 1, 2
    and 4 threads, others with 3 and 8), so it is part of the spec, not the machine's core count.
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)  # the warm-start import path resolves as here
    env.update({name: str(threads) for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "RAYON_NUM_THREADS")})
    for name in ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA"):
        env.pop(name, None)
    if x86_64_with_avx2():
        env.update(ATEN_CPU_CAPABILITY="avx2", MKL_CBWR="AVX2", ONEDNN_MAX_CPU_ISA="AVX2")
    return env


def build_in_pinned_process(cfg: TinyModelConfig, out_dir: Path) -> dict:
    """Build in a child process started with `pinned_build_env` (its settings only take effect at start-up)."""
    cmd = [sys.executable, "-m", "clawr1.tinymodel.build", str(out_dir), cfg.model_dump_json()]
    done = subprocess.run(cmd, env=pinned_build_env(cfg.build_threads), preexec_fn=die_with_parent)
    if done.returncode != 0:
        raise RuntimeError(f"the tiny model's build process exited with code {done.returncode} (its output is above)")
    return json.loads((out_dir / "clawr1_build.json").read_text())


def _check_reference(spec: str, built: dict) -> None:
    reference = REFERENCE_SHA256.get(spec)
    if reference is None:
        _log(f"weights sha256 {built['sha256']} (no reference build for this spec)")
    elif built["sha256"] == reference:
        _log(f"weights sha256 {built['sha256']}: the reference build, bit for bit")
    else:
        _log(f"WARNING: weights sha256 {built['sha256']} differ from the reference build's {reference} (made on "
             f"x86-64 with AVX2 kernels, an {REFERENCE_CPU_VENDOR} CPU and torch {REFERENCE_TORCH}; this one: "
             f"{built['machine']}, {built['cpu_capability']}, {cpu_vendor() or 'unknown vendor'}, torch "
             f"{built['torch']}): the results in docs/ are the reference build's")


def build_once(final: Path, marker: str, build: Callable[[Path], None]) -> Path:
    """`final`, made by `build(partial_dir)` unless `final / marker` exists already; safe across processes (a second
    builder waits on the lock, then finds it), and a build that dies leaves only its partial directory."""
    final.parent.mkdir(parents=True, exist_ok=True)
    with open(final.parent / f"{final.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (final / marker).exists():
            partial = final.parent / f"{final.name}.partial"
            shutil.rmtree(partial, ignore_errors=True)
            build(partial)
            partial.rename(final)
    return final


def ensure_tiny_model(cfg: TinyModelConfig, cache: Path) -> Path:
    """Path of the cached tiny model, building it first if needed (safe across processes)."""
    spec = spec_hash(cfg, load_object(cfg.warm_start, "model.tiny.warm_start"))
    final = cache / f"tiny-qwen2-{spec}"

    def build(partial: Path) -> None:
        t0 = time.time()
        _check_reference(spec, build_in_pinned_process(cfg, partial))
        _log(f"built {final} in {time.time() - t0:.0f}s")

    return build_once(final, "config.json", build)


def main(argv: list[str]) -> int:
    """The build process: `python -m clawr1.tinymodel.build OUT_DIR SPEC_JSON`, started by `ensure_tiny_model`."""
    import torch

    out_dir, spec_json = Path(argv[0]), argv[1]
    cfg = TinyModelConfig.model_validate_json(spec_json)
    torch.set_num_threads(cfg.build_threads)
    torch.use_deterministic_algorithms(True)
    build_tiny_model(cfg, out_dir, load_object(cfg.warm_start, "model.tiny.warm_start"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
