import json
from collections import Counter

import pytest

from clawr1.tinymodel.chatml import render_text
from envs.toolcall.learnable import (SYSTEM_PROMPT, TOOLS, UNITS, call_tool, grade, right_call, solved_conversation,
                                     split_tasks, warmstart_conversations)

SPLIT = split_tasks(seed=0)


def test_splits_are_disjoint_seeded_and_cover_both_kinds():
    train_q, held_q = {t.question for t in SPLIT.train}, {t.question for t in SPLIT.heldout}
    assert not train_q & held_q and not {t.id for t in SPLIT.train} & {t.id for t in SPLIT.heldout}
    assert (len(SPLIT.train), len(SPLIT.heldout)) == (5901, 654)
    assert Counter(t.kind for t in SPLIT.heldout) == {"calc": 621, "unit": 33}
    assert split_tasks(seed=0) == SPLIT
    assert {t.id for t in split_tasks(seed=1).heldout} != {t.id for t in SPLIT.heldout}
    # a question and its mirror (3 plus 4 / 4 plus 3) never straddle the split
    held = {tuple(t.arguments["expression"].split()) for t in SPLIT.heldout if t.kind == "calc"}
    assert all((b, op, a) in held for a, op, b in held if op != "-")
    assert {t.kind for t in split_tasks(kinds=("unit",)).train} == {"unit"}
    with pytest.raises(ValueError, match="kinds"):
        split_tasks(kinds=("poetry",))


def test_every_task_is_answered_by_its_call():
    for t in SPLIT.train + SPLIT.heldout:
        r = call_tool(t.tool, json.dumps(t.arguments))
        assert (r.ok, r.content) == (True, str(t.answer)), t.id
        assert right_call(t, t.tool, t.arguments) and right_call(t, t.tool, json.dumps(t.arguments))
        assert t.answer > 0 and len(t.question) <= 40


def test_examples():
    tasks = {t.id: t for t in SPLIT.train + SPLIT.heldout}
    t = tasks["calc-multiply-17-4"]
    assert (t.question, t.tool, t.arguments, t.answer) == (
        "What is 17 times 4?", "calculator", {"expression": "17 * 4"}, 68)
    t = tasks["unit-h-min-3"]
    assert (t.question, t.arguments, t.answer) == ("How many min are in 3 h?", {"expression": "3 * 60"}, 180)
    assert tasks["calc-subtract-20-7"].answer == 13 and "calc-subtract-7-20" not in tasks
    assert t.messages() == [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": t.question}]


def test_grader_wants_the_result_as_a_whole_number():
    t = next(t for t in SPLIT.heldout if t.answer >= 10)
    n = t.answer
    assert grade(t, f"The answer is {n}.") and grade(t, str(n)) and grade(t, f"It is {n:,}!")
    for wrong in ["", "The answer is unknown.", f"The answer is {n + 1}.", f"{n}0", f"1{n}", f"{n}.5", f"-{n}x"]:
        assert not grade(t, wrong), wrong
    assert not right_call(t, t.tool, {"expression": f"{t.answer} + 1"})
    assert right_call(t, t.tool, {"expression": f"{t.answer} * 1"})  # any expression worth the answer
    assert not right_call(t, "other", t.arguments) and not right_call(t, t.tool, "{broken")


def test_tool_errors_are_structured():
    cases = [("calculator", '{"expression": "3 / 4"}', "cannot evaluate '3 / 4'"),
             ("calculator", {"expression": "__import__('os')"}, "cannot evaluate"),
             ("calculator", {}, "missing required argument 'expression'"),
             ("calculator", {"expression": "1 + 2", "c": 3}, "unexpected argument 'c'"),
             ("calculator", {"expression": 12}, "'expression' must be of type string"),
             ("calculator", "{oops", "not valid JSON"),
             ("search", {}, "unknown tool 'search'")]
    for name, args, expected in cases:
        r = call_tool(name, args)
        assert (r.ok, json.loads(r.content)["error"]) == (False, r.error) and expected in r.error
    assert len(UNITS) == 11 and all(f > 1 for f in UNITS.values())


def test_warmstart_conversations_are_well_formed_and_train_only():
    convs = warmstart_conversations(300, seed=3)
    assert len(convs) == 300 and warmstart_conversations(300, seed=3) == convs
    assert warmstart_conversations(50, seed=4) != convs[:50]
    train = {t.question: t for t in SPLIT.train}
    held = {t.question for t in SPLIT.heldout}
    for messages, tools in convs:
        assert tools == TOOLS
        assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant"]
        q = messages[1]["content"]
        assert q in train and q not in held
        task, call = train[q], messages[2]["tool_calls"][0]
        assert call["type"] == "function" and call["function"]["name"] == task.tool
        assert json.loads(call["function"]["arguments"]) == task.arguments
        assert messages[3] == {"role": "tool", "tool_call_id": call["id"],
                               "content": json.dumps({"ok": True, "output": str(task.answer)})}  # as the agent loop sends it
        assert messages[4]["content"] == f"The answer is {task.answer}." and grade(task, messages[4]["content"])
    assert {m[0][2]["tool_calls"][0]["function"]["name"] for m in convs} == {"calculator"}
    assert call_tool("calculator", {"expression": "9 - 4"}).content == "5"


def test_conversation_renders_in_the_models_tool_format():
    t = next(t for t in SPLIT.train if t.kind == "calc")
    text = render_text(solved_conversation(t), TOOLS)
    call = f'{{"name": "calculator", "arguments": {{"expression": "{t.arguments["expression"]}"}}}}'
    assert f"<tool_call>\n{call}\n</tool_call>" in text
    assert f'<tool_response>\n{{"ok": true, "output": "{t.answer}"}}\n</tool_response>' in text
    assert len(text) < 1200  # short: the whole episode fits the tiny model comfortably
