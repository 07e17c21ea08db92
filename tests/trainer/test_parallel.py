"""TP=2 and DP=2 (two gloo processes each) take the same step as one process."""
from __future__ import annotations

import os
import random
import subprocess
import sys

import msgspec
import pytest
import torch

from clawr1.config import free_port
from clawr1.protocol import Sample
from tests.conftest import REPO


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


def run_ranks(tiny_model, samples_path, out, world: int, tp: int) -> dict:
    port = str(free_port())
    procs = [subprocess.Popen(
        [sys.executable, "-m", "tests.trainer.parallel_worker", str(tiny_model), str(samples_path), str(out), str(tp)],
        cwd=REPO, env={**os.environ, "RANK": str(r), "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": port}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for r in range(world)]
    for p in procs:
        output, _ = p.communicate(timeout=300)
        assert p.returncode == 0, output[-3000:]
    return torch.load(out)


@pytest.fixture(scope="module")
def single(tiny_model, tmp_path_factory):
    d = tmp_path_factory.mktemp("parallel")
    path = d / "samples.bin"
    path.write_bytes(msgspec.msgpack.encode(synthetic_samples()))
    return path, run_ranks(tiny_model, path, d / "tp1.pt", world=1, tp=1)


def assert_same_step(a: dict, b: dict) -> None:
    assert abs(a["loss"] - b["loss"]) < 1e-5
    assert abs(a["grad_norm"] - b["grad_norm"]) < 1e-5 * max(1.0, a["grad_norm"])
    assert a["grad_norm"] > 0.05  # clipping (at 0.05) was active, so the global norm had to be right
    assert set(a["grads"]) == set(b["grads"])
    assert max((a["grads"][k] - b["grads"][k]).abs().max().item() for k in a["grads"]) < 1e-5
    assert max((a["weights"][k] - b["weights"][k]).abs().max().item() for k in a["weights"]) < 1e-5


def test_tensor_parallel_2_matches_one_process(tiny_model, single, tmp_path):
    path, reference = single
    assert_same_step(reference, run_ranks(tiny_model, path, tmp_path / "tp2.pt", world=2, tp=2))


def test_data_parallel_2_matches_one_process(tiny_model, single, tmp_path):
    path, reference = single
    assert_same_step(reference, run_ranks(tiny_model, path, tmp_path / "dp2.pt", world=2, tp=1))
