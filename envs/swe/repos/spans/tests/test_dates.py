import datetime as dt

from spans import Interval, days_in_range, overlapping_days, weekdays_between

D = dt.date


def test_days_in_range():
    assert list(days_in_range(Interval(D(2024, 2, 28), D(2024, 3, 2)))) == [D(2024, 2, 28), D(2024, 2, 29),
                                                                            D(2024, 3, 1)]


def test_weekdays_full_week():
    assert weekdays_between(D(2024, 1, 1), D(2024, 1, 8)) == 5


def test_overlapping_days_none():
    assert overlapping_days(Interval(D(2024, 1, 1), D(2024, 1, 3)), Interval(D(2024, 2, 1), D(2024, 2, 3))) == 0
