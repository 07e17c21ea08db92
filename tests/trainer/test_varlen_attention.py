"""The one-call attention forms over a packed row against the per-sequence loop they replace."""
from __future__ import annotations

import pytest
import torch

from tests.numerics import assert_as_exact_as

LENGTHS = [5, 1, 17, 9, 30]  # a one-token sequence, and one much longer than the others
HEADS, GROUPS, HEAD_DIM = 4, 2, 16  # grouped-query attention, as Qwen2 has


def attention_module():
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.enums import AttnMaskType

    from clawr1.trainer.varlen_attention import VarlenCoreAttention

    cfg = TransformerConfig(num_layers=1, hidden_size=HEADS * HEAD_DIM, num_attention_heads=HEADS,
                            num_query_groups=GROUPS, kv_channels=HEAD_DIM, use_cpu_initialization=True)
    return VarlenCoreAttention(cfg, layer_number=1, attn_mask_type=AttnMaskType.causal, attention_type="self")


def packed_qkv(device: str, dtype: torch.dtype):
    g = torch.Generator().manual_seed(0)
    total = sum(LENGTHS)
    q = torch.randn(total, HEADS, HEAD_DIM, generator=g)
    k = torch.randn(total, GROUPS, HEAD_DIM, generator=g)
    v = torch.randn(total, GROUPS, HEAD_DIM, generator=g)
    return [t.to(device=device, dtype=dtype) for t in (q, k, v)]


def run(kind: str, qkv, device: str):
    from clawr1.trainer.varlen_attention import packed_seq_params, use_attention

    use_attention(kind)
    try:
        return attention_module()(*qkv, None, packed_seq_params=packed_seq_params(LENGTHS, torch.device(device)))
    finally:
        use_attention("auto")


def test_block_causal_mask_keeps_each_token_to_its_own_sequence_and_past():
    from clawr1.trainer.varlen_attention import block_causal_mask

    mask = block_causal_mask(torch.tensor([0, 2, 3, 6]), 6)
    expected = torch.zeros(6, 6, dtype=torch.bool)
    for start, end in [(0, 2), (2, 3), (3, 6)]:
        expected[start:end, start:end] = torch.ones(end - start, end - start, dtype=torch.bool).tril()
    assert torch.equal(mask, expected)


def test_masked_form_is_as_exact_as_the_per_sequence_loop():
    """Both against an fp64 per-sequence reference: the one-call form errs no more than the loop does."""
    exact = run("per_sequence", packed_qkv("cpu", torch.float64), "cpu")
    qkv = packed_qkv("cpu", torch.float32)
    loop, masked = run("per_sequence", qkv, "cpu"), run("masked", qkv, "cpu")
    assert masked.shape == loop.shape == (sum(LENGTHS), HEADS * HEAD_DIM)
    assert_as_exact_as(masked, exact, loop, torch.float32, what="masked vs fp64")


def test_masked_form_does_not_attend_across_sequences():
    """Changing one sequence's keys leaves every other sequence's output exactly as it was."""
    q, k, v = packed_qkv("cpu", torch.float32)
    before = run("masked", (q, k, v), "cpu")
    k2 = k.clone()
    k2[:5] += 1.0  # the first sequence
    after = run("masked", (q, k2, v), "cpu")
    assert not torch.equal(after[:5], before[:5])
    assert torch.equal(after[5:], before[5:])


def test_auto_runs_the_loop_on_cpu_and_varlen_refuses_cpu():
    from clawr1.trainer.varlen_attention import resolve_attention, use_attention

    assert resolve_attention("auto", torch.device("cpu"), torch.float32) == "per_sequence"
    with pytest.raises(RuntimeError, match="varlen attention needs CUDA"):
        resolve_attention("varlen", torch.device("cpu"), torch.float32)
    with pytest.raises(ValueError, match="not one of"):
        use_attention("flash")


@pytest.mark.cuda
@pytest.mark.parametrize("kind", ["varlen", "masked"])
def test_one_call_forms_on_cuda_are_as_exact_as_the_loop_in_bf16(kind):
    from clawr1.trainer.varlen_attention import resolve_attention

    if resolve_attention("auto", torch.device("cuda"), torch.bfloat16) != "varlen" and kind == "varlen":
        pytest.skip("this torch has no torch.nn.attention.varlen")
    exact = run("per_sequence", packed_qkv("cuda", torch.float64), "cuda").cpu()
    qkv = packed_qkv("cuda", torch.bfloat16)
    loop, one_call = run("per_sequence", qkv, "cuda").cpu(), run(kind, qkv, "cuda").cpu()
    assert_as_exact_as(one_call.float(), exact, loop.float(), torch.bfloat16, what=f"{kind} vs fp64")


def random_qwen2(directory) -> str:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    Qwen2ForCausalLM(Qwen2Config(vocab_size=256, hidden_size=HEADS * HEAD_DIM, intermediate_size=128,
                                 num_hidden_layers=2, num_attention_heads=HEADS, num_key_value_heads=GROUPS,
                                 tie_word_embeddings=True, rope_theta=1e6)).save_pretrained(directory)
    return str(directory)


def test_rotary_in_core_attention_equals_megatrons_packed_rotary_bit_for_bit(tmp_path, megatron_tp1):
    """The model now hands each token's angles to the core attention; megatron's own per-sequence rotary (what
    the model passed before) must give the very same hidden states: the same operations on the same values."""
    from clawr1.trainer.model import build_policy, hidden_states, pack
    from clawr1.trainer.varlen_attention import applies_rotary, packed_seq_params

    policy = build_policy(random_qwen2(tmp_path))
    assert applies_rotary(policy.model)
    g = torch.Generator().manual_seed(1)
    tokens = [torch.randint(0, policy.vocab, (n,), generator=g).tolist() for n in LENGTHS]
    packed = pack(tokens, [1] * len(tokens))
    m = policy.model
    with torch.no_grad():
        ours = hidden_states(policy, packed)
        emb = m.embedding(input_ids=packed.input_ids, position_ids=packed.position_ids)
        megatrons = m.decoder(hidden_states=emb, attention_mask=None,
                              packed_seq_params=packed_seq_params(LENGTHS, emb.device),
                              rotary_pos_emb=m.rotary_pos_emb(max(LENGTHS), packed_seq=True))[:, 0]
    assert torch.equal(ours, megatrons)
