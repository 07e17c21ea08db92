"""The policy as a megatron-core GPTModel, and a packed forward that returns per-token log-probs.

Samples of different lengths are packed end to end into one row in megatron's
THD format (`PackedSeqParams` with cumulative sequence lengths): rotary
positions restart at 0 for every sample and attention never crosses samples,
so a packed row computes exactly what separate rows would, with no padding.
"""
from __future__ import annotations

import contextlib
import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from clawr1.trainer.convert import ArchSpec, from_te_names, hf_to_megatron, to_te_names


def _left_as_allocated(weight: Tensor) -> None:
    """megatron's init_method for weights that are loaded right after building: no random draw."""


def transformer_config(a: ArchSpec, tp: int, dtype: torch.dtype, fused: tuple[str, ...] = ()):
    from megatron.core.transformer import TransformerConfig

    return TransformerConfig(
        num_layers=a.num_layers, hidden_size=a.hidden, num_attention_heads=a.heads, num_query_groups=a.kv_heads,
        kv_channels=a.head_dim, ffn_hidden_size=a.ffn, normalization="RMSNorm", layernorm_epsilon=a.norm_eps,
        gated_linear_unit=True, activation_func=F.silu, add_bias_linear=False, add_qkv_bias=a.qkv_bias,
        qk_layernorm=a.qk_norm, tensor_model_parallel_size=tp, use_cpu_initialization=True, params_dtype=dtype,
        # every weight is loaded from the checkpoint right after (load_megatron_state refuses a missing one): drawing
        # random weights first took half of a 0.5B model's 20 s build on CPU. Not perform_initialization=False:
        # megatron then also skips marking the tensor-parallel weights, and the grad-norm clip counts them wrong
        init_method=_left_as_allocated, output_layer_init_method=_left_as_allocated,
        embedding_init_method=_left_as_allocated,
        bf16=dtype == torch.bfloat16, hidden_dropout=0.0, attention_dropout=0.0, bias_activation_fusion=False,
        bias_dropout_fusion=False, masked_softmax_fusion=False, persist_layer_norm=False,
        gradient_accumulation_fusion=False, apply_rope_fusion=False, attention_softmax_in_fp32=True,
        # our loss is already divided by the whole batch's token count: megatron's DDP must sum gradients
        # over data-parallel ranks, not average them (else grad norms and clipping are dp times off on GPU)
        calculate_per_token_loss=True,
        # despite the name, this only makes megatron's MLP build its activation from the layer spec (FusedSwiGLU)
        use_te_activation_func="swiglu" in fused,
    )


def layer_spec(a: ArchSpec, use_te: bool, fused: tuple[str, ...] = ()):
    """The decoder's spec: TransformerEngine's layers, or megatron's local ones with our core attention and the
    `fused` Triton kernels (trainer.fused_kernels) in place of the plain norm, activation and rotary."""
    from megatron.core.models.gpt import gpt_layer_specs
    from megatron.core.transformer.spec_utils import ModuleSpec
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules

    if use_te:  # TransformerEngine's attention takes packed sequences natively
        if fused:
            raise ValueError(f"trainer.fused_kernels {list(fused)} replace the local layers, not TransformerEngine's")
        return gpt_layer_specs.get_gpt_layer_with_transformer_engine_spec(qk_layernorm=a.qk_norm)
    from clawr1.trainer.varlen_attention import VarlenCoreAttention

    spec = gpt_layer_specs.get_gpt_layer_local_spec(qk_layernorm=a.qk_norm, normalization="RMSNorm")
    attention = spec.submodules.self_attention.submodules
    attention.core_attention = ModuleSpec(module=VarlenCoreAttention, params={"fused_rope": "rope" in fused})
    if not fused:
        return spec
    final_norm = None
    if "rmsnorm" in fused:
        from clawr1.trainer.fused.rmsnorm import FusedRMSNorm

        spec.submodules.input_layernorm = spec.submodules.pre_mlp_layernorm = final_norm = FusedRMSNorm
        if a.qk_norm:
            attention.q_layernorm = attention.k_layernorm = FusedRMSNorm
    if "swiglu" in fused:
        from clawr1.trainer.fused.swiglu import FusedSwiGLU

        spec.submodules.mlp.submodules.activation_func = FusedSwiGLU
    if final_norm is None:
        return spec
    return TransformerBlockSubmodules(layer_specs=[spec] * a.num_layers, layer_norm=final_norm)


