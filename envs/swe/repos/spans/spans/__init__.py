"""spans: half-open intervals [start, end) of numbers or dates, and operations on sets of them."""
from spans.interval import Interval, gaps, merge, total_length
from spans.intervalset import IntervalSet
from spans.dates import (add_months, business_days, days_in_range, month_of, months_in_range, overlapping_days,
                         week_of, weekdays_between, weeks_in_range)

__all__ = ["Interval", "IntervalSet", "add_months", "business_days", "days_in_range", "gaps", "merge", "month_of",
           "months_in_range", "overlapping_days", "total_length", "week_of", "weekdays_between", "weeks_in_range"]
