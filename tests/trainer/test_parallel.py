"""TP=2 and DP=2 (two gloo processes each) take the same step as one process."""
from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
import typing
from pathlib import Path

import msgspec
import pytest
import torch

from clawr1.ports import free_port
from clawr1.protocol import Sample
from tests.conftest import REPO
from tests.numerics import (assert_all_close, assert_close, forward_depth, gap, grad_depth, magnitude_of,
                            tolerance)


def synthetic_samples(n: int = 12, vocab: int = 1000, seed: int = 0, topk: int = 4) -> list[Sample]:
    """Random samples with every kind of signal: rewards (in groups of two and alone), teachers, top-k teachers."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        p, r = rng.randint(5, 40), rng.randint(3, 30)
        teacher = [-rng.random() * 3 for _ in range(r)] if i % 3 else None
        ids = lps = None
        if topk and i % 4 == 1:
            ids = [rng.sample(range(vocab), topk) for _ in range(r)]
            lps = [sorted((-rng.random() * 4 - 0.1 for _ in range(topk)), reverse=True) for _ in range(r)]
        out.append(Sample(sample_id=f"s{i}", group_id=f"g{i // 2}" if i < n // 2 else f"s{i}",
                          tokens=[rng.randrange(vocab) for _ in range(p + r)], prompt_len=p, loss_mask=[1] * r,
                          rollout_logprobs=[-rng.random() * 3 for _ in range(r)], versions=[0] * r,
                          reward=rng.choice([1.0, -1.0, None]), teacher_logprobs=teacher, teacher_topk_ids=ids,
                          teacher_topk_logprobs=lps, task_id=f"t{i % 2}"))
    return out


def rank_processes(args: list[str], world: int, worker: str) -> None:
    """`world` ranks of `python -m worker ARGS` under one rendezvous; each must exit 0."""
    port = str(free_port())
    procs = [subprocess.Popen(
        [sys.executable, "-m", worker, *args],
        cwd=REPO, env={**os.environ, "RANK": str(r), "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": port}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for r in range(world)]
    try:
        for p in procs:
            output, _ = p.communicate(timeout=300)  # a hang (ranks reducing lists that differ) fails here
            assert p.returncode == 0, output[-3000:]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def run_ranks(tiny_model, samples_path, out, world: int, tp: int, worker: str, **options) -> dict:
    """One step of `worker` (MODEL SAMPLES OUT TP OPTIONS_JSON) on `world` ranks: rank 0's saved result."""
    rank_processes([str(tiny_model), str(samples_path), str(out), str(tp), json.dumps(options)], world, worker)
    return torch.load(out, weights_only=False)


class Job(typing.NamedTuple):
    """One training step the parallelism tests compare: its model, its samples and its algo overrides."""
    model: Path
    samples: Path
    algo: dict


def run_jobs(jobs: dict[str, Job], out_dir: Path, world: int, tp: int) -> dict[str, dict]:
    """Every job's step in one process group of `world` ranks (tests.trainer.parallel_worker): rank 0's results."""
    out_dir.mkdir(parents=True, exist_ok=True)
    spec = [{"model": str(j.model), "samples": str(j.samples), "out": str(out_dir / f"{name}.pt"), "algo": j.algo}
            for name, j in jobs.items()]
    (out_dir / "jobs.json").write_text(json.dumps(spec))
    rank_processes([str(out_dir / "jobs.json"), str(tp)], world, "tests.trainer.parallel_worker")
    return {name: torch.load(out_dir / f"{name}.pt", weights_only=False) for name in jobs}


def write_samples(path: Path, samples: list[Sample]) -> Path:
    path.write_bytes(msgspec.msgpack.encode(samples))
    return path


def top_k_on_one_rank_only() -> list[Sample]:
    """The longest sample (with a top-k teacher) goes to rank 0, the other (without) to rank 1."""
    long, short = synthetic_samples(n=4, seed=7, topk=4)[1], synthetic_samples(n=4, seed=8, topk=0)[0]
    long.tokens, long.loss_mask = long.tokens * 3, long.loss_mask  # longer: keeps the same response
    long.prompt_len = len(long.tokens) - len(long.loss_mask)
    assert long.teacher_topk_ids and not short.teacher_topk_ids and len(long.tokens) > len(short.tokens)
    return [long, short]


@pytest.fixture(scope="module")
def steps(tiny_model, tmp_path_factory) -> dict[str, dict]:
    """Every job's step in one process (`single`), and under DP=2 (`dp2`) and TP=2 (`tp2`) where a test asks for
    them: three process groups for the module, not three per test. `jobs` are the jobs."""
    from tests.trainer.families import save_random_model

    d = tmp_path_factory.mktemp("parallel")
    odd_vocab = save_random_model("qwen2-tied", d / "odd-vocab", vocab_size=251)
    jobs = {
        "every_objective": Job(tiny_model, write_samples(d / "every.bin", synthetic_samples()), {}),
        "minibatches_epochs": Job(tiny_model, write_samples(d / "mb.bin", synthetic_samples(seed=5)),
                                  {"minibatches": 2, "ppo_epochs": 2}),
        "top_k_one_rank": Job(tiny_model, write_samples(d / "topk.bin", top_k_on_one_rank_only()), {}),
        "empty_rank": Job(tiny_model, write_samples(d / "empty.bin", synthetic_samples(n=4, seed=9)[1:2]),
                          {"dual_clip": 0.0}),
        "odd_vocab": Job(odd_vocab, write_samples(d / "odd.bin", synthetic_samples(n=6, vocab=250, seed=11, topk=0)),
                         {"w_topk": 0.0, "entropy_coef": 0.05}),
    }
    under_dp = ("every_objective", "minibatches_epochs", "top_k_one_rank", "empty_rank")
    under_tp = ("every_objective", "odd_vocab")
    return {"jobs": jobs, "single": run_jobs(jobs, d / "single", world=1, tp=1),
            "dp2": run_jobs({k: jobs[k] for k in under_dp}, d / "dp2", world=2, tp=1),
            "tp2": run_jobs({k: jobs[k] for k in under_tp}, d / "tp2", world=2, tp=2)}


