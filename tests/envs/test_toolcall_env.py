import asyncio
import json
import random
import re

import pytest

from clawr1.environment import AssistantTurn, Environment, TaskEnvironment
from envs.agentic.agent import ScriptedAgent, call_turn
from envs.toolcall import env as toolcall_env
from envs.toolcall import learnable, shop
from envs.toolcall.bfcl import bfcl_unavailable
from envs.toolcall.env import ToolCallEnv, oracle_script

MISSING_BFCL = bfcl_unavailable()
needs_bfcl = pytest.mark.skipif(MISSING_BFCL is not None, reason=f"{MISSING_BFCL}")

SHOP = ToolCallEnv({})
LEARN = ToolCallEnv({"tasks": "learnable"})
LEARN_TRAIN_SAMPLE = random.Random(0).sample(LEARN.tasks("learnable:train"), 300)


class Recorder(ScriptedAgent):
    """A scripted agent that keeps what it was sent, the outcomes' texts, and how many chats ran at once."""

    def __init__(self, turns_for):
        super().__init__(turns_for)
        self.sent: dict[str, list[list[dict]]] = {}
        self.feedback: dict[str, str] = {}
        self.in_flight = self.max_in_flight = 0

    async def chat(self, session_id, messages, **kw):
        self.sent.setdefault(session_id, []).append([dict(m) for m in messages])
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        await asyncio.sleep(0.001)
        self.in_flight -= 1
        return await super().chat(session_id, messages, **kw)

    async def complete(self, session_id, reward, text=""):
        self.feedback[session_id] = text
        await super().complete(session_id, reward, text)


def play(env, agent, tasks, prefix="s"):
    async def go():
        return await asyncio.gather(*(env.run_task(agent, t, f"{prefix}-{t.id}") for t in tasks))
    return asyncio.run(go())


def failures(results, passed=True):
    return [(r.task_id, r.details) for r in results if r.passed is not passed]


# --- construction and task sets -----------------------------------------------------------------

def test_is_a_task_environment_found_through_the_module():
    assert toolcall_env.ENVIRONMENT is ToolCallEnv
    assert isinstance(SHOP, TaskEnvironment) and isinstance(SHOP, Environment)
    assert SHOP.eval_metrics[0] == "pass_rate" and "mean_turns" in SHOP.eval_metrics
    assert SHOP.sandbox_overhead_s() is None


def test_unknown_args_specs_and_agents_are_refused_by_name():
    with pytest.raises(ValueError, match="max_turn"):
        ToolCallEnv({"max_turn": 4})
    with pytest.raises(ValueError, match="'bfcl:java'"):
        SHOP.tasks("bfcl:java")
    with pytest.raises(ValueError, match="'shopping'"):
        ToolCallEnv({"tasks": "shopping"})
    with pytest.raises(ValueError, match="not a part"):
        ToolCallEnv({"tasks": "shop:train"})
    with pytest.raises(ValueError, match="'human'"):
        SHOP.scripted_agent("human")


def test_shop_sets_hold_out_every_fifth_task_by_id():
    every = SHOP.tasks("shop")
    ids = sorted(t.id for t in every)
    assert len(every) == 30 and [t.id for t in every] == ids and SHOP.tasks() == every
    held = [t.id for t in SHOP.tasks("shop:heldout")]
    assert held == ids[4::5] and len(held) == 6
    assert [t.id for t in SHOP.heldout_set] and {t.id for t in SHOP.heldout_set} == set(held)
    assert {t.id for t in SHOP.train_set} == set(ids) - set(held) and len(SHOP.train_set) == 24
    t = every[0]
    assert t.category == f"shop/{t.task.kind}" and t.agent.max_turns == 8 and not t.agent.needs_submit
    assert t.agent.messages == [{"role": "system", "content": shop.SYSTEM_PROMPT},
                                {"role": "user", "content": t.task.instruction}]
    assert t.agent.tools == shop.TOOLS


