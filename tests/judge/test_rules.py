from clawr1.config import JudgeConfig
from clawr1.judge.rules import RulePatterns, directive_sentences, judge_rules
from clawr1.protocol import NextState, TurnRecord

PATTERNS = RulePatterns.compile(JudgeConfig().correction_patterns, JudgeConfig().directive_patterns)


def record(next_state, question="What is 3 km plus 4 km?"):
    return TurnRecord(session_id="s", turn_index=0, prompt_ids=[1], response_ids=[2], rollout_logprobs=[-1.0],
                      versions=[0], messages=[{"role": "user", "content": question}], next_state=next_state)


def test_correction_scores_minus_one_with_the_directive_as_hint():
    v = judge_rules(record(NextState(kind="user", text="No. Please put the answer in <ans> tags.")), PATTERNS)
    assert v.score == -1.0 and v.hint == "Please put the answer in <ans> tags."


def test_moving_on_scores_plus_one_without_hint():
    v = judge_rules(record(NextState(kind="user", text="Thanks! Next question: What is 1 g plus 2 g?")), PATTERNS)
    assert v.score == 1.0 and v.hint == ""


def test_reask_scores_minus_one_without_hint():
    v = judge_rules(record(NextState(kind="user", text="Hmm. What is 3 km plus 4 km?")), PATTERNS)
    assert v.score == -1.0 and v.hint == "" and v.reason == "re-ask"


def test_outcome_and_feedback_and_missing_next_state():
    assert judge_rules(record(NextState(kind="outcome", reward=1.0)), PATTERNS).score == 1.0
    neg = judge_rules(record(NextState(kind="outcome", reward=-1.0, text="Please use tags.")), PATTERNS)
    assert neg.score == -1.0 and neg.hint == "Please use tags."
    assert judge_rules(record(NextState(kind="feedback", score=-0.3, text="too long")), PATTERNS).score == -1.0
    assert judge_rules(record(NextState(kind="none")), PATTERNS).score is None
    assert judge_rules(record(None), PATTERNS).score is None


def test_tool_error_is_negative_and_plain_tool_output_has_no_score():
    err = judge_rules(record(NextState(kind="tool", text="Error: file not found")), PATTERNS)
    assert err.score == -1.0 and "not found" in err.hint
    assert judge_rules(record(NextState(kind="tool", text="42")), PATTERNS).score is None


def test_directive_sentences_skip_short_ones():
    text = "No. Still not what I asked for. Please spell out the units like kilometers. Thanks!"
    assert directive_sentences(text, PATTERNS.directives) == "Please spell out the units like kilometers."


def test_complaint_without_directive_is_negative_without_hint():
    v = judge_rules(record(NextState(kind="user", text="That is wrong.")), PATTERNS)
    assert v.score == -1.0 and v.hint == ""


def test_test_verdicts_from_tool_output():
    passed = judge_rules(record(NextState(kind="tool", text="===== 5 passed in 0.31s =====")), PATTERNS)
    assert (passed.score, passed.hint) == (1.0, "")
    failed = judge_rules(record(NextState(kind="tool", text="===== 1 failed, 4 passed in 0.40s =====")), PATTERNS)
    assert failed.score == -1.0 and failed.hint.startswith("===== 1 failed")
    assert judge_rules(record(NextState(kind="tool", text="All tests passed")), PATTERNS).score == 1.0
