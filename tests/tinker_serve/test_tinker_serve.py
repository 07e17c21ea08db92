"""`clawr1 tinker-serve` end to end on CPU: the unchanged Tinker SDK trains the tiny model's LoRA adapter through
clawr1's Megatron trainer and samples through clawr1's engine, with the adapter each save loads into it."""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO
from tests.numerics import assert_close, forward_depth, logit_magnitude
from tests.tinker_serve_process import tinker_serve

tinker = pytest.importorskip("tinker", reason="needs the Tinker SDK (the `tinker` extra: scripts/setup.sh installs it)")
from tinker import types  # noqa: E402

pytestmark = pytest.mark.slow
KEY = "tml-clawr1-test-key-3f9a"  # what clients must send; it must appear in no file the run writes
SDK_ENV = {"TINKER_TELEMETRY": "0"}
SLOTS = 6  # every test here makes its own training client


@pytest.fixture(scope="module")
def served(tiny_model, tmp_path_factory):
    """A tinker-serve on the tiny model: (its URL, the model name, the run directory)."""
    run_dir = tmp_path_factory.mktemp("tinker") / "run"
    with tinker_serve(run_dir, tiny_model, KEY, slots=SLOTS) as url:
        yield url, Path(tiny_model).name, run_dir


def service(url: str, key: str = KEY) -> "tinker.ServiceClient":
    os.environ.update(SDK_ENV)
    return tinker.ServiceClient(base_url=url, api_key=key)


def test_the_sdk_example_trains_two_steps_and_the_served_weights_change_each_time(served):
    url, model_name, _ = served
    out = subprocess.run([sys.executable, "examples/tinker_rl.py", "--base-url", url, "--base-model", model_name,
                          "--steps", "2"], cwd=REPO, capture_output=True, text=True, timeout=600,
                         env={**os.environ, **SDK_ENV, "TINKER_API_KEY": KEY})
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert [line["step"] for line in lines] == [0, 1, 2]
    probes = [line["probe_logprob"] for line in lines]
    assert probes[0] != probes[1] != probes[2]  # each step's saved sampler serves new weights
    assert all(0.0 <= line["reward_mean"] <= 1.0 for line in lines[1:])


def test_the_trainer_scores_what_the_engine_serves(served, tiny_model):
    """After a step, the trainer's log-probs of a sequence (forward) and the engine's with the saved adapter
    (compute_logprobs) are the same computation in fp32 by different kernels."""
    url, model_name, _ = served
    sc = service(url)
    try:
        trainer = sc.create_lora_training_client(base_model=model_name, rank=8)
        tokens = [11, 12, 13, 40, 42, 44, 46]
        datum = types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                            loss_fn_inputs={"target_tokens": tokens[1:], "weights": [0.0, 0.0, 1.0, 1.0, 1.0, 1.0]})
        before = trainer.forward([datum], "cross_entropy").result()
        trainer.forward_backward([datum], "cross_entropy").result()
        trainer.optim_step(types.AdamParams(learning_rate=1e-2)).result()
        after = trainer.forward([datum], "cross_entropy").result()
        sampler = trainer.save_weights_and_get_sampling_client()
        served_logprobs = sampler.compute_logprobs(types.ModelInput.from_ints(tokens)).result()[1:]
        trained = after.loss_fn_outputs[0]["logprobs"].to_torch()
        assert after.metrics["loss:sum"] < before.metrics["loss:sum"]  # the step lowered the trained loss
        # each path rounds up to forward_depth times at the logits' scale, in the base and in the adapter
        scale = logit_magnitude(tiny_model, [tokens])
        assert_close(torch.tensor(served_logprobs), trained, torch.float32, 2 * forward_depth(tiny_model), scale,
                     "engine vs trainer")
    finally:
        sc.close("success").result(timeout=30)


@pytest.mark.parametrize("call, message", [
    (lambda tc: tc.forward_backward([types.Datum(model_input=types.ModelInput.from_ints([1, 2]),
                                                 loss_fn_inputs={"target_tokens": [2, 3]})], "dro").result(),
     "unsupported loss_fn 'dro'"),
    (lambda tc: tc.forward_backward([types.Datum(model_input=types.ModelInput.from_ints([1, 2]),
                                                 loss_fn_inputs={"target_tokens": [2, 3], "advantages": [0.0, 1.0]})],
                                    "ppo").result(), "needs loss_fn_inputs logprobs"),
    (lambda tc: tc.forward_backward([types.Datum(model_input=types.ModelInput.from_ints([1, 2]),
                                                 loss_fn_inputs={"target_tokens": [2, 10 ** 7]})],
                                    "cross_entropy").result(), "outside the vocabulary"),
])
def test_a_call_the_server_cannot_do_fails_with_its_reason(served, call, message):
    url, model_name, _ = served
    sc = service(url)
    try:
        trainer = sc.create_lora_training_client(base_model=model_name, rank=8)
        with pytest.raises(Exception, match=message):
            call(trainer)
    finally:
        sc.close("success").result(timeout=30)


