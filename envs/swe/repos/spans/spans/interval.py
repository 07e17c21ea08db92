"""Half-open intervals: `Interval(1, 3)` holds 1 and 2.5 but not 3."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable


@dataclass(frozen=True, order=True)
class Interval:
    start: Any
    end: Any

    def __post_init__(self) -> None:
        if self.end < self.start:
            raise ValueError(f"interval end {self.end!r} is before its start {self.start!r}")

    @property
    def empty(self) -> bool:
        return self.start == self.end

    def length(self) -> Any:
        return self.end - self.start

    def contains(self, point: Any) -> bool:
        """Whether `point` lies in the interval (the end is excluded)."""
        return self.start <= point < self.end

    def overlaps(self, other: Interval) -> bool:
        """Whether the two intervals share at least one point (touching intervals do not)."""
        return self.start < other.end and other.start < self.end

    def intersection(self, other: Interval) -> Interval | None:
        """The common part, or None when they do not overlap."""
        if not self.overlaps(other):
            return None
        return Interval(max(self.start, other.start), min(self.end, other.end))

    def shift(self, offset: Any) -> Interval:
        return Interval(self.start + offset, self.end + offset)

    def covers(self, other: Interval) -> bool:
        """Whether `other` lies entirely within this interval."""
        return self.start <= other.start and other.end <= self.end

    def split(self, point: Any) -> tuple[Interval, Interval]:
        """The parts before `point` and from `point` on; `point` must lie within [start, end]."""
        if not self.start <= point <= self.end:
            raise ValueError(f"cannot split {self} at {point!r}: outside the interval")
        return Interval(self.start, point), Interval(point, self.end)


def merge(intervals: Iterable[Interval]) -> list[Interval]:
    """The union as sorted, disjoint intervals; touching intervals are joined, empty ones dropped."""
    ordered = sorted(i for i in intervals if not i.empty)
    merged: list[Interval] = []
    for interval in ordered:
        if merged and interval.start <= merged[-1].end:
            last = merged.pop()
            merged.append(Interval(last.start, max(last.end, interval.end)))
        else:
            merged.append(interval)
    return merged


def gaps(intervals: Iterable[Interval], within: Interval) -> list[Interval]:
    """The parts of `within` that no interval covers, in order."""
    result: list[Interval] = []
    cursor = within.start
    for interval in merge(intervals):
        if interval.end <= within.start or interval.start >= within.end:
            continue
        if interval.start > cursor:
            result.append(Interval(cursor, interval.start))
        cursor = max(cursor, interval.end)
    if cursor < within.end:
        result.append(Interval(cursor, within.end))
    return result


def total_length(intervals: Iterable[Interval]) -> Any:
    """The length of the union (overlaps counted once)."""
    merged = merge(intervals)
    if not merged:
        return 0
    total = merged[0].length()
    for interval in merged[1:]:
        total = total + interval.length()
    return total
