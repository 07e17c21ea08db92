"""Sampling a whole decode batch at once (clawr1/serving/sampling.py): the counter-based random numbers against a
plain-integer reference, their spread, the batched filters against the same filters applied row by row, and the
embedded engine sampling with either serve.sampler."""
from __future__ import annotations

import math
import threading

import pytest
import torch

from clawr1.serving.sampling import counter_uniform, filtered_probs, inverse_cdf, mix32

M = 0xFFFFFFFF


def mix32_reference(x: int) -> int:
    x ^= x >> 16
    x = (x * 0x7FEB352D) & M
    x ^= x >> 15
    x = (x * 0x846CA68B) & M
    return x ^ (x >> 16)


def uniform_reference(seed: int, counter: int) -> float:
    seed, counter = seed & (2**64 - 1), counter & (2**64 - 1)  # two's complement, as int64 >> and & see them
    h = mix32_reference(((seed >> 32) + 0x9E3779B9) & M)
    h = mix32_reference(h ^ (seed & M))
    h = mix32_reference(h ^ (counter >> 32) ^ 0x85EBCA6B)
    h = mix32_reference(h ^ (counter & M))
    return (h >> 8) / 2**24


EDGES = [0, 1, 2**16 - 1, 2**16, 2**31 - 1, 2**31, 2**32 - 1]


def test_the_hash_is_exact_in_int64_for_every_32_bit_value():
    xs = EDGES + torch.randint(0, 2**32, (2000,), generator=torch.Generator().manual_seed(0)).tolist()
    assert mix32(torch.tensor(xs, dtype=torch.int64)).tolist() == [mix32_reference(x) for x in xs]


def test_each_uniform_is_the_plain_integer_reference_for_any_seed_and_counter():
    seeds = [0, 1, -1, 7, 2**31, 2**32, -(2**63), 2**63 - 1, 123456789012345]
    counters = [0, 1, 5, 2**32 + 3, 2**40]
    pairs = [(s, c) for s in seeds for c in counters]
    got = counter_uniform(torch.tensor([s for s, _ in pairs]), torch.tensor([c for _, c in pairs]))
    assert got.dtype == torch.float32
    assert got.tolist() == [uniform_reference(s, c) for s, c in pairs]


def test_a_rows_number_depends_only_on_its_own_seed_and_counter():
    seeds, counters = torch.arange(100, 164), torch.arange(64) * 3
    together = counter_uniform(seeds, counters)
    alone = torch.cat([counter_uniform(seeds[i:i + 1], counters[i:i + 1]) for i in range(64)])
    reordered = counter_uniform(seeds.flip(0), counters.flip(0)).flip(0)
    assert torch.equal(together, alone) and torch.equal(together, reordered)


def test_the_numbers_are_spread_evenly_and_neighbours_do_not_follow_each_other():
    """256 seeds x 256 tokens: the Kolmogorov-Smirnov distance to the uniform law within its 0.1% critical value
    (1.95 / sqrt(n)), and the correlation of a token's number with the next one's, and with the next seed's, within
    4 / sqrt(n) (both fixed numbers: the inputs are fixed, so this passes or fails the same everywhere)."""
    seeds, counters = torch.meshgrid(torch.arange(256), torch.arange(256), indexing="ij")
    u = counter_uniform(seeds.reshape(-1), counters.reshape(-1)).double()
    n = u.numel()
    ordered = u.sort().values
    cdf = torch.arange(1, n + 1, dtype=torch.float64) / n
    ks = torch.maximum(cdf - ordered, ordered - (cdf - 1 / n)).max().item()
    assert ks < 1.95 / math.sqrt(n), f"KS distance {ks:.4g}"
    grid = u.reshape(256, 256)
    for a, b, what in ((grid[:, :-1], grid[:, 1:], "next token"), (grid[:-1], grid[1:], "next seed")):
        r = torch.corrcoef(torch.stack([a.reshape(-1), b.reshape(-1)]))[0, 1].item()
        assert abs(r) < 4 / math.sqrt(a.numel()), f"correlation with the {what}: {r:.4g}"


def filtered_reference(logp: torch.Tensor, top_k: int, top_p: float, min_p: float) -> torch.Tensor:
    """One row, the filters one after another as SGLang applies them (top-k, top-p, min-p), not renormalised."""
    probs = logp.exp()
    if 0 < top_k < probs.numel():
        kth = probs.topk(top_k).values[-1]
        probs = torch.where(probs >= kth, probs, torch.zeros_like(probs))
    if top_p < 1.0:
        ordered, order = probs.sort(descending=True)
        keep = ordered.cumsum(0) - ordered < top_p
        probs = torch.zeros_like(probs).scatter(0, order, ordered * keep)
    if min_p > 0:
        probs = torch.where(probs >= min_p * probs.max(), probs, torch.zeros_like(probs))
    return probs


