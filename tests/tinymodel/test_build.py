"""The tiny model's tokenizer: what the warm start trains on is what the loops load."""
from __future__ import annotations

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from clawr1.chat import END_OF_TEXT, IM_END

from clawr1.config import TinyModelConfig
from clawr1.tinymodel.build import SPECIAL_TOKENS, build_model, saved_tokenizer, train_tokenizer

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
