"""Reasoning and tool calls read out of model text, in each family's format, finished or streamed."""
from __future__ import annotations

import random

import pytest

from clawr1.gateway.parsers import StreamSplitter, default_tool_call_format, parse_output

QWEN_TURN = ('<think>\nThe user wants a sum.\n</think>\n\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}'
             '\n</tool_call>')
TEXTS = [
    QWEN_TURN,
    '<think>\nA  b\n\n c\n</think>\n\nHello there <tool_call>\n{"name": "x", "arguments": {}}\n</tool_call>',
    'Hi <tool_call>\n{"name": "x", "arguments": {}}\n</tool_call>\n<tool_call>\n{"name": "y", "arguments": '
    '{"k": [1]}}\n</tool_call>\nDone.',
    "Plain text  with  spaces \n", "a <tool_call>{bad}</tool_call> b", '<tool_call>\n{"name": "x"',
    '{"name": "add", "parameters": {"a": 1, "b": 2}}; {"name": "add", "parameters": {"a": 3, "b": 4}}',
    '<|python_tag|>{"name": "add", "parameters": {"a": 1}}', 'Hello {"name"', '{"name": "add", "parameters": 3}',
    "<think>cut off while thinking  ", "Ünïcödé 数学 🙂 <tool_call>\n{\"name\": \"lookup\", \"arguments\": "
    "{\"word\": \"東京\"}}\n</tool_call>",
]


def calls(parsed) -> list[tuple[str, dict]]:
    return [(c.name, c.arguments) for c in parsed.tool_calls]


def test_hermes_calls_single_parallel_and_with_reasoning():
    one = parse_output(QWEN_TURN, fmt="hermes")
    assert (one.reasoning, one.content, calls(one), one.malformed) == (
        "The user wants a sum.", "", [("add", {"a": 1, "b": 2})], 0)
    two = parse_output(TEXTS[2], fmt="hermes")
    assert calls(two) == [("x", {}), ("y", {"k": [1]})] and two.content == "Hi \n\nDone."


def test_llama3_json_calls_plain_tagged_and_parallel():
    parallel = parse_output(TEXTS[6], fmt="llama3_json")
    assert calls(parallel) == [("add", {"a": 1, "b": 2}), ("add", {"a": 3, "b": 4})] and parallel.content == ""
    tagged = parse_output(TEXTS[7], fmt="llama3_json")
    assert calls(tagged) == [("add", {"a": 1})] and tagged.malformed == 0
    text = parse_output("The answer is 3.", fmt="llama3_json")
    assert (text.content, calls(text), text.malformed) == ("The answer is 3.", [], 0)


@pytest.mark.parametrize("fmt,text", [("hermes", TEXTS[4]), ("hermes", TEXTS[5]), ("llama3_json", TEXTS[9]),
                                      ("llama3_json", '{"name": "add", "parameters": {"a": 1}')])
def test_a_malformed_call_is_content_and_counted(fmt, text):
    parsed = parse_output(text, fmt=fmt)
    assert parsed.tool_calls == [] and parsed.content == text and parsed.malformed == 1


def test_default_format_follows_the_template_then_the_family(family_tokenizer):
    qwen3, llama = family_tokenizer("qwen3").chat_template, family_tokenizer("llama3_1").chat_template
    assert default_tool_call_format("qwen3", qwen3) == "hermes"
    assert default_tool_call_format("llama", llama) == "llama3_json"
    chatml_on_llama = "{% for m in messages %}{{ m.role + m.content }}{% endfor %}"  # as SmolLM2's: no tool section
    assert default_tool_call_format("llama", chatml_on_llama) == "hermes"
    assert [default_tool_call_format(t) for t in ("llama", "qwen3", "qwen2")] == ["llama3_json", "hermes", "hermes"]


@pytest.mark.parametrize("fmt", ("hermes", "llama3_json"))
@pytest.mark.parametrize("text", TEXTS)
def test_streaming_in_any_pieces_gives_what_the_finished_text_parses_to(text, fmt):
    want = parse_output(text, fmt=fmt)
    for seed in range(25):
        rng, splitter = random.Random(seed), StreamSplitter(True, fmt)
        reasoning = content = ""
        at, calls_seen_early = 0, 0
        while at < len(text):
            step = rng.randint(1, 5)
            r, c = splitter.feed(text[at:at + step])
            reasoning, content, at = reasoning + r, content + c, at + step
            calls_seen_early = max(calls_seen_early, len(splitter.calls))
        r, c = splitter.finish()
        got = (reasoning + r, content + c, [(x.name, x.arguments) for x in splitter.calls])
        assert got == (want.reasoning, want.content, calls(want)), (seed, text)
        if fmt == "hermes" and want.tool_calls:  # each block's call is out before the reply ends
            assert calls_seen_early == len(want.tool_calls)


def test_without_reasoning_parsing_think_tags_stay_content():
    parsed = parse_output(QWEN_TURN, fmt="hermes", reasoning=False)
    assert parsed.reasoning == "" and parsed.content.startswith("<think>") and len(parsed.tool_calls) == 1