def padded_vocab_size(vocab: int, tp: int) -> int:
    return -(-vocab // tp) * tp


def hf_inv_freq(hf_config) -> Tensor:
    """The HF model's rotary inverse frequencies (any scaling rule it applies), for exact parity."""
    family = hf_config.model_type
    module = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    cls = next(getattr(module, n) for n in dir(module) if n.endswith("RotaryEmbedding"))
    return cls(hf_config).inv_freq.float()


@dataclass
class Policy:
    model: torch.nn.Module  # megatron GPTModel
    arch: ArchSpec
    hf_config: object
    tp: int
    lora: Optional[object] = None  # clawr1.trainer.lora.LoraAdapters when the run trains adapters
    fused: tuple[str, ...] = ()  # trainer.fused_kernels it was built with
    share_prefixes: bool = False  # trainer.share_prefixes: micro-batches packed as prefix trees


    @property
    def vocab(self) -> int:
        return self.arch.vocab


def build_policy(hf_path: str | Path, tp: int = 1, tp_rank: int = 0, dtype: torch.dtype = torch.float32,
                 use_te: bool = False, fused: tuple[str, ...] = ()) -> Policy:
    """GPTModel with the HF checkpoint's weights (this rank's shard); `fused`: trainer.fused_kernels."""
    if "lmhead" in fused and tp > 1:
        raise ValueError("the fused LM head (trainer.fused_kernels lmhead) needs the whole vocabulary on one rank: tp=1")
    from megatron.core.models.gpt import GPTModel
    from transformers import AutoConfig

    from clawr1.trainer.hf_io import load_hf_state

    hf_config = AutoConfig.from_pretrained(hf_path)
    a = ArchSpec.from_hf(hf_config)
    vocab = padded_vocab_size(a.vocab, tp)
    model = GPTModel(
        config=transformer_config(a, tp, dtype, fused), transformer_layer_spec=layer_spec(a, use_te, fused), vocab_size=vocab,
        max_sequence_length=a.max_positions, pre_process=True, post_process=True,
        share_embeddings_and_output_weights=a.tied, position_embedding_type="rope", rotary_base=int(a.rope_theta),
    )
    cast_parameters(model, dtype)
    with torch.no_grad():
        model.rotary_pos_emb.inv_freq.copy_(hf_inv_freq(hf_config))
    state = hf_to_megatron(load_hf_state(Path(hf_path)), a, tp_rank, tp, padded_vocab=vocab)
    load_megatron_state(model, to_te_names(state) if use_te else state)
    return Policy(model=model, arch=a, hf_config=hf_config, tp=tp, fused=tuple(fused))


def cast_parameters(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """Every parameter in `dtype`. Megatron's torch-norm fallback (no TransformerEngine, no Apex) makes its
    norm weights in fp32 whatever params_dtype says; a bf16 model with fp32 norms publishes mixed dtypes
    and breaks the distributed optimizer's parameter-state save (found on an H200). Buffers such as the
    rotary inv_freq stay as they are."""
    for param in model.parameters():
        if param.dtype != dtype:
            param.data = param.data.to(dtype)


def load_megatron_state(model: torch.nn.Module, state: dict[str, Tensor]) -> None:
    own = {k: v for k, v in model.state_dict().items() if not k.endswith("_extra_state")}
    missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    if missing or unexpected:
        raise ValueError(f"megatron state does not fit the model: missing {missing[:5]}, unexpected {unexpected[:5]}")
    with torch.no_grad():
        for name, t in state.items():
            if own[name].shape != t.shape:
                raise ValueError(f"{name}: shape {tuple(t.shape)} does not fit {tuple(own[name].shape)}")
            own[name].copy_(t)


def megatron_state(model: torch.nn.Module) -> dict[str, Tensor]:
    """The model's weights under local-spec names, whichever layer spec built it."""
    return from_te_names({k: v.detach() for k, v in model.state_dict().items() if not k.endswith("_extra_state")})


# ---------------------------------------------------------------- packed forward
@dataclass
class Packed:
    """Samples laid end to end in one row, or as a prefix tree (trainer.share_prefixes)."""

    input_ids: Tensor  # [1, T]
    position_ids: Tensor  # [1, T], restarting at 0 for every sample (a tree: each token's depth)
    lengths: list[int]  # tokens of each sample (a tree: of each tree)
    predict_at: Tensor  # [R] positions whose next-token prediction is a response token
    targets: Tensor  # [R] those response tokens
    sample_index: Tensor  # [R] which sample each response token belongs to
    token_slots: Optional[Tensor] = None  # [T] the LoRA slot each token goes through (-1: the base alone)
    tree_masks: Optional[list[Optional[Tensor]]] = None  # a tree: per entry of lengths, its ancestor mask (None: causal)


def pack(token_lists: list[list[int]], prompt_lens: list[int], slots: Optional[list[int]] = None,
         share_prefixes: bool = False) -> Packed:
    """The samples in one row. With `share_prefixes`, as a prefix tree (clawr1/trainer/prefix_tree.py): tokens that
    begin several samples (with the same LoRA slot) are packed once."""
    if share_prefixes:
        return _pack_tree(token_lists, prompt_lens, slots)
    ids, pos, predict_at, targets, owner = [], [], [], [], []
    offset = 0
    for i, (toks, p) in enumerate(zip(token_lists, prompt_lens)):
        n = len(toks)
        ids += toks
        pos += range(n)
        predict_at += range(offset + p - 1, offset + n - 1)
        targets += toks[p:]
        owner += [i] * (n - p)
        offset += n
    return Packed(
        input_ids=torch.tensor([ids]), position_ids=torch.tensor([pos]), lengths=[len(t) for t in token_lists],
        predict_at=torch.tensor(predict_at), targets=torch.tensor(targets), sample_index=torch.tensor(owner),
        token_slots=None if slots is None else torch.tensor([k for k, t in zip(slots, token_lists) for _ in t]),
    )


def _pack_tree(token_lists: list[list[int]], prompt_lens: list[int], slots: Optional[list[int]]) -> Packed:
    from clawr1.trainer.prefix_tree import build_prefix_tree

    tree = build_prefix_tree(token_lists, slots if slots is not None else [0] * len(token_lists))
    predict_at, targets, owner = [], [], []
    for i, (toks, p) in enumerate(zip(token_lists, prompt_lens)):
        predict_at += tree.paths[i][p - 1:len(toks) - 1]  # the node before each response token
        targets += toks[p:]
        owner += [i] * (len(toks) - p)
    return Packed(
        input_ids=torch.tensor([tree.tokens]), position_ids=torch.tensor([tree.depth]),
        lengths=[b - a for a, b in tree.spans], predict_at=torch.tensor(predict_at, dtype=torch.long),
        targets=torch.tensor(targets, dtype=torch.long), sample_index=torch.tensor(owner, dtype=torch.long),
        token_slots=None if slots is None else torch.tensor(tree.slot), tree_masks=tree.masks(),
    )


def hidden_states(policy: Policy, packed: Packed) -> Tensor:
    """Final hidden states [T, hidden] of a packed row."""
    from clawr1.trainer.varlen_attention import applies_rotary, packed_seq_params

    m = policy.model
    device = next(m.parameters()).device
    ids, pos = packed.input_ids.to(device), packed.position_ids.to(device)
    emb = m.embedding(input_ids=ids, position_ids=pos)  # [T, 1, H]
    rotary = m.rotary_pos_emb(max(packed.lengths), packed_seq=True)  # [longest, 1, 1, dim]: angles by position
    if applies_rotary(m):  # each token's angles to our core attention, which rotates the whole pack at once
        masks = None if packed.tree_masks is None else [t if t is None else t.to(device) for t in packed.tree_masks]
        params, rotary = packed_seq_params(packed.lengths, device, rotary_freqs=rotary[pos[0]], tree_masks=masks), None
    elif packed.tree_masks is not None:
        raise ValueError("trainer.share_prefixes needs the trainer's own core attention (megatron's local layers), "
                         "not TransformerEngine's: set trainer.transformer_engine=off")
    else:
        params = packed_seq_params(packed.lengths, device)
    routing = policy.lora.route(packed.token_slots) if policy.lora is not None else contextlib.nullcontext()
    with routing:
        h = m.decoder(hidden_states=emb, attention_mask=None, rotary_pos_emb=rotary, packed_seq_params=params)
    return h[:, 0]


Temperature = float | Tensor  # one for every row, or one per row [R]


def _row_temperatures(temperature: Temperature, rows: int, device) -> Tensor:
    if isinstance(temperature, Tensor):
        if temperature.shape != (rows,):
            raise ValueError(f"temperatures must have one entry per row ({rows}), got shape {tuple(temperature.shape)}")
        return temperature.to(device=device, dtype=torch.float32)
    return torch.full((rows,), float(temperature), device=device)


def logprobs_and_entropy(policy: Policy, hidden: Tensor, targets: Tensor, temperature: Temperature = 1.0,
                         chunk_tokens: int = 1024, extra_ids: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor | None]:
    """log p(target | context), the entropy, and log p of `extra_ids` [R, k] (if given) at each row of
    `hidden` ([R, H]), in bounded memory, with the logits divided by the row's sampling temperature.

    Under tensor parallelism the output layer holds a vocabulary shard; the
    softmax statistics are combined across the TP group.
    """
    from megatron.core import parallel_state

    from clawr1.trainer.logprobs import chunked_logprob_entropy

    m = policy.model
    weight = m.shared_embedding_or_output_weight() if m.share_embeddings_and_output_weights else None
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    shard = padded_vocab_size(policy.vocab, policy.tp) // policy.tp
    group = parallel_state.get_tensor_model_parallel_group() if policy.tp > 1 else None

    padded = (tp_rank + 1) * shard > policy.vocab  # this rank holds rows added to split the vocabulary

    def logits_fn(h: Tensor) -> Tensor:
        logits, _ = m.output_layer(h[:, None], weight=weight)
        logits = logits[:, 0].float()
        if padded:  # those rows never get probability
            ids = torch.arange(tp_rank * shard, (tp_rank + 1) * shard, device=logits.device)
            logits = logits.masked_fill(ids >= policy.vocab, float("-inf"))
        return logits

    extra = None if extra_ids is None else extra_ids.to(hidden.device)
    temps = _row_temperatures(temperature, hidden.shape[0], hidden.device)
    if "lmhead" in policy.fused:  # tp=1 (build_policy): the whole vocabulary, no padding rows
        from clawr1.trainer.fused.lm_head import logprob_entropy

        head = weight if weight is not None else m.output_layer.weight
        return logprob_entropy(hidden, head, targets.to(hidden.device), 1.0 / temps, extra)
    return chunked_logprob_entropy(hidden, targets.to(hidden.device), logits_fn, tp_rank * shard, group, chunk_tokens,
                                   extra, temps, padded=padded)


def packed_logprobs(policy: Policy, packed: Packed, temperature: Temperature = 1.0, chunk_tokens: int = 1024) -> Tensor:
    return packed_logprobs_entropy(policy, packed, temperature, chunk_tokens)[0]


def response_hidden(policy: Policy, packed: Packed) -> Tensor:
    """Hidden states [R, H] at the positions that predict the response tokens."""
    hidden = hidden_states(policy, packed)
    return hidden[packed.predict_at.to(hidden.device)]


def packed_logprobs_entropy(policy: Policy, packed: Packed, temperature: Temperature = 1.0, chunk_tokens: int = 1024,
                            extra_ids: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor | None]:
    """Per response token of a packed row: log p, entropy, and log p of `extra_ids` [R, k] if given."""
    return logprobs_and_entropy(policy, response_hidden(policy, packed), packed.targets, temperature, chunk_tokens,
                                extra_ids)


def full_logits(policy: Policy, packed: Packed) -> Tensor:
    """[T, vocab] logits of a packed row, gathered over TP ranks (for tests and export checks)."""
    from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

    m = policy.model
    weight = m.shared_embedding_or_output_weight() if m.share_embeddings_and_output_weights else None
    logits, _ = m.output_layer(hidden_states(policy, packed)[:, None], weight=weight)
    if policy.tp > 1:
        logits = gather_from_tensor_model_parallel_region(logits)
    return logits[:, 0, : policy.vocab].float()
