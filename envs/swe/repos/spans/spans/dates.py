"""Date ranges as half-open intervals of `datetime.date`."""
from __future__ import annotations

import datetime as dt
from typing import Iterator

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
