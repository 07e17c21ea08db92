"""kill -9 of the trainer, then --resume: the same loss sequence as a run that was never interrupted."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from clawr1.config import save_config
from clawr1.pool.store import SamplePool
from tests.conftest import REPO, make_config
from tests.trainer.test_parallel import synthetic_samples

STEPS, BATCH = 6, 4


def losses(run_dir: Path) -> dict[int, float]:
    """Loss of each step; for a step trained twice (before and after a crash) the later record."""
    out = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r["loop"] == "trainer" and "pg_loss" in r:
            out[r["step"]] = r["pg_loss"]
    return out


def trained_steps(run_dir: Path) -> int:
    return len(losses(run_dir)) if (run_dir / "metrics.jsonl").exists() else 0


def prepare(run_dir: Path):
    cfg = make_config(run_dir, f"pool.batch_size={BATCH}", "pool.max_staleness=1000", f"run.max_steps={STEPS}",
                      "trainer.checkpoint_every=2", "trainer.lr=1e-3")
    pool = SamplePool(run_dir / "pool", max_staleness=1000)
    pool.add(synthetic_samples(STEPS * BATCH, seed=3))
    pool.close()
    save_config(cfg, run_dir / "config.yaml")
    return cfg


def trainer(cfg, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "clawr1.cli", "train", "--config", str(cfg.run_dir / "config.yaml"), *extra],
                            cwd=REPO, stdout=open(cfg.run_dir / "trainer.log", "ab"), stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


@pytest.fixture
def services(loops):
    def start(cfg):
        pool, engine = loops(cfg, "pool"), loops(cfg, "serve")
        pool.wait_file(cfg.run_dir / "state" / "pool.ready")
        engine.wait_http(f"{cfg.engine_url}/health")
    return start


def test_interrupted_and_resumed_training_reproduces_the_loss_sequence(tiny_model, tmp_path, services):
    straight = prepare(tmp_path / "straight")
    services(straight)
    proc = trainer(straight)
    assert proc.wait(timeout=300) == 0
    reference = losses(straight.run_dir)
    assert sorted(reference) == list(range(1, STEPS + 1))

    broken = prepare(tmp_path / "broken")
    services(broken)
    proc = trainer(broken)
    deadline = time.monotonic() + 300
    while trained_steps(broken.run_dir) < 3:
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)  # mid-run: step 3 is trained but only step 2 is checkpointed
    proc.wait()
    assert trainer(broken, "--resume").wait(timeout=300) == 0
    # versions count the steps published: the checkpoint (step 2) went back out as version 2, so the engine
    # ends at the trainer's final step, not at one more per resume
    assert int(httpx.get(f"{broken.engine_url}/get_model_info").json()["weight_version"]) == STEPS
    finals = [json.loads(line) for line in (broken.run_dir / "metrics.jsonl").read_text().splitlines()
              if "final_version" in line]
    assert finals[-1]["final_version"] == STEPS and finals[-1]["final_engine_versions"] == [STEPS]
    resumed = losses(broken.run_dir)
    assert sorted(resumed) == list(range(1, STEPS + 1))
    assert [resumed[s] for s in range(1, STEPS + 1)] == [reference[s] for s in range(1, STEPS + 1)]

    pool = SamplePool(broken.run_dir / "pool", max_staleness=1000)
    assert pool.committed_batch_id == STEPS and not pool.leases and not pool.pending

    # the final checkpoint, exported, is exactly the last published weights
    from clawr1.trainer.export import export_checkpoint
    from clawr1.trainer.hf_io import load_hf_state

    exported = load_hf_state(export_checkpoint(broken.run_dir / "checkpoints" / f"step{STEPS:06d}", tmp_path / "export"))
    published = load_hf_state(max((broken.run_dir / "weights").iterdir()))
    assert set(exported) == set(published) and all((exported[k] == published[k]).all() for k in exported)


def test_export_of_a_tp2_checkpoint_is_the_original_hf_model(tiny_model, tmp_path):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from clawr1.trainer.checkpoint import CheckpointMeta
    from clawr1.trainer.convert import ArchSpec, hf_to_megatron
    from clawr1.trainer.hf_io import load_hf_state

    arch = ArchSpec.from_hf(AutoConfig.from_pretrained(tiny_model))
    hf = load_hf_state(tiny_model)
    ckpt = tmp_path / "step000001"
    ckpt.mkdir()
    for rank in range(2):
        torch.save({"model": hf_to_megatron(hf, arch, rank, 2)}, ckpt / f"rank{rank:03d}.pt")
    meta = CheckpointMeta(step=1, version=1, last_batch_id=1, base_model=str(tiny_model), tp=2, dp=1, family="qwen2")
    (ckpt / "meta.json").write_text(json.dumps(meta.__dict__))
    out = subprocess.run([sys.executable, "-m", "clawr1.cli", "export", str(ckpt), str(tmp_path / "hf")], cwd=REPO,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    exported = load_hf_state(tmp_path / "hf")
    assert all(torch.equal(exported[k], hf[k]) for k in exported) and set(exported) == set(hf) - {"lm_head.weight"}
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")  # transformers loads it as is
    assert model.config.model_type == "qwen2" and (tmp_path / "hf" / "tokenizer.json").exists()


def test_export_refuses_what_is_not_a_checkpoint(tmp_path):
    out = subprocess.run([sys.executable, "-m", "clawr1.cli", "export", str(tmp_path), str(tmp_path / "o")], cwd=REPO,
                         capture_output=True, text=True)
    assert out.returncode != 0 and "not a clawr1 checkpoint" in out.stderr


def trainers(cfg, world: int, *extra: str) -> list[subprocess.Popen]:
    """`world` trainer ranks (tensor parallel) for one run."""
    from clawr1.ports import free_port

    port = str(free_port())
    return [subprocess.Popen([sys.executable, "-m", "clawr1.cli", "train", "--config", str(cfg.run_dir / "config.yaml"),
                              *extra], cwd=REPO, stdout=open(cfg.run_dir / f"trainer-{r}.log", "ab"),
                             stderr=subprocess.STDOUT,
                             env={**os.environ, "PYTHONUNBUFFERED": "1", "RANK": str(r), "WORLD_SIZE": str(world),
                                  "LOCAL_RANK": str(r), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port})
            for r in range(world)]


def test_tensor_parallel_2_resume_restores_every_rank_and_the_loss_sequence(tiny_model, tmp_path, services):
    """Issue 15: each TP rank writes and restores its own shard (model, optimizer); the losses are the uninterrupted ones."""
    def prepare_tp2(run_dir):
        cfg = prepare(run_dir)
        cfg.trainer.tensor_parallel = 2
        save_config(cfg, run_dir / "config.yaml")
        return cfg

    straight = prepare_tp2(tmp_path / "straight")
    services(straight)
    assert all(p.wait(timeout=300) == 0 for p in trainers(straight, 2))
    reference = losses(straight.run_dir)

    broken = prepare_tp2(tmp_path / "broken")
    services(broken)
    procs = trainers(broken, 2)
    deadline = time.monotonic() + 300
    while trained_steps(broken.run_dir) < 3:
        assert all(p.poll() is None for p in procs) and time.monotonic() < deadline
        time.sleep(0.05)
    for p in procs:
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
    newest = max((broken.run_dir / "checkpoints").glob("step*"))  # step 2 unless the kill came late
    shards = sorted(newest.glob("rank*.pt"))
    assert [p.name for p in shards] == ["rank000.pt", "rank001.pt"]
    assert all(p.wait(timeout=300) == 0 for p in trainers(broken, 2, "--resume"))
    resumed = losses(broken.run_dir)
    assert sorted(resumed) == list(range(1, STEPS + 1))
    # bit for bit, as with one rank: each rank restores its shard and runs the same kernels on the same shapes, and
    # a two-rank all-reduce adds the same two numbers
    assert [resumed[s] for s in range(1, STEPS + 1)] == [reference[s] for s in range(1, STEPS + 1)], (resumed, reference)


def test_distributed_optimizer_state_has_one_file_per_model_parallel_rank(tmp_path):
    from clawr1.trainer.checkpoint import parameter_state_file

    names = {parameter_state_file(tmp_path, r).name for r in range(4)}
    assert len(names) == 4 and parameter_state_file(tmp_path, 1).name == "optimizer_parameter_state_mp001.pt"