def largest(tensors: dict) -> float:
    return max(magnitude_of(t) for t in tensors.values())


# The promise of TP=2 and DP=2 against one process: the same sums in another order, not bit for bit (the error
# model of tests/numerics.py's forward_depth). TP splits each row-parallel matmul's reduction over the ranks and
# all-reduces the halves, and its column-parallel matmuls run on other shapes (another kernel blocking); DP adds
# the two ranks' gradients in one more sum.
def assert_same_step(a: dict, b: dict, model, steps: int = 1) -> None:
    """After `steps` optimizer steps: each step's rounding adds its own, and the earlier ones carry over (gain ~1)."""
    depth = steps * grad_depth(model)
    # the loss averages per-token terms (ratio x advantage, entropy, KL) of order 1: their scale, not the mean's
    assert_close(b["loss"], a["loss"], torch.float32, forward_depth(model) + 2, max(1.0, abs(a["loss"])), "loss")
    assert_close(b["grad_norm"], a["grad_norm"], torch.float32, depth + 1, what="grad norm")  # relative: a norm
    assert a["grad_norm"] > 0.05  # clipping (at 0.05) was active, so the global norm had to be right
    assert_all_close(b["grads"], a["grads"], torch.float32, depth, what="grads")
    assert_same_weights(a["weights"], b["weights"], a["grads"], depth, slope=1e-3 / 1e-3,  # lr / adam_eps
                        roundings=2 * steps)


def assert_same_weights(a: dict, b: dict, grads: dict, depth: int, slope: float, roundings: int = 2,
                        what: str = "weights") -> None:
    """AdamW's first step moves a weight by lr * g / (|g| + adam_eps), whose slope in g is at most `slope` =
    lr / adam_eps: a weight differs by slope x its (clipped) gradient's gap, plus the roundings of the weight
    itself (two a step: decay, update)."""
    bound = slope * tolerance(torch.float32, largest(grads), depth) + tolerance(torch.float32, largest(a), roundings)
    assert set(a) == set(b), f"{what}: keys differ"
    worst = max(gap(b[k], a[k]) for k in a)
    assert worst <= bound, f"{what}: gap {worst:.4g} > {bound:.4g}"


def test_tensor_parallel_2_matches_one_process(tiny_model, steps):
    assert_same_step(steps["single"]["every_objective"], steps["tp2"]["every_objective"], tiny_model)


def test_data_parallel_2_matches_one_process(tiny_model, steps):
    assert_same_step(steps["single"]["every_objective"], steps["dp2"]["every_objective"], tiny_model)


def test_data_parallel_with_minibatches_and_epochs_matches_one_process(tiny_model, steps):
    """Old log-probs are computed for exactly the samples each rank trains on (was a KeyError)."""
    assert_same_step(steps["single"]["minibatches_epochs"], steps["dp2"]["minibatches_epochs"], tiny_model,
                     steps=2 * 2)  # minibatches x ppo_epochs


def test_data_parallel_metrics_with_top_k_on_one_rank_only(tiny_model, steps):
    reference, parallel = steps["single"]["top_k_one_rank"], steps["dp2"]["top_k_one_rank"]
    assert_same_step(reference, parallel, tiny_model)
    # the top-k KL: log-softmax over the vocabulary, then a sum over k and the tokens: two reductions more
    assert_close(parallel["stats"]["topk_kl"], reference["stats"]["topk_kl"], torch.float32, forward_depth(tiny_model) + 2)
    assert parallel["stats"]["topk_kl"] > 0


def test_data_parallel_with_an_empty_rank(tiny_model, steps):
    reference, parallel = steps["single"]["empty_rank"], steps["dp2"]["empty_rank"]
    assert parallel["stats"]["samples"] == 1
    assert_same_step(reference, parallel, tiny_model)


def test_entropy_is_finite_under_tensor_parallelism_with_a_padded_vocabulary(steps):
    """A vocabulary of 251 split over 2 ranks gets one padding column: entropy and its gradient stay finite."""
    reference, sharded = steps["single"]["odd_vocab"], steps["tp2"]["odd_vocab"]
    model = steps["jobs"]["odd_vocab"].model
    assert json.loads((model / "config.json").read_text())["vocab_size"] % 2 == 1
    assert math.isfinite(sharded["stats"]["entropy"]) and sharded["stats"]["entropy"] > 0
    # entropy: a sum over the vocabulary (split over the ranks under TP), then a mean over the tokens
    assert_close(sharded["stats"]["entropy"], reference["stats"]["entropy"], torch.float32, forward_depth(model) + 2)
    assert all(torch.isfinite(g).all() for g in sharded["grads"].values())
    assert_same_step(reference, sharded, model)


def test_megatron_ddp_sums_gradients_instead_of_averaging(tiny_model):
    """Our loss is already divided by the whole batch's token count: megatron's DDP (GPU) must not divide again by
    dp, or grad norms and clipping would be dp times off there (the CPU path's DP=2 test above holds the norm)."""
    from transformers import AutoConfig

    from clawr1.trainer.convert import ArchSpec
    from clawr1.trainer.model import transformer_config

    cfg = transformer_config(ArchSpec.from_hf(AutoConfig.from_pretrained(tiny_model)), tp=1, dtype=torch.float32)
    assert cfg.calculate_per_token_loss is True
