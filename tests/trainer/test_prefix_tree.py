"""trainer.share_prefixes: micro-batches packed as prefix trees hold each shared prefix once, and train exactly as
the flat packs do (the same loss and gradients up to rounding), LoRA slots never sharing."""
from __future__ import annotations

import copy
import random

import pytest
import torch

from clawr1.config import AlgoConfig
from clawr1.protocol import Sample
from clawr1.trainer.prefix_tree import build_prefix_tree, shared_order
from clawr1.trainer.step import micro_batches
from tests.numerics import assert_all_close, assert_close, forward_depth, grad_depth
from tests.trainer.test_step import RecordingOptimizer

TOKENS = [[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 6], [7, 8], [1, 2, 3, 4], [1, 2, 3, 4, 9, 9], [1, 2, 3]]
SLOTS = [0, 0, 0, 0, 1, 0, 0]


def distinct_prefixes(token_lists, slots) -> set:
    return {(slot, tuple(t[:n])) for t, slot in zip(token_lists, slots) for n in range(1, len(t) + 1)}


def test_each_distinct_prefix_is_one_node_and_each_sample_reads_its_tokens_along_its_path():
    tree = build_prefix_tree(TOKENS, SLOTS)
    assert len(tree.tokens) == len(distinct_prefixes(TOKENS, SLOTS)) == 14
    for toks, slot, path in zip(TOKENS, SLOTS, tree.paths):
        assert [tree.tokens[n] for n in path] == toks and {tree.slot[n] for n in path} == {slot}
        assert [tree.depth[n] for n in path] == list(range(len(toks)))
        assert [tree.parent[n] for n in path] == [-1] + path[:-1]
    assert tree.paths[4][0] != tree.paths[0][0]  # the same tokens under another LoRA slot share nothing
    assert tree.paths[6] == tree.paths[0][:3]  # a sample that is another's prefix ends inside its path
    # trees: (slot 0, token 1), (slot 0, token 7), (slot 1, token 1), each a contiguous run of nodes
    assert tree.spans == [(0, 8), (8, 10), (10, 14)]
    assert all(a <= n < b for a, b in tree.spans for n in range(a, b) if tree.parent[n] == -1 or a <= tree.parent[n] < b)


def test_a_tokens_mask_row_is_its_path_and_an_unbranched_tree_is_plain_causal():
    tree = build_prefix_tree(TOKENS, SLOTS)
    masks = tree.masks()
    assert masks[1] is None and masks[2] is None  # [7, 8] and slot 1's [1, 2, 3, 4]: one sequence each
    start, end = tree.spans[0]
    for n in range(start, end):
        ancestors, node = set(), n
        while node != -1:
            ancestors.add(node - start)
            node = tree.parent[node]
        assert set(masks[0][n - start].nonzero()[:, 0].tolist()) == ancestors


def samples_with_shared_prefixes(vocab: int, seed: int = 0) -> list[Sample]:
    """A group of three answers to one prompt (two of them the same), a second turn that begins with the first
    turn's prompt and answer, a one-token answer, and unrelated samples: every kind of sharing a batch has."""
    rng = random.Random(seed)

    def sample(i: int, tokens: list[int], prompt_len: int, group: str, reward: float) -> Sample:
        r = len(tokens) - prompt_len
        return Sample(sample_id=f"s{i}", group_id=group, tokens=tokens, prompt_len=prompt_len, loss_mask=[1] * r,
                      rollout_logprobs=[-rng.random() * 3 for _ in range(r)], versions=[0] * r, reward=reward,
                      teacher_logprobs=[-rng.random() * 3 for _ in range(r)] if i % 2 else None)

    words = lambda n: [rng.randrange(vocab) for _ in range(n)]  # noqa: E731
    prompt, answer = words(23), words(9)
    out = [sample(0, prompt + answer, 23, "g0", 1.0), sample(1, prompt + answer, 23, "g0", -1.0),
           sample(2, prompt + words(14), 23, "g0", -1.0)]
    out.append(sample(3, prompt + answer + words(11) + words(7), 23 + 9 + 11, "g1", 1.0))  # the next turn
    out.append(sample(4, prompt[:10] + words(1), 10, "g2", 1.0))  # shares part of the prompt, one answer token
    out += [sample(5 + i, words(15) + words(8), 15, f"g{3 + i}", rng.choice([1.0, -1.0])) for i in range(3)]
    rng.shuffle(out)
    return out


