"""Samples that begin with the same tokens, computed once: a micro-batch packed as a prefix tree
(trainer.share_prefixes).

A group's answers share their prompt, and a conversation's later turns begin with its earlier ones: the personal
environment's batches hold about twice the tokens of their prefix tree. Each distinct prefix among a micro-batch's
samples (per LoRA slot, whose adapter changes the hidden states) becomes one packed token. A token attends to its
ancestors only, at the position its depth gives, so every sample sees exactly the context it would see alone, and a
shared token's gradient is the sum over the samples that pass through it, as the copies' gradients would be.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch


@dataclass
class PrefixTree:
    tokens: list[int] = field(default_factory=list)  # one per node; a parent comes before its children
    depth: list[int] = field(default_factory=list)  # the node's position in every sample that passes through it
    parent: list[int] = field(default_factory=list)  # -1 at a root
    slot: list[int] = field(default_factory=list)  # the LoRA slot of the samples through it
    paths: list[list[int]] = field(default_factory=list)  # per sample, in the order given: its node at each position
    spans: list[tuple[int, int]] = field(default_factory=list)  # [start, end) nodes of each tree: a root and its descendants

    def masks(self) -> list[Optional[torch.Tensor]]:
        """Per tree: [n, n] bool, True where node i may attend to node j (j is i or an ancestor of i); None where
        the tree is one unbranched sequence (plain causal attention)."""
        return [ancestor_mask(self.parent[a:b], a) for a, b in self.spans]


def build_prefix_tree(token_lists: list[list[int]], slots: list[int]) -> PrefixTree:
    """The prefix tree of the samples: one node per distinct (slot, prefix). Samples are placed tree by tree (a tree
    per slot and first token, in order of first appearance) so each tree's nodes are contiguous."""
    tree = PrefixTree(paths=[[] for _ in token_lists])
    by_root: dict[tuple[int, int], list[int]] = {}
    for i, toks in enumerate(token_lists):
        if not toks:
            raise ValueError(f"sample {i} has no tokens")
        by_root.setdefault((slots[i], toks[0]), []).append(i)
    for (slot, _), members in by_root.items():
        start = len(tree.tokens)
        children: dict[tuple[int, int], int] = {}  # (parent node, token) -> node
        for i in members:
            node = -1
            for depth, token in enumerate(token_lists[i]):
                child = children.get((node, token))
                if child is None:
                    child = children[(node, token)] = len(tree.tokens)
                    tree.tokens.append(token)
                    tree.depth.append(depth)
                    tree.parent.append(node)
                    tree.slot.append(slot)
                tree.paths[i].append(child)
                node = child
        tree.spans.append((start, len(tree.tokens)))
    return tree


def ancestor_mask(parents: list[int], start: int) -> Optional[torch.Tensor]:
    """The attention mask of one tree whose nodes are numbered from `start`; None for an unbranched sequence."""
    n = len(parents)
    if all(p == start + i - 1 for i, p in enumerate(parents[1:], 1)):
        return None
    mask = np.zeros((n, n), dtype=bool)
    for i, p in enumerate(parents):
        if p >= 0:
            mask[i] = mask[p - start]
        mask[i, i] = True
    return torch.from_numpy(mask)


def shared_order(token_lists: list[list[int]], slots: list[int]) -> tuple[list[int], list[int]]:
    """Sample indices in an order that puts shared prefixes side by side (by slot, then tokens, lexicographically),
    and each sample's new tokens in that order: its length less its common prefix with the one before (same slot).
    Summed over a run of consecutive samples, the new tokens are that run's prefix-tree size."""
    order = sorted(range(len(token_lists)), key=lambda i: (slots[i], token_lists[i]))
    new, previous = [], None
    for i in order:
        toks = token_lists[i]
        common = 0
        if previous is not None and slots[previous] == slots[i]:
            before = token_lists[previous]
            limit = min(len(before), len(toks))
            while common < limit and before[common] == toks[common]:
                common += 1
        new.append(len(toks) - common)
        previous = i
    return order, new
