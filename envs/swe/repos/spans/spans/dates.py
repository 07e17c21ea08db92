"""Date ranges as half-open intervals of `datetime.date`."""
from __future__ import annotations

import calendar
import datetime as dt
from typing import Callable, Iterable, Iterator

from spans.interval import Interval

ONE_DAY = dt.timedelta(days=1)


def days_in_range(period: Interval) -> Iterator[dt.date]:
    """Every day of `period`, the end excluded."""
    day = period.start
    while day < period.end:
        yield day
        day += ONE_DAY


def weekdays_between(start: dt.date, end: dt.date) -> int:
    """How many Monday-to-Friday days lie in [start, end)."""
    full_weeks, rest = divmod((end - start).days, 7)
    count = full_weeks * 5
    for offset in range(rest):
        if (start + dt.timedelta(days=offset)).weekday() < 5:
            count += 1
    return count


def overlapping_days(a: Interval, b: Interval) -> int:
    """How many days two date ranges share."""
    common = a.intersection(b)
    return 0 if common is None else common.length().days


def add_months(day: dt.date, months: int) -> dt.date:
    """`day` moved by whole months, clamped to the end of a shorter month (31 Jan + 1 month = 28 or 29 Feb)."""
    year, month_index = divmod(day.year * 12 + day.month - 1 + months, 12)
    month = month_index + 1
    return day.replace(year=year, month=month, day=min(day.day, calendar.monthrange(year, month)[1]))


def month_of(day: dt.date) -> Interval:
    """The calendar month holding `day`: [its first day, the first day of the next month)."""
    first = day.replace(day=1)
    return Interval(first, add_months(first, 1))


def week_of(day: dt.date, first_weekday: int = 0) -> Interval:
    """The seven-day week holding `day`, starting on `first_weekday` (0 is Monday, 6 is Sunday)."""
    start = day - dt.timedelta(days=(day.weekday() - first_weekday) % 7)
    return Interval(start, start + dt.timedelta(days=7))


def _chunks(period: Interval, unit_of: Callable[[dt.date], Interval]) -> Iterator[Interval]:
    start = period.start
    while start < period.end:
        end = min(unit_of(start).end, period.end)
        yield Interval(start, end)
        start = end


def weeks_in_range(period: Interval, first_weekday: int = 0) -> Iterator[Interval]:
    """`period` cut at week boundaries; the first and last weeks may be partial."""
    return _chunks(period, lambda day: week_of(day, first_weekday))


def months_in_range(period: Interval) -> Iterator[Interval]:
    """`period` cut at month boundaries; the first and last months may be partial."""
    return _chunks(period, month_of)


def business_days(period: Interval, holidays: Iterable[dt.date] = ()) -> Iterator[dt.date]:
    """The Monday-to-Friday days of `period` that are not holidays."""
    skipped = set(holidays)
    return (day for day in days_in_range(period) if day.weekday() < 5 and day not in skipped)