def test_a_wrong_key_is_refused_and_the_key_is_written_nowhere(served):
    url, model_name, run_dir = served
    sc = service(url, key="tml-not-the-key")
    try:
        with pytest.raises(Exception):
            sc.create_lora_training_client(base_model=model_name, rank=8)
    finally:
        with contextlib.suppress(Exception):  # the server may refuse the key here too; its heartbeats stop either way
            sc.close("errored").result(timeout=30)
    written = [p for p in run_dir.rglob("*") if p.is_file() and KEY.encode() in p.read_bytes()]
    assert not written


def test_checkpoints_are_listed_deleted_and_what_the_server_saved_for_the_real_trainer(served):
    """The RestClient against the real trainer: a saved state and sampler weights are listed with their paths,
    a bad sampler path is refused when the client is made, and a deleted checkpoint's files are gone."""
    url, model_name, run_dir = served
    sc = service(url)
    try:
        trainer = sc.create_lora_training_client(base_model=model_name, rank=8, seed=3)
        state = trainer.save_state("kept").result().path
        with pytest.raises(Exception, match="saved already"):
            trainer.save_state("kept").result()
        sampler = trainer.save_weights_for_sampler("w").result().path
        rest = sc.create_rest_client()
        listed = [c.tinker_path for c in rest.list_checkpoints(trainer.model_id).result().checkpoints]
        assert listed == [state, sampler]
        files = sorted(p for p in (run_dir / "tinker").rglob("*") if p.name in ("kept.pt", "w"))
        assert len(files) == 2
        rest.delete_checkpoint_from_tinker_path(state).result()
        rest.delete_checkpoint_from_tinker_path(sampler).result()
        assert not any(p.exists() for p in files) and rest.list_checkpoints(trainer.model_id).result().checkpoints == []
        with pytest.raises(Exception, match="no sampler weights at"):
            sc.create_sampling_client(model_path=sampler).result(timeout=60)
    finally:
        sc.close("success").result(timeout=30)


TOKENIZER_CLIENT = """
import json, sys, tinker
client = tinker.ServiceClient(base_url=sys.argv[1])
training = client.create_lora_training_client(base_model=sys.argv[2], rank=8).result()
sampling = client.create_sampling_client(base_model=sys.argv[2]).result()
print(json.dumps([t.encode("Hello, tokenizer!") for t in (training.get_tokenizer(), sampling.get_tokenizer())]))
client.close("success").result(timeout=30)
"""


def test_a_client_elsewhere_loads_the_tokenizer_from_the_server_with_no_hub(served, tiny_model, tmp_path):
    """Both clients' get_tokenizer() on a machine with nothing of the model: an empty Hub cache of its own, no
    network but the server, HF_ENDPOINT at the server's /hub and the key as HF_TOKEN."""
    from transformers import AutoTokenizer

    url, model_name, _ = served
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(SDK_ENV, TINKER_API_KEY=KEY, HF_ENDPOINT=f"{url}/hub", HF_TOKEN=KEY, HF_HOME=str(tmp_path / "hf"),
               HF_HUB_DISABLE_TELEMETRY="1")
    out = subprocess.run([sys.executable, "-c", TOKENIZER_CLIENT, url, model_name], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    expected = AutoTokenizer.from_pretrained(tiny_model).encode("Hello, tokenizer!")
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [expected, expected]
    assert any((tmp_path / "hf").rglob("tokenizer.json"))  # fetched into the client's own cache
    refused = subprocess.run([sys.executable, "-c", TOKENIZER_CLIENT, url, model_name], cwd=tmp_path,
                             capture_output=True, text=True, timeout=300,
                             env={**env, "HF_TOKEN": "tml-wrong", "HF_HOME": str(tmp_path / "hf2")})
    assert refused.returncode != 0  # the files need the key too


def test_the_rank_the_client_asks_for_is_served_up_to_the_limit(served):
    url, model_name, run_dir = served
    sc = service(url)
    try:
        with pytest.raises(Exception, match=r"LoRA rank 33 is not served: this server trains ranks 1 to 32 "
                                            r"\(lora.max_rank\)"):
            sc.create_lora_training_client(base_model=model_name, rank=33).result()
        for rank in (None, 4):  # the SDK's default (32), and a small one
            trainer = (sc.create_lora_training_client(base_model=model_name) if rank is None else
                       sc.create_lora_training_client(base_model=model_name, rank=rank)).result()
            assert trainer.get_info().lora_rank == (rank or 32)
            datum = types.Datum(model_input=types.ModelInput.from_ints([11, 12, 13]),
                                loss_fn_inputs={"target_tokens": [12, 13, 14], "weights": [1.0, 1.0, 1.0]})
            trainer.forward_backward([datum], "cross_entropy").result()
            trainer.optim_step(types.AdamParams(learning_rate=1e-2)).result()
            name = f"rank{rank or 32}"
            trainer.save_weights_for_sampler(name).result()
            adapter = next(run_dir.joinpath("tinker", "sampler_weights").rglob(name))
            config = json.loads((adapter / "adapter_config.json").read_text())
            from safetensors.torch import load_file

            tensors = load_file(str(adapter / "adapter_model.safetensors"))
            assert config["r"] == (rank or 32) and config["lora_alpha"] == pytest.approx(16.0 * (rank or 32) / 32)
            assert all(t.shape[0 if "lora_A" in k else 1] == (rank or 32) for k, t in tensors.items())
    finally:
        sc.close("success").result(timeout=30)