def test_learnable_sets_follow_the_split():
    split = learnable.split_tasks(seed=0)
    assert [t.id for t in LEARN.tasks("learnable")] == [t.id for t in split.heldout]
    assert LEARN.tasks("learnable:heldout") == LEARN.tasks("learnable") == LEARN.tasks()
    assert [t.id for t in LEARN.train_set] == [t.id for t in split.train]
    assert len(LEARN.train_set) == 5901 and len(LEARN.heldout_set) == 654
    assert not {t.id for t in LEARN.train_set} & {t.id for t in LEARN.heldout_set}
    t = LEARN.heldout_set[0]
    assert t.agent.max_turns == 3 and t.category in ("learnable/calc", "learnable/unit")
    assert t.agent.messages == t.task.messages() and t.agent.tools == learnable.TOOLS


def test_explicit_eval_tasks_are_never_trained_on():
    with pytest.raises(ValueError, match="0 training and 24 evaluation"):
        ToolCallEnv({"eval_tasks": "shop:train"})  # training uses only the train part, minus what is scored
    env = ToolCallEnv({"eval_tasks": "learnable", "max_turns": 5})
    assert len(env.train_set) == 24 and len(env.heldout_set) == 654
    assert all(t.agent.max_turns == 5 for t in env.train_set + env.heldout_set)


@needs_bfcl
def test_explicit_bfcl_eval_tasks_are_removed_from_training():
    env = ToolCallEnv({"tasks": "bfcl:parallel:40", "eval_tasks": "bfcl:parallel:20"})
    first20 = {f"parallel_{i}" for i in range(20)}
    assert {t.id for t in env.heldout_set} == first20
    default = ToolCallEnv({"tasks": "bfcl:parallel:40"})
    assert {t.id for t in env.train_set} == {t.id for t in default.train_set} - first20


# --- calibration: oracle passes, null fails -------------------------------------------------------

def test_oracle_passes_every_shop_task():
    results = play(SHOP, SHOP.scripted_agent("oracle"), SHOP.tasks("shop"))
    assert failures(results) == []
    assert all((r.reward, r.tool_errors, r.turns) == (1.0, 0, 2) for r in results)


def test_oracle_passes_every_learnable_heldout_and_sampled_train_task():
    tasks = LEARN.tasks("learnable:heldout") + LEARN_TRAIN_SAMPLE
    results = play(LEARN, LEARN.scripted_agent("oracle"), tasks)
    assert len(results) == 954 and failures(results) == []
    assert all((r.reward, r.tool_calls, r.tool_errors, r.turns) == (1.0, 1, 0, 2) for r in results)


def test_null_fails_every_shop_and_learnable_task():
    for env, tasks in [(SHOP, SHOP.tasks("shop")), (LEARN, LEARN.tasks("learnable") + LEARN_TRAIN_SAMPLE)]:
        results = play(env, env.scripted_agent("null"), tasks)
        assert failures(results, passed=False) == []
        assert all((r.reward, r.turns, r.tool_calls) == (-1.0, 1, 0) for r in results)


@needs_bfcl
def test_bfcl_oracle_passes_the_simple_category_through_the_agent_loop():
    env = ToolCallEnv({"tasks": "bfcl:simple"})
    tasks = env.tasks("bfcl:simple")
    agent = Recorder(lambda tid: oracle_script(env._task(tid)))
    results = play(env, agent, tasks)
    passed = sum(r.passed for r in results)
    assert len(tasks) == 400 and passed / len(tasks) >= 0.99, failures(results)
    assert all(r.turns == 1 and r.tool_errors == 0 for r in results)
    # the calls go out under OpenAI-safe names and come back under BFCL's
    for t, r in zip(tasks, results):
        sent = [c["function"]["name"] for c in oracle_script(t)[0].tool_calls]
        assert all(re.fullmatch(r"[A-Za-z0-9_-]{1,64}", n) for n in sent)
        assert [c["name"] for c in r.details["calls"]] == [t.task.to_bfcl[n] for n in sent]
    null = play(env, env.scripted_agent("null"), tasks[:50], prefix="null")
    assert failures(null, passed=False) == []


@needs_bfcl
@pytest.mark.parametrize("category", ["multiple", "parallel"])
def test_bfcl_oracle_passes_multiple_and_parallel(category):
    env = ToolCallEnv({"tasks": f"bfcl:{category}"})
    results = play(env, env.scripted_agent("oracle"), env.tasks())
    assert len(results) == 200 and sum(r.passed for r in results) / 200 >= 0.99


