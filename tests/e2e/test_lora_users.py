"""Two users in one run, one LoRA adapter each (recipes/combined/cpu_lora_users.yaml), end to end: the users
get their own slots, every sample is sampled and trained through its user's adapter at the version its
tokens say, the teacher is the base with the hint (adapter off) on the serving engine, only adapters are
published, and the run resumes from a LoRA checkpoint and exports PEFT adapters."""
from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import pytest
import torch

from clawr1.pool.store import read_samples
from tests.conftest import REPO
from tests.e2e.test_run import trainer_records
from tests.numerics import assert_as_exact_as, assert_close, gap

pytestmark = pytest.mark.slow


def run(run_dir, *extra: str) -> str:
    out = subprocess.run([sys.executable, "-m", "clawr1.cli", "run", "recipes/combined/cpu_lora_users.yaml",
                          f"run.dir={run_dir}", "trainer.checkpoint_every=2", "rollout.eval_every=4",
                          "rollout.eval_size=8", *extra], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout


def test_two_users_train_their_own_adapters_in_one_run(tiny_model, tmp_path):
    run_dir = tmp_path / "run"
    run(run_dir, "run.max_steps=4")
    slots = json.loads((run_dir / "gateway" / "adapter_slots.json").read_text())
    assert set(slots) == {"u0", "u1"} and sorted(slots.values()) == [0, 1]  # in the order of their first main turns
    samples = list(read_samples(run_dir / "pool"))
    per_slot = Counter(s.adapter_slot for s in samples)
    assert set(per_slot) == {0, 1} and min(per_slot.values()) >= 0.3 * len(samples)  # episodes alternate users
    for s in samples:
        if s.adapter:  # sampled through an adapter: its own user's, and its tokens carry that adapter's version
            name, version = s.adapter.split("@v")
            assert name == f"slot{s.adapter_slot}" and set(s.versions) == {int(version)}
        else:  # before the first adapters reached the gateway: the base, which is every adapter's version 0
            assert set(s.versions) == {0}
    assert_the_teacher_is_the_base_with_the_hint(tiny_model, samples)
    records = trainer_records(run_dir)
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert all(r["slots_stepped"] == 2 and r["grad_norm_slot0"] > 0 and r["grad_norm_slot1"] > 0 for r in records)
    assert all(r["samples_slot0"] + r["samples_slot1"] == r["samples_trained"] for r in records)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["adapter_version"] == 4 and summary["engine_weight_version"] == 0  # the base never moved
    assert not (run_dir / "weights").exists()  # no full-weight publish
    assert sorted(p.name for p in (run_dir / "adapters").glob("v*")) == ["v000003", "v000004"]
    evals = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()
             if "personalization_score_u0" in line]
    assert [r["eval_version"] for r in evals] == [0, 4]
    for r in evals:
        users = [r["personalization_score_u0"], r["personalization_score_u1"]]
        # the mean of two users' scores (a sum, a division), float64 at the scores' magnitude
        assert_close(r["personalization_score"], sum(users) / 2, torch.float64, 2, max(map(abs, users)))

    # resume from the step-4 LoRA checkpoint: steps 5 and 6, the adapters going on from where they were
    run(run_dir, "run.max_steps=6", "--resume")
    assert [r["step"] for r in trainer_records(run_dir)][-2:] == [5, 6]
    evals = [json.loads(line)["eval_version"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()
             if "personalization_score_u0" in line]
    assert evals == [0, 4, 6]  # resumed at the published version 4, already evaluated: not again, nor called 0

    # a run stopped during its final evaluation (the trainer done, the evaluation lost) gets it on --resume
    metrics = run_dir / "metrics.jsonl"
    metrics.write_text("".join(line + "\n" for line in metrics.read_text().splitlines()
                               if json.loads(line).get("eval_version") != 6))
    run(run_dir, "run.max_steps=6", "--resume")
    evals = [json.loads(line)["eval_version"] for line in metrics.read_text().splitlines()
             if "personalization_score_u0" in line]
    assert evals == [0, 4, 6] and [r["step"] for r in trainer_records(run_dir)][-1] == 6  # nothing trained again
    out = subprocess.run([sys.executable, "-m", "clawr1.cli", "export", str(run_dir / "checkpoints" / "step000006"),
                          str(tmp_path / "export")], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    ids = torch.tensor([samples[0].tokens[:12]])
    logits = []
    for slot in (0, 1):
        model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model), str(tmp_path / "export" / f"slot{slot}"))
        with torch.no_grad():
            logits.append(model.eval()(input_ids=ids).logits)
    assert (logits[0] - logits[1]).abs().max() > 1e-3  # two users, two different adapters


def logprobs_at(model, prompt: list[int], response: list[int], temperature: float) -> list[float]:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + response])).logits[0, len(prompt) - 1:-1].double() / temperature
    return logits.log_softmax(-1).gather(1, torch.tensor(response)[:, None])[:, 0].tolist()


def assert_the_teacher_is_the_base_with_the_hint(tiny_model, samples) -> None:
    """A LoRA run's teacher scores on the serving engine with the adapter off: its log-probs are the base model's
    with the hint in the prompt (as exact as fp32 allows), while the same samples' rollout log-probs, sampled
    through a trained adapter, are far from the base's."""
    hinted = [s for s in samples if s.hint and s.teacher_logprobs and s.adapter and min(s.versions) >= 1]
    assert hinted, "no sample sampled through a trained adapter earned a hint"
    for s, base64, fp32_gap in teacher_against_base_with_hint(tiny_model, hinted[:3]):
        base_unhinted = logprobs_at(base64, s.tokens[:s.prompt_len], s.tokens[s.prompt_len:], s.temperature)
        assert gap(s.rollout_logprobs, base_unhinted) > 100 * max(fp32_gap, 1e-7), (
            "the adapter did not move the policy: this sample cannot tell the base from the adapter")


def teacher_against_base_with_hint(tiny_model, hinted: list) -> list[tuple]:
    """Assert each sample's teacher log-probs are the base model's with the hint in the prompt, as exact as fp32
    allows (HF fp32 against fp64); returns (sample, the fp64 base, fp32's own gap) for further checks."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from clawr1.chat import ChatRenderer

    renderer = ChatRenderer(AutoTokenizer.from_pretrained(tiny_model))
    base32, base64 = (AutoModelForCausalLM.from_pretrained(tiny_model, dtype=d).eval()
                      for d in (torch.float32, torch.float64))
    checked = []
    for s in hinted:
        prompt, response = s.tokens[:s.prompt_len], s.tokens[s.prompt_len:]
        teacher_prompt = renderer.with_hint(prompt, s.hint)
        honest, exact = (logprobs_at(m, teacher_prompt, response, s.teacher_temperature) for m in (base32, base64))
        assert_as_exact_as(s.teacher_logprobs, exact, honest, what="the teacher's log-probs against the base's")
        checked.append((s, base64, gap(honest, exact)))
    return checked
