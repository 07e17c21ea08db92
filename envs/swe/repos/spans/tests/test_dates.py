import datetime as dt

from spans import (Interval, add_months, business_days, days_in_range, month_of, months_in_range, overlapping_days,
                   week_of, weekdays_between, weeks_in_range)

D = dt.date


def test_days_in_range():
    assert list(days_in_range(Interval(D(2024, 2, 28), D(2024, 3, 2)))) == [D(2024, 2, 28), D(2024, 2, 29),
                                                                            D(2024, 3, 1)]


def test_weekdays_full_week():
    assert weekdays_between(D(2024, 1, 1), D(2024, 1, 8)) == 5


def test_overlapping_days_none():
    assert overlapping_days(Interval(D(2024, 1, 1), D(2024, 1, 3)), Interval(D(2024, 2, 1), D(2024, 2, 3))) == 0


def test_add_months_clamps_to_the_month_end():
    assert add_months(D(2024, 1, 31), 1) == D(2024, 2, 29)
    assert add_months(D(2023, 1, 31), 1) == D(2023, 2, 28)
    assert add_months(D(2024, 11, 15), 3) == D(2025, 2, 15)
    assert add_months(D(2024, 3, 31), -1) == D(2024, 2, 29)
    assert add_months(D(2024, 1, 15), -13) == D(2022, 12, 15)


def test_month_of():
    assert month_of(D(2024, 2, 10)) == Interval(D(2024, 2, 1), D(2024, 3, 1))
    assert month_of(D(2024, 12, 31)) == Interval(D(2024, 12, 1), D(2025, 1, 1))


def test_week_of():
    assert week_of(D(2024, 1, 3)) == Interval(D(2024, 1, 1), D(2024, 1, 8))
    assert week_of(D(2024, 1, 1)) == Interval(D(2024, 1, 1), D(2024, 1, 8))
    assert week_of(D(2024, 1, 3), first_weekday=6) == Interval(D(2023, 12, 31), D(2024, 1, 7))


def test_weeks_in_range_clips_the_first_and_last_week():
    weeks = list(weeks_in_range(Interval(D(2024, 1, 3), D(2024, 1, 17))))
    assert weeks == [Interval(D(2024, 1, 3), D(2024, 1, 8)), Interval(D(2024, 1, 8), D(2024, 1, 15)),
                     Interval(D(2024, 1, 15), D(2024, 1, 17))]
    assert list(weeks_in_range(Interval(D(2024, 1, 3), D(2024, 1, 3)))) == []


def test_months_in_range():
    months = list(months_in_range(Interval(D(2024, 1, 20), D(2024, 4, 1))))
    assert months == [Interval(D(2024, 1, 20), D(2024, 2, 1)), Interval(D(2024, 2, 1), D(2024, 3, 1)),
                      Interval(D(2024, 3, 1), D(2024, 4, 1))]
    assert sum(len(list(days_in_range(m))) for m in months) == 72


def test_business_days_skip_weekends_and_holidays():
    january = Interval(D(2024, 1, 1), D(2024, 1, 15))
    days = list(business_days(january, holidays=[D(2024, 1, 1), D(2024, 1, 6)]))
    assert days[0] == D(2024, 1, 2) and len(days) == 9
    assert all(day.weekday() < 5 for day in days)