@needs_bfcl
def test_bfcl_sets_limits_and_heldout_sample():
    env = ToolCallEnv({"tasks": "bfcl:parallel:40"})
    assert len(env.tasks()) == 40 and len(env.heldout_set) == 10 and len(env.train_set) == 30
    assert env.tasks("bfcl:parallel:40")[0].agent.max_turns == 1
    assert ToolCallEnv({"tasks": "bfcl:parallel:40"}).heldout_set == env.heldout_set  # a fixed sample
    reseeded = ToolCallEnv({"tasks": "bfcl:parallel:40", "seed": 1})
    assert {t.id for t in reseeded.heldout_set} != {t.id for t in env.heldout_set}
    t = env.tasks()[0]
    assert t.category == "bfcl/parallel" and t.agent.messages[0]["role"] == "system"
    assert t.agent.messages[1:] == t.task.messages and t.agent.tools == t.task.tools


# --- what goes over the loop ----------------------------------------------------------------------

def test_tool_messages_carry_the_call_id_and_structured_json():
    task = next(t for t in SHOP.tasks("shop") if len(shop.oracle_calls(t.task)) >= 2)
    agent = Recorder(lambda tid: oracle_script(SHOP._task(tid)))
    result = asyncio.run(SHOP.run_task(agent, task, "ids"))
    assert result.passed
    second = agent.sent["ids"][1]
    calls = second[len(task.agent.messages)]["tool_calls"]
    tool_msgs = second[len(task.agent.messages) + 1:]
    assert [m["role"] for m in tool_msgs] == ["tool"] * len(calls)
    assert [m["tool_call_id"] for m in tool_msgs] == [c["id"] for c in calls]
    for m in tool_msgs:
        content = json.loads(m["content"])
        assert content["ok"] is True and "error" not in content
        assert isinstance(json.loads(content["output"]), dict)  # the tool's own JSON result


def _malformed_turn(name_ok: str) -> AssistantTurn:
    return AssistantTurn("", [
        {"id": "bad_json", "type": "function", "function": {"name": name_ok, "arguments": "{oops"}},
        {"id": "unknown", "type": "function", "function": {"name": "no_such_tool", "arguments": "{}"}}], "tool_calls")


@pytest.mark.parametrize("env", [SHOP, LEARN], ids=["shop", "learnable"])
def test_malformed_calls_are_tool_errors_not_crashes(env):
    task = env.tasks()[0]
    agent = Recorder(lambda tid: [_malformed_turn(task.agent.tools[0]["function"]["name"]),
                                  AssistantTurn("I could not do it.")])
    result = asyncio.run(env.run_task(agent, task, "bad", side=False))
    assert (result.passed, result.reward, result.turns, result.tool_calls, result.tool_errors) == (False, -1.0, 2, 2, 2)
    tool_msgs = [m for m in agent.sent["bad"][-1] if m["role"] == "tool"]
    contents = {m["tool_call_id"]: json.loads(m["content"]) for m in tool_msgs}
    assert contents["bad_json"]["ok"] is False and "not valid JSON" in contents["bad_json"]["error"]
    assert contents["unknown"]["ok"] is False and "unknown tool 'no_such_tool'" in contents["unknown"]["error"]
    assert agent.outcomes["bad"] == -1.0 and agent.feedback["bad"]


@needs_bfcl
def test_bfcl_answer_is_the_first_turn_and_malformed_calls_fail():
    env = ToolCallEnv({"tasks": "bfcl:simple:5"})
    task = env.tasks()[0]
    good = task.agent.tools[0]["function"]["name"]
    agent = Recorder(lambda tid: [_malformed_turn(good), *oracle_script(task)])
    result = asyncio.run(env.run_task(agent, task, "bad", side=False))
    assert (result.passed, result.reward, result.turns, result.tool_calls, result.tool_errors) == (False, -1.0, 1, 2, 2)
    assert agent.feedback["bad"] == "call 0 (calculate_triangle_area): arguments are not a JSON object"
    world = toolcall_env.make_world(task)
    bad_json, unknown, ok = (world.call(good, "{oops"), world.call("no_such_tool", "{}"),
                             world.call(good, oracle_script(task)[0].tool_calls[0]["function"]["arguments"]))
    assert (bad_json.ok, unknown.ok, ok.ok) == (False, False, True)
    assert "not valid JSON" in bad_json.error and "unknown tool 'no_such_tool'" in unknown.error
    assert json.loads(ok.message_content()) == {"ok": True, "output": "call recorded"}
    assert bad_json.submitted and ok.submitted  # any call ends the single BFCL turn


