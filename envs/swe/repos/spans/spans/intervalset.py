"""Sets of points stored as sorted, disjoint half-open intervals."""
from __future__ import annotations

from typing import Any, Iterable, Iterator

from spans.interval import Interval, gaps, merge, total_length


class IntervalSet:
    """An immutable union of intervals, kept merged; set operations return new sets."""

    def __init__(self, intervals: Iterable[Interval] = ()) -> None:
        self._intervals = tuple(merge(intervals))

    def __iter__(self) -> Iterator[Interval]:
        return iter(self._intervals)

    def __len__(self) -> int:
        return len(self._intervals)

    def __bool__(self) -> bool:
        return bool(self._intervals)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, IntervalSet) and self._intervals == other._intervals

    def __hash__(self) -> int:
        return hash(self._intervals)

    def __repr__(self) -> str:
        return f"IntervalSet({list(self._intervals)!r})"

    def __contains__(self, point: Any) -> bool:
        return any(interval.contains(point) for interval in self._intervals)

    @property
    def bounds(self) -> Interval | None:
        """The smallest interval holding the whole set, or None for the empty set."""
        if not self._intervals:
            return None
        return Interval(self._intervals[0].start, self._intervals[-1].end)

    def union(self, other: IntervalSet) -> IntervalSet:
        return IntervalSet([*self._intervals, *other._intervals])

    def intersection(self, other: IntervalSet) -> IntervalSet:
        common = []
        for mine in self._intervals:
            for theirs in other._intervals:
                part = mine.intersection(theirs)
                if part is not None and not part.empty:
                    common.append(part)
        return IntervalSet(common)

    def difference(self, other: IntervalSet) -> IntervalSet:
        """The points of this set that are not in `other`."""
        return IntervalSet(part for interval in self._intervals for part in gaps(other._intervals, interval))

    def complement(self, within: Interval) -> IntervalSet:
        """The points of `within` that are not in this set."""
        return IntervalSet(gaps(self._intervals, within))

    def total_length(self) -> Any:
        """The summed length of the intervals (0 for the empty set)."""
        return total_length(self._intervals)

    __or__ = union
    __and__ = intersection
    __sub__ = difference
