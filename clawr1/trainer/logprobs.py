"""Log-probs and entropy of the sampled tokens, over a vocabulary that may be split across TP ranks.

Memory stays bounded for long responses: logits are made `chunk_tokens` rows at
a time and each chunk is recomputed in the backward pass instead of being kept,
so at most one chunk of [chunk_tokens, vocab / tp] logits lives at once.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.distributed as dist
from torch import Tensor
from torch.utils.checkpoint import checkpoint


def _sum(t: Tensor, group) -> Tensor:
    """Sum over TP ranks. The backward is the identity: every TP rank computes the same loss from the
    summed value, so summing gradients too (as torch.distributed.nn.all_reduce does) would count it tp times."""
    if group is None:
        return t
    from megatron.core.tensor_parallel.mappings import reduce_from_tensor_model_parallel_region

    return reduce_from_tensor_model_parallel_region(t, group=group)


def vocab_parallel_logprob_entropy(logits: Tensor, ids: Tensor, vocab_start: int,
                                   group=None, padded: bool = True) -> tuple[Tensor, Tensor]:
    """log p of the given token ids, and the entropy, for each row.

    `logits` [n, V_shard] hold vocab ids vocab_start.. of this rank (columns that pad
    the vocabulary hold -inf); `ids` [n, m] are full-vocabulary ids (the sampled
    token, then any others such as the teacher's top k): one gather for all of
    them. Returns ([n, m], [n]). `padded=False` promises no -inf column (their masking is skipped).
    """
    row_max = logits.detach().max(dim=-1, keepdim=True).values
    if group is not None:
        dist.all_reduce(row_max, op=dist.ReduceOp.MAX, group=group)
    shifted = logits - row_max
    exp = shifted.exp()
    sum_exp = _sum(exp.sum(dim=-1), group)
    log_z = sum_exp.log()  # log of the partition function, relative to row_max
    local = ids - vocab_start
    mine = (local >= 0) & (local < logits.shape[-1])
    picked = shifted.gather(1, local.clamp(0, logits.shape[-1] - 1)) * mine
    logp = _sum(picked, group) - log_z[:, None]
    # padding columns are exp 0 and shifted -inf, and 0 * -inf is NaN: they add nothing to the entropy
    finite = torch.where(torch.isfinite(shifted), shifted, torch.zeros_like(shifted)) if padded else shifted
    expected_logit = _sum((exp * finite).sum(dim=-1), group) / sum_exp
    entropy = log_z - expected_logit
    return logp, entropy


def chunked_logprob_entropy(hidden: Tensor, targets: Tensor, logits_fn: Callable[[Tensor], Tensor],
                            vocab_start: int, group=None, chunk_tokens: int = 1024,
                            extra_ids: Optional[Tensor] = None, temperatures: Optional[Tensor] = None,
                            recompute: Optional[bool] = None,
                            padded: bool = True) -> tuple[Tensor, Tensor, Optional[Tensor]]:
    """Apply `logits_fn` ([n, H] -> [n, V_shard]) chunk by chunk, dividing each row's logits by its
    temperature (`temperatures` [T]; None: 1). `padded`: whether `logits_fn` may return -inf columns.

    Returns (log p of targets [T], entropy [T], log p of extra_ids [T, k] or None).
    """
    recompute = torch.is_grad_enabled() and hidden.requires_grad if recompute is None else recompute
    ids = targets[:, None] if extra_ids is None else torch.cat([targets[:, None], extra_ids], dim=1)
    temps = hidden.new_ones(hidden.shape[0], dtype=torch.float32) if temperatures is None else temperatures.float()

    # on CPU a pass over [n, vocab] costs more than this check; x / 1 is x exactly, so skipping it changes nothing
    unit = hidden.device.type == "cpu" and bool((temps == 1).all())

    def one(h: Tensor, i: Tensor, t: Tensor) -> tuple[Tensor, Tensor]:
        logits = logits_fn(h) if unit else logits_fn(h) / t[:, None]
        return vocab_parallel_logprob_entropy(logits, i, vocab_start, group, padded)

    logps, ents = [], []
    for start in range(0, hidden.shape[0], chunk_tokens):
        h, i, t = (x[start:start + chunk_tokens] for x in (hidden, ids, temps))
        lp, ent = checkpoint(one, h, i, t, use_reentrant=False) if recompute else one(h, i, t)
        logps.append(lp)
        ents.append(ent)
    if not logps:
        return hidden.new_zeros(0), hidden.new_zeros(0), None if extra_ids is None else hidden.new_zeros(0, ids.shape[1] - 1)
    logp, ent = torch.cat(logps), torch.cat(ents)
    return logp[:, 0], ent, (None if extra_ids is None else logp[:, 1:])