def test_shop_refused_call_leaves_the_db_and_feedback_names_the_gap():
    task = next(t for t in SHOP.tasks("shop") if t.id == "refuse_cancel_delivered")
    cancel = next(c for c in shop.load_tasks() if c.id == "cancel_no_longer_needed").actions[0]
    delivered = next(o for o in shop.load_db()["orders"].values() if o["status"] == "delivered")["order_id"]
    agent = Recorder(lambda tid: [call_turn([("cancel_order", {**cancel.arguments, "order_id": delivered})]),
                                  AssistantTurn("All done!")])
    result = asyncio.run(SHOP.run_task(agent, task, "refuse", side=False))
    assert (result.passed, result.tool_errors, result.details["db_match"]) == (False, 1, True)
    tool = json.loads(agent.sent["refuse"][1][-1]["content"])
    assert tool["ok"] is False and "only pending orders can be cancelled" in tool["error"]
    assert "did not state" in agent.feedback["refuse"] and agent.outcomes["refuse"] == -1.0


# --- episode, evaluate, report ----------------------------------------------------------------------

def test_episode_returns_metrics_and_reports_the_outcome():
    for env in (SHOP, LEARN):
        oracle, null = env.scripted_agent("oracle"), env.scripted_agent("null")
        m = asyncio.run(env.episode(oracle, "ep-o", random.Random(3)))
        assert m == {"passed": 1.0, "reward": 1.0, "turns": 2.0, "tool_errors": 0.0, "timeouts": 0.0}
        assert oracle.outcomes == {"ep-o": 1.0}
        m = asyncio.run(env.episode(null, "ep-n", random.Random(3)))
        assert m == {"passed": 0.0, "reward": -1.0, "turns": 1.0, "tool_errors": 0.0, "timeouts": 0.0}
        assert null.outcomes == {"ep-n": -1.0}
    fresh = ToolCallEnv({})
    asyncio.run(fresh.episode(fresh.scripted_agent("oracle"), "r", random.Random(0)))
    assert fresh.report()["episodes"] == 1.0 and fresh.report()["episodes_passed"] == 1.0


def test_episodes_draw_only_training_tasks():
    agent = Recorder(lambda tid: [])
    for i in range(60):
        asyncio.run(SHOP.episode(agent, f"draw-{i}", random.Random(i)))
    seen = {sent[0][1]["content"] for sent in agent.sent.values()}
    held = {t.task.instruction for t in SHOP.heldout_set}
    assert seen and not seen & held


def test_evaluate_oracle_and_null_four_at_a_time():
    for env, n in [(SHOP, 100), (LEARN, 40)]:
        oracle = Recorder(lambda tid, env=env: oracle_script(env._task(tid)))
        m = asyncio.run(env.evaluate(oracle, n, "ev"))
        assert m == {"pass_rate": 1.0, "mean_turns": 2.0, "tool_errors": 0.0, "timeouts": 0.0}
        assert len(oracle.sent) == min(n, len(env.heldout_set)) and oracle.outcomes == {}  # side turns only
        assert oracle.max_in_flight == 4
        m = asyncio.run(env.evaluate(env.scripted_agent("null"), n, "ev"))
        assert m == {"pass_rate": 0.0, "mean_turns": 1.0, "tool_errors": 0.0, "timeouts": 0.0}
    # the same tasks every time, drawn from the whole held-out set
    first = Recorder(lambda tid: [])
    asyncio.run(LEARN.evaluate(first, 40, "a"))
    again = Recorder(lambda tid: [])
    asyncio.run(LEARN.evaluate(again, 40, "b"))
    questions = [s[0][1]["content"] for s in first.sent.values()]
    assert questions == [s[0][1]["content"] for s in again.sent.values()]
    assert sorted(t.id for t in LEARN.heldout_order) == sorted(t.id for t in LEARN.heldout_set)
    assert [t.id for t in LEARN.heldout_order[:40]] != [t.id for t in LEARN.heldout_set[:40]]  # a seeded shuffle


def test_describe_names_the_sets():
    d = LEARN.describe()
    assert (d["tasks"], d["train_tasks"], d["eval_task_count"], d["max_turns"]) == ("learnable", 5901, 654, 3)
