"""benchmarks/llm_judge_probe.py: its summary counts what it says, and the committed probe recomputes from its
per-turn votes with the judge's own parsing."""
from __future__ import annotations

import json

from benchmarks.learning_iv_rows import DATA
from benchmarks.llm_judge_probe import summary
from clawr1.judge.votes import majority, parse_eval


def turn(truth: bool, decision, hint: str, votes: list[str]) -> dict:
    return {"truth": truth, "decision": decision, "hint": hint, "votes": votes}


def test_the_summary_counts_decisions_accuracy_hints_and_bare_numbers():
    turns = [turn(True, 1.0, "", ["\\boxed{1}", "1", "x", "\\boxed{-1}", "1", "-1."]),  # decided, right
             turn(False, 1.0, "Say Sure!", ["ok \\boxed{1}", "0", "-1", "", "", ""]),     # decided, wrong, hinted
             turn(False, 0.0, "", ["\\boxed{1}", "\\boxed{-1}", "1.", "", "", ""]),        # a tie: not decided
             turn(True, None, "", ["1", "-1", "yes", "", "", ""])]                        # all abstained
    s = summary(turns, votes=3)
    assert (s["turns"], s["wrong_answers"], s["decided"], s["decided_rate"]) == (4, 2, 2, 0.5)
    assert s["accuracy_on_decided"] == 0.5
    assert (s["eval_votes"], s["eval_votes_parsed"], s["eval_votes_bare_numbers"]) == (12, 4, 6)
    assert (s["hinted"], s["hints_on_wrong"]) == (1, 1)


def test_the_committed_probe_recomputes_from_its_votes():
    data = json.loads((DATA / "llm_judge.json").read_text())
    m = data["votes"]
    for t in data["per_turn"]:
        assert len(t["votes"]) == 2 * m
        decision = majority([parse_eval(v) for v in t["votes"][:m]])
        assert t["decision"] == (None if decision is None else float(decision))
    assert {k: v for k, v in data.items() if k in summary([], m)} == summary(data["per_turn"], m)