def test_the_order_puts_shared_prefixes_together_and_counts_each_run_as_its_tree():
    samples = samples_with_shared_prefixes(vocab=50, seed=1)
    tokens, slots = [s.tokens for s in samples], [0, 0, 1, 0, 0, 0, 0, 0]
    order, new = shared_order(tokens, slots)
    assert sorted(order) == list(range(len(samples)))
    for a in range(len(order)):
        for b in range(a + 1, len(order) + 1):
            run = order[a:b]
            first = len(tokens[run[0]]) + sum(new[a + 1:b])
            assert first == len(distinct_prefixes([tokens[i] for i in run], [slots[i] for i in run]))
    for budget in (30, 60, 100_000):
        mbs = micro_batches(samples, budget, share_prefixes=True)
        assert sorted(s.sample_id for mb in mbs for s in mb) == sorted(s.sample_id for s in samples)
        assert all(len(mb) == 1 or len(distinct_prefixes([s.tokens for s in mb], [0] * len(mb))) <= budget
                   for mb in mbs)


@pytest.fixture(scope="module")
def policy(tiny_model, megatron_tp1):
    from clawr1.trainer.model import build_policy

    return build_policy(tiny_model)


def test_a_tree_pack_gives_every_response_tokens_log_prob_of_the_flat_pack(policy, tiny_model):
    from clawr1.trainer.model import pack, packed_logprobs_entropy

    samples = samples_with_shared_prefixes(policy.vocab)
    args = [s.tokens for s in samples], [s.prompt_len for s in samples]
    flat, tree = pack(*args), pack(*args, share_prefixes=True)
    assert tree.input_ids.shape[1] == len(distinct_prefixes(args[0], [0] * len(samples))) < flat.input_ids.shape[1]
    assert torch.equal(tree.targets, flat.targets) and torch.equal(tree.sample_index, flat.sample_index)
    with torch.no_grad():
        (lp0, ent0, _), (lp1, ent1, _) = (packed_logprobs_entropy(policy, p) for p in (flat, tree))
    magnitude = max(1.0, float(lp0.abs().max()))
    assert_close(lp1, lp0, torch.float32, forward_depth(tiny_model), magnitude, "log-probs")
    assert_close(ent1, ent0, torch.float32, forward_depth(tiny_model), magnitude, "entropy")


@pytest.mark.parametrize("budget", [60, 100_000])
def test_a_step_on_prefix_trees_has_the_loss_and_gradients_of_the_flat_step(policy, tiny_model, budget):
    from clawr1.trainer.step import train_step

    samples = samples_with_shared_prefixes(policy.vocab, seed=2)
    results = []
    for share in (False, True):
        policy.share_prefixes = share
        opt = RecordingOptimizer(policy.model)
        try:
            stats = train_step(policy, opt, copy.deepcopy(samples), AlgoConfig(w_rl=1.0, w_opd=0.7), budget)
        finally:
            policy.share_prefixes = False
        results.append((stats["pg_loss"], opt.grads))
    (loss0, g0), (loss1, g1) = results
    assert_close(loss1, loss0, torch.float32, forward_depth(tiny_model) + 2, max(1.0, abs(loss0)), "loss")
    assert_all_close(g1, g0, torch.float32, grad_depth(tiny_model), what="grads")


def test_users_adapters_see_only_their_own_samples_through_a_shared_prompt(tiny_model, megatron_tp1):
    """Two users send the same prompt and answer: their tokens are packed twice (one tree per slot), and each
    slot's gradient is the one its own samples give in a flat pack."""
    from clawr1.trainer.model import build_policy
    from clawr1.trainer.step import train_step
    from tests.trainer.test_lora import GradRecorder, attach

    policy = build_policy(tiny_model)
    adapters = attach(policy, slots=2, seed=9)
    samples = samples_with_shared_prefixes(policy.vocab, seed=3)[:4]
    twin = [copy.deepcopy(s) for s in samples]
    for s in twin:
        s.sample_id, s.adapter_slot = s.sample_id + "-b", 1
    grads = []
    for share in (False, True):
        policy.share_prefixes = share
        recorder = GradRecorder(adapters)
        train_step(policy, recorder, copy.deepcopy(samples + twin), AlgoConfig(w_rl=1.0, w_opd=0.5), 100_000)
        grads.append(recorder.grads)
    assert_all_close(grads[1], grads[0], torch.float32, grad_depth(tiny_model), what="per-slot grads")
    for suffix in ("_0", "_1"):
        assert max(float(g.abs().max()) for n, g in grads[1].items() if n.endswith(suffix)) > 0.0


def test_prefix_trees_and_transformer_engine_are_refused_together():
    from clawr1.config import Config

    with pytest.raises(ValueError, match="share_prefixes packs prefix trees"):
        Config.model_validate({"trainer": {"share_prefixes": True, "transformer_engine": "on"}})
    assert Config.model_validate({"trainer": {"share_prefixes": True}}).trainer.share_prefixes