ROWS = [(-1, 1.0, 0.0), (1, 1.0, 0.0), (5, 1.0, 0.0), (50, 1.0, 0.0), (1 << 30, 1.0, 0.0), (-1, 0.5, 0.0),
        (-1, 0.9, 0.0), (-1, 1e-6, 0.0), (-1, 1.0, 0.05), (-1, 1.0, 1.0), (10, 0.6, 0.0), (10, 0.6, 0.2),
        (3, 0.99, 0.5), (0, 0.3, 0.1)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_batched_filters_are_each_rows_filters_applied_one_by_one(dtype):
    logits = torch.randn(len(ROWS), 50, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * 3
    logp = torch.log_softmax(logits.to(dtype), dim=-1)
    top_k, top_p, min_p = (torch.tensor(col, dtype=t) for col, t in zip(zip(*ROWS), (torch.int64, dtype, dtype)))
    got = filtered_probs(logp, top_k, top_p, min_p)
    want = torch.stack([filtered_reference(logp[i], *ROWS[i]) for i in range(len(ROWS))])
    assert torch.equal(got, want)
    assert torch.equal(got[0], logp[0].exp())  # no filter: every token kept, the tail's tiny ones included
    assert (got[[1, 7, 9]] > 0).sum(dim=-1).tolist() == [1, 1, 1]  # top-k 1, a tiny top-p, min-p 1: the top alone


def test_draws_through_the_cumulative_sum_follow_the_filtered_probabilities():
    """20,000 draws from 4 tokens with the counter's numbers: each frequency within 5 standard errors of its
    probability (the numbers are fixed, so this is a fixed check of the inverse-CDF and the numbers together)."""
    p = torch.tensor([0.5, 0.3, 0.0, 0.2], dtype=torch.float64)
    n = 20_000
    probs = (p * 3).expand(n, 4)  # unnormalised, as the filters leave them
    tokens = inverse_cdf(probs, counter_uniform(torch.full((n,), 42), torch.arange(n)).double())
    freq = torch.bincount(tokens, minlength=4).double() / n
    assert freq[2] == 0
    assert ((freq - p).abs() <= 5 * (p * (1 - p) / n).sqrt()).all(), freq.tolist()


# ---------------------------------------------------------------- the engine


def generate(engine, requests) -> list[list[int]]:
    """Submit every (input_ids, SamplingParams) at once; their output ids once all are done."""
    from clawr1.serving.engine import GenerateRequest

    results, done, lock = {}, threading.Event(), threading.Lock()

    def record(i: int):
        def on_event(event: dict) -> None:
            if event["type"] == "done":
                with lock:
                    results[i] = event["output_ids"]
                    if len(results) == len(requests):
                        done.set()
        return on_event

    for i, (ids, params) in enumerate(requests):
        engine.submit(GenerateRequest(list(ids), params), record(i))
    assert done.wait(300), "requests did not finish"
    return [results[i] for i in range(len(requests))]


@pytest.fixture(scope="module", params=["generator", "counter"])
def sampler_engine(request, tiny_model):
    from transformers import AutoTokenizer

    from clawr1.serving.engine import Engine

    engine = Engine(tiny_model, max_running=8, max_context=128, sampler=request.param)
    try:
        yield engine, AutoTokenizer.from_pretrained(tiny_model)("three plus four is")["input_ids"]
    finally:
        engine.stop()


def test_filters_that_keep_only_the_top_token_give_the_greedy_reply_in_a_mixed_batch(sampler_engine):
    from clawr1.serving.engine import SamplingParams

    engine, ids = sampler_engine
    kw = dict(max_new_tokens=12, ignore_eos=True)
    params = [SamplingParams(temperature=0, **kw), SamplingParams(top_k=1, sampling_seed=1, **kw),
              SamplingParams(top_p=1e-6, sampling_seed=2, **kw), SamplingParams(min_p=1.0, sampling_seed=3, **kw),
              SamplingParams(temperature=1.5, sampling_seed=4, **kw)]  # a row without filters beside them
    out = generate(engine, [(ids, p) for p in params])
    assert out[1] == out[2] == out[3] == out[0] and len(out[0]) == 12


def test_a_seeded_request_repeats_itself_and_other_seeds_differ(sampler_engine):
    from clawr1.serving.engine import SamplingParams

    engine, ids = sampler_engine
    params = lambda seed: SamplingParams(max_new_tokens=16, temperature=1.0, ignore_eos=True,  # noqa: E731
                                         sampling_seed=seed)
    first, again = generate(engine, [(ids, params(7))]), generate(engine, [(ids, params(7))])
    assert first == again
    others = generate(engine, [(ids, params(s)) for s in range(8, 14)])
    assert len({tuple(o) for o in others}) > 1
