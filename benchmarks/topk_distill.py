"""Top-k distillation loss: our single-gather, chunked implementation vs a k-pass reference.

Both compute the reverse KL between student and teacher over the teacher's top-k
tokens plus a tail bin, forward and backward, from hidden states through the
output layer. Ours makes logits a chunk of tokens at a time and takes the
sampled token and all k teacher ids with one gather per chunk; the reference
makes the full logits and takes one pass over the vocabulary per top-k id.

Prints one JSON line: time and peak memory of each, and the ratios.
Usage: python benchmarks/topk_distill.py [--tokens 4096 --vocab 32768 --k 50 --hidden 256]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.peakmem import peak_mb, run_case  # noqa: E402
from clawr1.algo.losses import topk_reverse_kl  # noqa: E402
from clawr1.trainer.logprobs import chunked_logprob_entropy  # noqa: E402


def inputs(tokens: int, vocab: int, k: int, hidden: int):
    g = torch.Generator().manual_seed(0)
    h = torch.randn(tokens, hidden, generator=g, requires_grad=True)
    weight = (torch.randn(vocab, hidden, generator=g) * 0.05).requires_grad_()
    targets = torch.randint(vocab, (tokens,), generator=g)
    ids = torch.stack([torch.randperm(vocab, generator=g)[:k] for _ in range(tokens)])
    teacher = torch.log_softmax(torch.randn(tokens, k + 1, generator=g), -1)[:, :k]  # k probabilities + a tail
    return h, weight, targets, ids, teacher


def ours(h, weight, targets, ids, teacher) -> torch.Tensor:
    _, _, student = chunked_logprob_entropy(h, targets, lambda x: x @ weight.t(), 0, None, chunk_tokens=512,
                                            extra_ids=ids)
    return topk_reverse_kl(student, teacher).sum()


def k_pass(h, weight, targets, ids, teacher) -> torch.Tensor:
    logits = h @ weight.t()
    cols = [logits.gather(1, ids[:, j:j + 1])[:, 0] - torch.logsumexp(logits, dim=-1) for j in range(ids.shape[1])]
    return topk_reverse_kl(torch.stack(cols, dim=1), teacher).sum()


def case(variant: str, tokens: int, vocab: int, k: int, hidden: int) -> None:
    torch.set_num_threads(2)
    fn = {"ours": ours, "k_pass": k_pass}[variant]
    args = inputs(tokens, vocab, k, hidden)
    timing = {}

    def work() -> None:
        t0 = time.perf_counter()
        loss = fn(*args)
        loss.backward()
        timing["s"] = time.perf_counter() - t0
        timing["loss"] = float(loss)

    mb = peak_mb(work)  # the first run measures memory: memory freed by a warm-up would hide the growth
    for a in args[:2]:
        a.grad = None
    work()  # the second run is timed
    print(json.dumps({"variant": variant, "time_s": round(timing["s"], 3), "peak_mb": mb, "loss": timing["loss"]}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--k", type=int, default=50)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--case", nargs=5, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.case:
        case(a.case[0], *map(int, a.case[1:]))
        return
    shape = [str(a.tokens), str(a.vocab), str(a.k), str(a.hidden)]
    r_ours, r_ref = run_case(__file__, "ours", *shape), run_case(__file__, "k_pass", *shape)
    assert abs(r_ours["loss"] - r_ref["loss"]) <= 1e-3 * max(1.0, abs(r_ref["loss"])), (r_ours, r_ref)
    print(json.dumps({
        "benchmark": "topk_distill", "tokens": a.tokens, "vocab": a.vocab, "k": a.k, "hidden": a.hidden,
        "single_gather_s": r_ours["time_s"], "k_pass_s": r_ref["time_s"],
        "speedup": round(r_ref["time_s"] / r_ours["time_s"], 2),
        "single_gather_peak_mb": r_ours["peak_mb"], "k_pass_peak_mb": r_ref["peak_mb"],
        "memory_ratio": round(r_ref["peak_mb"] / max(r_ours["peak_mb"], 1e-6), 2),
        "same_loss": True,
    }))


if __name__ == "__main__":
    main()
