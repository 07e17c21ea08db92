from clawr1.judge.votes import Vote, agreement, best_hint, majority, parse_eval, parse_hint, render_context


def test_parse_eval_takes_the_last_boxed_value():
    assert parse_eval("the user corrected it, so \\boxed{-1}").score == -1
    assert parse_eval("first \\boxed{1} then on reflection \\boxed{0}").score == 0
    assert parse_eval("\\boxed{ +1 }").score == 1
    assert parse_eval("no verdict here").score is None
    assert parse_eval("\\boxed{7}").score is None  # out of range is an abstention
    assert parse_eval(None).score is None


def test_parse_hint_needs_a_non_trivial_hint():
    ok = parse_hint("\\boxed{1} [HINT_START]Put the answer in <ans> tags.[HINT_END]")
    assert ok.score == 1 and ok.hint == "Put the answer in <ans> tags."
    assert parse_hint("\\boxed{1} [HINT_START]ok[HINT_END]").score is None  # too short to say anything
    assert parse_hint("\\boxed{1} but no hint").score is None
    assert parse_hint("nothing to learn \\boxed{-1}").score == -1
    assert parse_hint("garbled").score is None


def test_majority_with_ties_and_abstentions():
    v = lambda *s: [Vote(x) for x in s]  # noqa: E731
    assert majority(v(1, 1, -1)) == 1
    assert majority(v(-1, None, -1)) == -1
    assert majority(v(1, -1)) == 0  # tie
    assert majority(v(1, -1, 0)) == 0  # three-way tie
    assert majority(v(1, None, None)) == 1  # abstentions do not vote
    assert majority(v(None, None)) is None
    assert agreement(v(1, 1, -1, None), 1) == 2 / 3


def test_best_hint_is_the_longest_accepted():
    votes = [Vote(1, "Use tags."), Vote(-1), Vote(1, "Use <ans> tags around the number."), Vote(None, "ignored one")]
    assert best_hint(votes) == "Use <ans> tags around the number."
    assert best_hint([Vote(-1), Vote(None)]) == ""


def test_context_shows_recent_turns_and_the_role_of_what_followed():
    msgs = [{"role": "system", "content": "S"}] + [{"role": "user", "content": f"q{i}"} for i in range(6)]
    text = render_context(msgs, "answer", "tool", "Error: not found", last_k=2)
    assert "q4" in text and "q5" in text and "q3" not in text and "[system]" not in text
    assert "from the tool" in text and "Error: not found" in text and "answer" in text
