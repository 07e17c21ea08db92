"""Run under Triton's CPU interpreter (tests/trainer/test_fused.py starts it with TRITON_INTERPRET=1 and triton on
the path): each fused kernel against the plain op, then the trainer's model with every kernel against the plain
model. Exits 0 when every comparison holds; an assertion's message says which failed.

Usage: python -m tests.trainer.fused_worker MODEL_DIR
"""
from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

from tests.numerics import assert_all_close, assert_as_exact_as, assert_close, grad_depth

torch.manual_seed(0)


def plain_rms_norm(x, w, eps=1e-6):
    return F.rms_norm(x, (x.shape[-1],), w, eps)


def plain_swiglu(x):
    gate, up = torch.chunk(x, 2, dim=-1)
    return F.silu(gate) * up


def plain_rotary(t, freqs):
    """megatron-core's unfused packed rotary, as VarlenCoreAttention calls it."""
    from megatron.core.models.common.embeddings.rope_utils import _apply_rotary_pos_emb_bshd

    return _apply_rotary_pos_emb_bshd(t.unsqueeze(1), freqs).squeeze(1)


def rotary_angles(tokens: int, rot: int) -> torch.Tensor:
    half = torch.randn(tokens, 1, 1, rot // 2, dtype=torch.float64) * 3
    return torch.cat([half, half], dim=-1)  # megatron's layout: the two halves equal


def forward_backward(fn, inputs: list[torch.Tensor], dy_seed: int):
    leaves = [x.detach().clone().requires_grad_() for x in inputs]
    y = fn(*leaves)
    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(dy_seed), dtype=torch.float64).to(y.dtype)
    y.backward(dy)
    return y.detach(), [x.grad for x in leaves]


def check_op(name: str, fused, plain, inputs64: list[torch.Tensor], depth: int) -> None:
    """fp32: the fused op and the plain one are the same sums rounded differently (`depth` roundings deep).
    bf16: against fp64, the fused op errs no more than the plain one does in bf16 (it rounds once, at the end)."""
    y32, g32 = forward_backward(fused, [x.float() for x in inputs64], 1)
    p32, q32 = forward_backward(plain, [x.float() for x in inputs64], 1)
    assert_close(y32, p32, torch.float32, depth, what=f"{name} fp32 forward")
    for i, (a, b) in enumerate(zip(g32, q32)):
        assert_close(a, b, torch.float32, depth, what=f"{name} fp32 gradient {i}")
    exact, exact_g = forward_backward(plain, inputs64, 1)
    y16, g16 = forward_backward(fused, [x.bfloat16() for x in inputs64], 1)
    p16, q16 = forward_backward(plain, [x.bfloat16() for x in inputs64], 1)
    assert_as_exact_as(y16, exact, p16, torch.bfloat16, what=f"{name} bf16 forward")
    for i, (a, b, e) in enumerate(zip(g16, q16, exact_g)):
        assert_as_exact_as(a, e, b, torch.bfloat16, what=f"{name} bf16 gradient {i}")
    print(f"[fused_worker] {name}: fp32 and bf16 hold", flush=True)


def check_ops() -> None:
    from clawr1.trainer.fused.rmsnorm import rms_norm
    from clawr1.trainer.fused.rope import rotary
    from clawr1.trainer.fused.swiglu import swiglu

    x, w = torch.randn(37, 200, dtype=torch.float64), 1 + 0.3 * torch.randn(200, dtype=torch.float64)
    # a row's sum of squares, 1/sqrt, two products; backward: a row's sum and the weight's sum over 37 rows
    check_op("rmsnorm", lambda x, w: rms_norm(x, w, 1e-6), plain_rms_norm, [x, w], depth=8)
    check_op("swiglu", swiglu, plain_swiglu, [torch.randn(3, 5, 2 * 300, dtype=torch.float64)], depth=4)
    for dim, rot in ((64, 64), (64, 48)):  # every channel rotated; a partial rotary with channels passed through
        angles = rotary_angles(11, rot)
        check_op(f"rope dim {dim} rot {rot}", lambda t: rotary(t, angles.float()),
                 lambda t: plain_rotary(t, angles.to(t.dtype)), [torch.randn(11, 3, dim, dtype=torch.float64)],
                 depth=4)


def lm_head_outputs(fn, hidden, weight, dtype):
    """(log p, entropy, log p of extra ids, d hidden, d weight) of `fn` in `dtype`, under one fixed loss."""
    h, w = hidden.to(dtype).clone().requires_grad_(), weight.to(dtype).clone().requires_grad_()
    logp, entropy, extra = fn(h, w)
    g = torch.Generator().manual_seed(2)
    loss = sum((t.double() * torch.randn(t.shape, generator=g, dtype=torch.float64)).sum() for t in (logp, entropy, extra))
    loss.backward()
    return [logp.detach(), entropy.detach(), extra.detach(), h.grad, w.grad]


