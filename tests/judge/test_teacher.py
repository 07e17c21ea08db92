from clawr1.chat import splice_hint

USER = [90, 91]  # the ids that open a user message
END = 99  # the end-of-message id


def test_hint_goes_before_the_end_of_the_last_user_message():
    #          system msg        user msg 1           assistant        user msg 2       generation prompt
    prompt = [90, 5, 6, END, 1] + USER + [7, END, 1] + [80, 8, END, 1] + USER + [9, END, 1] + [80, 81]
    out = splice_hint(prompt, [55, 56], USER, END)
    at = len(prompt) - 4  # the END closing user msg 2
    assert out == prompt[:at] + [55, 56] + prompt[at:]


def test_response_ids_are_untouched_by_splicing():
    prompt = USER + [7, 8, END, 1, 80, 81]
    response = [11, 12, END]
    teacher_input = splice_hint(prompt, [55], USER, END) + response
    assert teacher_input[-len(response):] == response and len(teacher_input) == len(prompt) + 1 + len(response)


def test_without_a_user_message_the_last_message_gets_the_hint():
    prompt = [70, 3, END, 1, 71, 4, END, 1, 80]
    assert splice_hint(prompt, [55], USER, END) == [70, 3, END, 1, 71, 4, 55, END, 1, 80]
