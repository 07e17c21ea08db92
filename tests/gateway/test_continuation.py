"""A generation the engine aborts (SGLang <= 0.5.20 aborts running requests to update weights) is continued from
where it stopped: the agent gets one whole answer, and the recorded ids are exactly the sampled ones."""
from __future__ import annotations

import asyncio

from transformers import AutoTokenizer

from clawr1.engine_api.client import Generation
from clawr1.gateway.service import Gateway
from tests.conftest import make_config


def gen(ids, reason, version, start=0.0):
    return Generation(output_ids=ids, logprobs=[start - i for i in range(len(ids))], versions=[version] * len(ids),
                      text="", finish_reason=reason, prompt_logprobs=[], weight_version=version)


class ScriptedEngine:
    """Stands in for the engine client the router hands the gateway: replies from a script, records each call."""

    def __init__(self, script):
        self.script, self.calls = list(script), []

    async def generate(self, input_ids, params, **kw):
        self.calls.append((list(input_ids), params["max_new_tokens"]))
        return self.script.pop(0)

    async def generate_stream(self, input_ids, params, **kw):
        self.calls.append((list(input_ids), params["max_new_tokens"]))
        final = self.script.pop(0)
        for k in range(1, len(final.output_ids) + 1):  # cumulative partials, as SGLang streams them
            yield Generation(final.output_ids[:k], final.logprobs[:k], final.versions[:k], "",
                             final.finish_reason if k == len(final.output_ids) else "", [],
                             weight_version=final.weight_version)


class Router:
    def __init__(self, engine):
        self.engine, self.healthy = engine, [True]

    async def call(self, key, fn):
        return await fn(self.engine)

    async def stream(self, key, open_stream):
        async for partial in open_stream(self.engine):
            yield partial


def gateway(tiny_model, tmp_path, script) -> tuple[Gateway, ScriptedEngine]:
    gw = Gateway(make_config(tmp_path), AutoTokenizer.from_pretrained(tiny_model), judge_addr=None)
    engine = ScriptedEngine(script)
    gw.router = Router(engine)
    return gw, engine


def test_an_aborted_generation_is_continued_token_exact(tiny_model, tmp_path):
    gw, engine = gateway(tiny_model, tmp_path, [gen([10, 11, 12], "abort", 4), gen([13, 14], "stop", 5, start=-3.0)])
    out = asyncio.run(gw._generate("s", [1, 2], {"max_new_tokens": 8}))
    assert engine.calls == [([1, 2], 8), ([1, 2, 10, 11, 12], 5)]  # the rest, from where it stopped
    assert (out.output_ids, out.versions, out.finish_reason) == ([10, 11, 12, 13, 14], [4, 4, 4, 5, 5], "stop")
    assert out.logprobs == [0.0, -1.0, -2.0, -3.0, -4.0]
    assert gw.metrics.counters["continued_after_abort"][()] == 1


def test_a_streamed_generation_is_continued_seamlessly(tiny_model, tmp_path):
    gw, engine = gateway(tiny_model, tmp_path, [gen([10, 11], "abort", 1), gen([12], "length", 2)])

    async def collect():
        return [p async for p in gw._stream("s", [7], {"max_new_tokens": 3})]

    partials = asyncio.run(collect())
    assert [p.output_ids for p in partials] == [[10], [10, 11], [10, 11, 12]]  # never restarting from scratch
    assert partials[-1].finish_reason == "length" and engine.calls[1] == ([7, 10, 11], 1)


def test_continuation_is_bounded(tiny_model, tmp_path):
    gw, engine = gateway(tiny_model, tmp_path, [gen([i], "abort", 0) for i in range(10)])
    out = asyncio.run(gw._generate("s", [1], {"max_new_tokens": 50}))
    assert out.finish_reason == "abort" and len(engine.calls) == 4  # the first try and 3 continuations
