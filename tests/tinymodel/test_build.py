"""The tiny model: its tokenizer gives the loops the ids the warm start trained on, and its build gives the same
weights, bit for bit, whoever starts it."""
from __future__ import annotations

import json

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from clawr1.tinymodel.chatml import END_OF_TEXT, IM_END
from clawr1.config import TinyModelConfig
from clawr1.tinymodel.build import (REFERENCE_CPU_VENDOR, REFERENCE_SHA256, REFERENCE_TORCH, SPECIAL_TOKENS, build_model,
                                   ensure_tiny_model, runs_reference_kernels, saved_tokenizer, train_tokenizer,
                                   weights_sha256)

TEXTS = ["What is 17 times 4? The answer is 68.", "How many m are in 23 km? There are 23000 m.",
         '{"name": "calculator", "arguments": {"expression": "604800 * 7"}}', "Certainly. Hope this helps!"] * 50
SMALL = TinyModelConfig(vocab_size=300, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1,
                        intermediate_size=32)


def test_the_loaded_tokenizer_gives_the_trained_ids_with_digits_one_by_one(tmp_path):
    trained = train_tokenizer(TEXTS, SMALL.vocab_size)
    loaded = saved_tokenizer(trained, build_model(SMALL, trained), tmp_path, TEXTS[:4])
    text = "What is 17 times 4? 604800"
    assert loaded.encode(text, add_special_tokens=False) == trained.encode(text, add_special_tokens=False)
    assert loaded.tokenize(text)[-7:] == ["Ġ", "6", "0", "4", "8", "0", "0"]


def gpt2_style_tokenizer() -> PreTrainedTokenizerFast:
    """How the build trained its tokenizer before: GPT-2 pre-tokens, which merge the digits of " 604800"."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(TEXTS, trainers.BpeTrainer(vocab_size=SMALL.vocab_size, special_tokens=SPECIAL_TOKENS,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=IM_END, pad_token=END_OF_TEXT)


def test_a_tokenizer_that_loads_differently_is_refused(tmp_path):
    trained = gpt2_style_tokenizer()
    assert len(trained.tokenize(" 604800")) < 7  # digits merged: what the old warm start trained on
    with pytest.raises(RuntimeError, match="loads differently from how it was trained"):
        saved_tokenizer(trained, build_model(SMALL, trained), tmp_path, TEXTS[:4])


# ---------------------------------------------------------------- the same weights on every machine

# the warm start's batches have the shapes of any build's (16 of 300 examples); 8 steps are enough for three threads'
# sums to differ from one thread's, which is all the control below needs
BUILD = TinyModelConfig(vocab_size=512, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                        intermediate_size=128, sft_steps=8, sft_examples=300, sft_batch_size=16)


def built_sha256(model_dir) -> str:
    recorded = json.loads((model_dir / "clawr1_build.json").read_text())["sha256"]
    assert recorded == weights_sha256(model_dir)  # the record is the weights' checksum
    return recorded


def test_a_build_gives_the_same_weights_whatever_the_caller_set(tmp_path, monkeypatch):
    """The build pins its own threads and kernels: the caller's thread count and CPU capability do not leak in."""
    plain = built_sha256(ensure_tiny_model(BUILD, tmp_path / "plain"))
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    monkeypatch.setenv("MKL_NUM_THREADS", "3")
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")  # an unvectorized kernel set: other sums
    threads = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        other_caller = built_sha256(ensure_tiny_model(BUILD, tmp_path / "other-caller"))
    finally:
        torch.set_num_threads(threads)
    assert plain == other_caller
    # the control: three build threads split the sums otherwise, so the pin is what made the two equal
    assert built_sha256(ensure_tiny_model(BUILD.model_copy(update={"build_threads": 3}), tmp_path / "3")) != plain


@pytest.mark.skipif(not runs_reference_kernels() or torch.__version__.split("+")[0] != REFERENCE_TORCH,
                    reason=f"the reference build is made with x86-64 AVX2 kernels on an {REFERENCE_CPU_VENDOR} CPU "
                           f"and torch {REFERENCE_TORCH}")
def test_the_default_model_is_the_reference_build(tiny_model):
    """The default spec is in the reference table, and this machine built those weights bit for bit."""
    spec = tiny_model.name.removeprefix("tiny-qwen2-")
    assert spec in REFERENCE_SHA256, f"the default spec {spec} has no reference checksum (update REFERENCE_SHA256)"
    assert built_sha256(tiny_model) == REFERENCE_SHA256[spec]