def check_lm_head() -> None:
    """The fused LM head against the plain chunked path (clawr1/trainer/logprobs.py) and fp64: 45 rows, a
    vocabulary of 300 and hidden 100 (neither a multiple of its tile), per-row temperatures, 3 extra ids per row."""
    from clawr1.trainer.fused.lm_head import logprob_entropy
    from clawr1.trainer.logprobs import chunked_logprob_entropy

    rows, hidden_size, vocab = 45, 100, 300
    hidden = torch.randn(rows, hidden_size, dtype=torch.float64)
    weight = torch.randn(vocab, hidden_size, dtype=torch.float64) * 0.3
    targets, extra = torch.randint(0, vocab, (rows,)), torch.randint(0, vocab, (rows, 3))
    temps = 0.5 + torch.rand(rows, dtype=torch.float64)

    def plain(h, w):
        return chunked_logprob_entropy(h, targets, lambda x: (x @ w.T).float(), 0, chunk_tokens=16, extra_ids=extra,
                                       temperatures=temps.to(h.dtype), padded=False)

    def fused(h, w):
        return logprob_entropy(h, w, targets, (1 / temps).float(), extra)

    exact = lm_head_outputs(lambda h, w: chunked_logprob_entropy(
        h, targets, lambda x: x @ w.T, 0, chunk_tokens=16, extra_ids=extra, temperatures=temps, padded=False),
        hidden, weight, torch.float64)
    names = ("log p", "entropy", "log p of extra ids", "d hidden", "d weight")
    for dtype in (torch.float32, torch.bfloat16):
        got, honest = lm_head_outputs(fused, hidden, weight, dtype), lm_head_outputs(plain, hidden, weight, dtype)
        for name, a, b, e in zip(names, got, honest, exact):
            assert_as_exact_as(a, e, b, dtype, what=f"lmhead {dtype} {name}")
    print("[fused_worker] lmhead: fp32 and bf16 as exact as the plain path", flush=True)


def check_model(model_dir: str, vocab: int, what: str) -> None:
    """One training step with all four kernels against the plain model: the same loss and gradients (the same
    sums in another order: grad_depth), and the same state-dict names."""
    from clawr1.config import AlgoConfig
    from clawr1.trainer.model import build_policy
    from clawr1.trainer.step import train_step
    from tests.trainer.test_parallel import synthetic_samples
    from tests.trainer.test_step import RecordingOptimizer

    samples = synthetic_samples(3, vocab=vocab, seed=3)  # a reward, a teacher, a top-k teacher
    results = {}
    for name, fused in (("plain", ()), ("fused", ("rmsnorm", "swiglu", "rope", "lmhead"))):
        policy = build_policy(model_dir, fused=fused)
        kinds = {type(m).__name__ for m in policy.model.modules()}
        fused_rope = any(getattr(m, "fused_rope", False) for m in policy.model.modules())
        final_norm = type(policy.model.decoder.final_layernorm).__name__
        assert ({"FusedRMSNorm", "FusedSwiGLU"} <= kinds and fused_rope and final_norm == "FusedRMSNorm") == bool(
            fused), (kinds, fused_rope, final_norm)
        opt = RecordingOptimizer(policy.model)
        stats = train_step(policy, opt, samples, AlgoConfig(w_rl=1.0, w_opd=0.7), 100_000)
        results[name] = (stats["pg_loss"], opt.grads, set(policy.model.state_dict()))
    (loss0, g0, names0), (loss1, g1, names1) = results["plain"], results["fused"]
    assert names0 == names1, sorted(names0 ^ names1)
    depth = grad_depth(model_dir)
    assert_close(loss1, loss0, torch.float32, depth, max(1.0, abs(loss0)), "loss")
    assert_all_close(g1, g0, torch.float32, depth, what="grads")
    print(f"[fused_worker] {what}: loss and every gradient hold", flush=True)


if __name__ == "__main__":
    import json
    import tempfile
    from pathlib import Path

    from clawr1.trainer.megatron_setup import init_parallel
    from tests.trainer.families import COMMON, save_random_model

    check_ops()
    check_lm_head()
    init_parallel(tp=1, seed=0)
    tiny = Path(sys.argv[1])
    check_model(str(tiny), json.loads((tiny / "config.json").read_text())["vocab_size"], "the tiny model")
    with tempfile.TemporaryDirectory() as tmp:  # Qwen3: q/k norms, head_dim 24 (a rotary half that is no power of 2)
        check_model(str(save_random_model("qwen3", Path(tmp) / "qwen3")), COMMON["vocab_size"], "a Qwen3 model")
