"""trainer.share_prefixes on the batches of a real run: the tokens a step computes with flat packs and with prefix
trees, and the trainer's time on one batch of Qwen2.5-Coder-0.5B-Instruct with one LoRA adapter per user, both
packings in the same run.

    python benchmarks/prefix_sharing.py extract RUN_DIR   # a learning run's batches -> docs/benchmarks/prefix-sharing/
    python benchmarks/prefix_sharing.py                   # tokens of every committed batch, the time of one

`extract` reads the run's pool (its samples and the ledger's batches) and writes, for every batch, its samples'
lengths, LoRA slots and prefix sharing (tokens only, no text), and one whole batch of samples for the timing: the
batch with the median token count. The timing builds the recipe's trainer (recipes/combined/cpu_qwen05_lora.yaml:
LoRA rank 16, its micro-batch budget, one slot per user), takes one step with each packing from the same
adapters (after one untimed warm-up step of each on two samples), and reports seconds, tokens/s of the sample
tokens, and the loss gap. One JSON line is printed last.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import msgspec  # noqa: E402

from clawr1.protocol import Sample  # noqa: E402

DATA = REPO / "docs/benchmarks/prefix-sharing"
RECIPE = REPO / "recipes/combined/cpu_qwen05_lora.yaml"
MODEL = "qwen2.5-coder-0.5b-instruct"


def tree_tokens(samples: list[Sample]) -> int:
    from clawr1.trainer.prefix_tree import build_prefix_tree

    return len(build_prefix_tree([s.tokens for s in samples], [s.adapter_slot for s in samples]).tokens)


def packed_tokens(samples: list[Sample], budget: int, share: bool) -> tuple[int, int]:
    """(tokens computed, micro-batches) for a batch cut as the trainer cuts it."""
    from clawr1.trainer.step import micro_batches

    mbs = micro_batches(samples, budget, share)
    return sum(tree_tokens(mb) if share else sum(len(s.tokens) for s in mb) for mb in mbs), len(mbs)


def extract(run_dir: Path) -> None:
    from clawr1.pool.store import LedgerRecord, Lease, read_samples
    from clawr1.record_log import read_records

    pool = run_dir / "pool"
    by_id = {s.sample_id: s for s in read_samples(pool)}
    leases = [r for r in read_records(pool / "ledger.log", LedgerRecord) if isinstance(r, Lease) and r.sample_ids]
    batches = [[by_id[i] for i in lease.sample_ids] for lease in leases]
    if not batches:
        raise SystemExit(f"no leased batches in {pool}")
    DATA.mkdir(parents=True, exist_ok=True)
    budget = recipe_budget()
    rows = []
    for b in batches:
        (flat, flat_parts), (tree, tree_parts) = packed_tokens(b, budget, False), packed_tokens(b, budget, True)
        rows.append({"lengths": [len(s.tokens) for s in b], "prompt_lens": [s.prompt_len for s in b],
                     "slots": [s.adapter_slot for s in b], "tree_tokens_whole_batch": tree_tokens(b),
                     "flat_tokens": flat, "flat_micro_batches": flat_parts, "tree_tokens": tree,
                     "tree_micro_batches": tree_parts})
    data = {"run": run_dir.name, "budget": budget, "batches": rows}
    (DATA / "batches.json").write_text(json.dumps(data, indent=1) + "\n")
    median = sorted(range(len(batches)), key=lambda k: sum(rows[k]["lengths"]))[len(batches) // 2]
    (DATA / "batch.json").write_bytes(msgspec.json.encode(batches[median]) + b"\n")
    print(f"[prefix_sharing] {len(batches)} batches of {run_dir.name}; batch {median} kept for the timing", flush=True)


def load_batch() -> list[Sample]:
    return msgspec.json.decode((DATA / "batch.json").read_bytes(), type=list[Sample])


def recipe_budget() -> int:
    from clawr1.config import load_config

    return load_config(RECIPE).trainer.max_tokens_per_microbatch


def token_counts() -> dict:
    """Over every committed batch (counted at extraction, at the recipe's micro-batch budget then): the tokens a
    step computes flat and as prefix trees, and the tree of the whole batch at once (the bound)."""
    data = json.loads((DATA / "batches.json").read_text())
    rows = data["batches"]
    flat, tree = sum(r["flat_tokens"] for r in rows), sum(r["tree_tokens"] for r in rows)
    return {"run": data["run"], "batches": len(rows), "budget_at_extraction": data["budget"],
            "tokens_per_batch": round(statistics.mean(r["flat_tokens"] for r in rows), 1),
            "tree_tokens_per_batch": round(statistics.mean(r["tree_tokens"] for r in rows), 1),
            "flat_over_tree": round(flat / tree, 3),
            "flat_over_tree_whole_batch": round(flat / sum(r["tree_tokens_whole_batch"] for r in rows), 3)}


def timed_steps(batch: list[Sample], threads: int) -> dict:
    import copy

    import torch

    from clawr1.config import ModelConfig, load_config
    from clawr1.model_path import resolve_model_path
    from clawr1.trainer.lora import TARGETS, LoraAdapters, LoraShape
    from clawr1.trainer.megatron_setup import init_parallel
    from clawr1.trainer.model import build_policy
    from clawr1.trainer.step import train_step

    torch.set_num_threads(threads)
    init_parallel(1)
    cfg = load_config(RECIPE)
    slots = max(s.adapter_slot for s in batch) + 1
    policy = build_policy(resolve_model_path(ModelConfig(name=MODEL)))
    policy.model.requires_grad_(False)
    policy.lora = LoraAdapters(policy.model, policy.arch, LoraShape(cfg.lora.rank, cfg.lora.alpha, TARGETS, slots), 1, 0)

    class Gradients:  # the step's gradients kept, the adapters left as they are: both packings start alike
        def zero_grad(self):
            policy.lora.zero_grad(set_to_none=True)

        def step(self, slots=None):
            return {"grad_norm": 0.0, "lr": 0.0}

    budget, out = cfg.trainer.max_tokens_per_microbatch, {}
    for share in (False, True):  # warm-up: the first step's one-time work (allocations, lazy init) is not timed
        policy.share_prefixes = share
        train_step(policy, Gradients(), copy.deepcopy(batch[:2]), cfg.algo, budget)
    for name, share in (("flat", False), ("tree", True)):
        policy.share_prefixes = share
        computed, parts = packed_tokens(batch, budget, share)
        t0 = time.perf_counter()
        stats = train_step(policy, Gradients(), copy.deepcopy(batch), cfg.algo, budget)
        seconds = time.perf_counter() - t0
        out[name] = {"seconds": round(seconds, 1), "tokens_computed": computed, "micro_batches": parts,
                     "sample_tokens_per_s": round(sum(len(s.tokens) for s in batch) / seconds, 1),
                     "pg_loss": stats["pg_loss"]}
        print(f"[prefix_sharing] {name}: {json.dumps(out[name])}", file=sys.stderr, flush=True)
    out["speedup"] = round(out["flat"]["seconds"] / out["tree"]["seconds"], 3)
    out["loss_gap"] = abs(out["flat"]["pg_loss"] - out["tree"]["pg_loss"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", nargs="?", default="measure", choices=["measure", "extract"])
    ap.add_argument("run_dir", nargs="?", type=Path, help="extract: the run whose pool to read")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-timing", action="store_true", help="only count tokens (no model)")
    ap.add_argument("--samples", type=int, default=0, help="time only the batch's first N samples (0: all)")
    args = ap.parse_args()
    if args.what == "extract":
        if args.run_dir is None:
            raise SystemExit("extract needs the run's directory")
        extract(args.run_dir)
        return
    batch = load_batch()
    if args.samples:
        batch = batch[:args.samples]
    result = {"benchmark": "prefix_sharing", "model": MODEL, "budget": recipe_budget(), **token_counts(),
              "timed_batch": {"samples": len(batch), "tokens": sum(len(s.tokens) for s in batch),
                              "response_tokens": sum(s.response_len for s in batch)}}
    if not args.no_timing:
        result["timing"] = timed_steps(batch, args.threads)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
