"""The embedded engine's decode step replayed from CUDA graphs, one per batch-size bucket
(`serve.decode_cuda_graph`, with `serve.decode_attention: paged` on CUDA).

A decode step of a small model on a GPU is bound by launching its few hundred kernels, not by running them. The
paged step (`ModelRunner._decode_paged`) has no host work and shapes fixed by the batch size, so it is captured
once per bucket and replayed: the batch is padded up to the next bucket with rows that read and write only a
scratch slot of one page, whose length is set back to 0 before every replay. Weight updates copy into the same
tensors (`Engine._load_state`), so the graphs stay valid across them.
"""
from __future__ import annotations

import torch

BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256)


def buckets_up_to(max_batch: int) -> list[int]:
    """The captured batch sizes: every bucket below `max_batch`, and `max_batch` itself."""
    return [b for b in BUCKETS if b < max_batch] + [max_batch]


class DecodeGraphs:
    """Captured paged decode steps of one runner, by batch size."""

    def __init__(self, runner, max_batch: int):
        if runner.device.type != "cuda" or not runner.paged:
            raise ValueError("serve.decode_cuda_graph needs serve.device=cuda and serve.decode_attention=paged")
        self.runner = runner
        self.scratch = runner.cache.take(1)  # the padding rows' slot (the pool was made one slot larger for it)
        self.buckets = buckets_up_to(max_batch)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.tokens: dict[int, torch.Tensor] = {}
        self.slots: dict[int, torch.Tensor] = {}
        self.hidden: dict[int, torch.Tensor] = {}
        self.capture()

    def _reset_scratch(self) -> None:
        self.runner.cache.lengths[self.scratch] = 0

    @torch.inference_mode()
    def capture(self) -> None:
        pool = None
        device = self.runner.device
        for size in sorted(self.buckets, reverse=True):  # the largest first: the smaller ones reuse its memory
            tokens = torch.zeros(size, dtype=torch.long, device=device)
            slots = torch.full((size,), self.scratch, dtype=torch.long, device=device)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # warm up (Triton compiles, allocators settle) off the capture
                for _ in range(2):
                    self._reset_scratch()
                    self.runner._decode_paged(tokens, slots)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            self._reset_scratch()
            with torch.cuda.graph(graph, pool=pool):
                hidden = self.runner._decode_paged(tokens, slots)
            pool = graph.pool()
            self.graphs[size], self.tokens[size], self.slots[size], self.hidden[size] = graph, tokens, slots, hidden
        self._reset_scratch()

    @torch.inference_mode()
    def decode(self, tokens: torch.Tensor, slots: list[int]) -> torch.Tensor:
        """What `ModelRunner.decode` returns, [len(slots), hidden], from the smallest bucket that holds the batch."""
        n = len(slots)
        size = next(b for b in self.buckets if b >= n)
        self.tokens[size][:n].copy_(tokens)
        self.tokens[size][n:] = 0
        self.slots[size][:n].copy_(torch.tensor(slots), non_blocking=True)
        self.slots[size][n:] = self.scratch
        self._reset_scratch()
        self.graphs[size].replay()
        return self.hidden[size][:n].clone()
