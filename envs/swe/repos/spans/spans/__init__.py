"""spans: half-open intervals [start, end) of numbers or dates, and operations on sets of them."""
from spans.interval import Interval, gaps, merge, total_length
from spans.dates import days_in_range, overlapping_days, weekdays_between

__all__ = ["Interval", "days_in_range", "gaps", "merge", "overlapping_days", "total_length", "weekdays_between"]
