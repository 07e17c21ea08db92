import json

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


def test_tool_verdicts_come_from_structured_status_not_from_words():
    failed = judge_rules(record(NextState(kind="tool", text=json.dumps(
        {"ok": False, "error": "unknown tool 'rm'", "output": ""}))), PATTERNS)
    assert failed.score == -1.0 and "unknown tool 'rm'" in failed.hint
    exit_1 = json.dumps({"ok": False, "exit_code": 1, "output": "cat: x: No such file or directory"})
    assert judge_rules(record(NextState(kind="tool", text=exit_1)), PATTERNS).score == -1.0
    slow = json.dumps({"ok": False, "exit_code": None, "timed_out": True, "output": ""})
    assert "timed out" in judge_rules(record(NextState(kind="tool", text=slow)), PATTERNS).hint
    # a file that says "error" is not a tool error; nor is free text that looks like a test summary
    printed = json.dumps({"ok": True, "exit_code": 0, "output": "ERROR: fatal error, traceback, 1 failed"})
    assert judge_rules(record(NextState(kind="tool", text=printed)), PATTERNS).score is None
    assert judge_rules(record(NextState(kind="tool", text="Error: file not found")), PATTERNS).score is None
    assert judge_rules(record(NextState(kind="tool", text="===== 5 passed in 0.31s =====")), PATTERNS).score is None
    two = json.dumps({"ok": True, "output": "7"}) + "\n" + json.dumps({"ok": False, "error": "bad arguments"})
    assert judge_rules(record(NextState(kind="tool", text=two)), PATTERNS).score == -1.0  # parallel calls


def test_directive_sentences_skip_short_ones():
    text = "No. Still not what I asked for. Please spell out the units like kilometers. Thanks!"
    assert directive_sentences(text, PATTERNS.directives) == "Please spell out the units like kilometers."


def test_complaint_without_directive_is_negative_without_hint():
    v = judge_rules(record(NextState(kind="user", text="That is wrong.")), PATTERNS)
    assert v.score == -1.0 and v.hint == ""


def test_every_directive_the_personal_env_can_say_reaches_the_teacher_whole():
    """Quoted pieces ('Certainly.', 'Hope this helps!') do not end a sentence: the hint is the whole directive."""
    import itertools

    from clawr1.config import JudgeConfig
    from envs.personal.phrases import STILL_WRONG
    from envs.personal.preferences import KINDS, OPTIONS, directive_text

    c = JudgeConfig()
    patterns = RulePatterns.compile(c.correction_patterns, c.directive_patterns)
    directives = [directive_text(dict(zip(kinds, options)))
                  for r in range(1, len(KINDS) + 1) for kinds in itertools.combinations(KINDS, r)
                  for options in itertools.product(*(OPTIONS[k] for k in kinds))]
    assert len(directives) > 400 and any("'Certainly.'" in d for d in directives)
    for d in directives:
        for said in ("No. " + d, STILL_WRONG.format(directive=d) + " Thanks! Next question: What is 2 m plus 3 m?"):
            assert directive_sentences(said, patterns.directives) == d, said
    assert directive_sentences("Please don't add a sign-off. It's fine.", patterns.directives) == "Please don't add a sign-off."


def test_the_training_wordings_of_free_users_are_read_as_hints_and_vague_complaints_as_scores_only():
    """The judge's request patterns were written before the phrasing bank; the bank's training part is what they may
    be checked on (the held-out part's extraction rate is measured in the benchmark, not asserted)."""
    from envs.personal.phrases import PHRASINGS, TRAINING_COMPLAINTS, TRAINING_PHRASINGS, VAGUE_COMPLAINTS

    for kind, options in PHRASINGS.items():
        for option, phrasings in options.items():
            for text in phrasings[:TRAINING_PHRASINGS]:
                sentence = text[0].upper() + text[1:] + "."
                v = judge_rules(record(NextState(kind="user", text=f"Hmm, not quite. {sentence}")), PATTERNS)
                assert (v.score, v.hint) == (-1.0, sentence), (kind, option)
    for complaint in VAGUE_COMPLAINTS[:TRAINING_COMPLAINTS]:
        v = judge_rules(record(NextState(kind="user", text=complaint)), PATTERNS)
        assert (v.score, v.hint, v.reason) == (-1.0, "", "complaint")
