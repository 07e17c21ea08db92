"""serve.decode_cuda_graph: the paged decode step replayed from CUDA graphs equals the step run eagerly (CUDA only;
the buckets and the config rule everywhere)."""
from __future__ import annotations

import pytest
import torch

from clawr1.config import Config
from clawr1.serving.decode_graphs import buckets_up_to
from tests.numerics import assert_close, forward_depth


def test_buckets_cover_every_batch_size_up_to_the_largest():
    assert buckets_up_to(1) == [1]
    assert buckets_up_to(32) == [1, 2, 4, 8, 16, 24, 32]
    assert buckets_up_to(100) == [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 100]


def test_cuda_graphs_need_the_paged_step_on_a_gpu():
    with pytest.raises(ValueError, match="decode_cuda_graph replays the paged decode step"):
        Config.model_validate({"serve": {"decode_cuda_graph": True, "device": "cuda"}})
    with pytest.raises(ValueError, match="decode_cuda_graph replays the paged decode step"):
        Config.model_validate({"serve": {"decode_cuda_graph": True, "decode_attention": "paged"}})
    cfg = Config.model_validate({"serve": {"decode_cuda_graph": True, "decode_attention": "paged", "device": "cuda"}})
    assert cfg.serve.decode_cuda_graph


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_graph_replays_equal_eager_paged_decode_steps(tmp_path):
    from transformers import AutoModelForCausalLM

    from clawr1.serving.model_runner import ModelRunner
    from tests.trainer.families import save_random_model

    path = save_random_model("qwen3", tmp_path / "qwen3")  # random weights: nothing to build or carry
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).cuda()
    eager = ModelRunner(model, slots=8, pool_tokens=16 * 64, decode_attention="paged")
    graphs = ModelRunner(model, slots=8, pool_tokens=16 * 64, decode_attention="paged", cuda_graph=True)
    assert sorted(graphs.graphs.graphs) == [1, 2, 4, 8]
    # 3 requests (ids below the family model's 250): replayed from the bucket of 4, one row padding
    prompts = [[5, 9, 14], list(range(3, 40)), [7] * 16]
    slots = {}
    for name, runner in (("eager", eager), ("graphs", graphs)):
        slots[name] = [runner.cache.take(len(p) + 30) for p in prompts]
        for p, s in zip(prompts, slots[name]):
            runner.prefill(torch.tensor(p, device="cuda"), s)
    generator = torch.Generator().manual_seed(0)
    for step in range(25):
        feed = torch.randint(0, model.config.vocab_size, (len(prompts),), generator=generator).cuda()
        want, got = eager.decode(feed, slots["eager"]), graphs.decode(feed, slots["graphs"])
        assert_close(got, want, torch.float32, forward_depth(path), what=f"decode step {step}")
    assert torch.equal(graphs.cache.lengths[torch.tensor(slots["graphs"])].cpu(),
                       eager.cache.lengths[torch.tensor(slots["eager"])].cpu())
