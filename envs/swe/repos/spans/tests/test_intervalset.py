import datetime as dt

from spans import Interval, IntervalSet

I = Interval


def test_a_set_keeps_its_intervals_merged_and_sorted():
    s = IntervalSet([I(8, 9), I(0, 3), I(1, 5), I(6, 6)])
    assert list(s) == [I(0, 5), I(8, 9)]
    assert len(s) == 2 and s.bounds == I(0, 9)


def test_the_empty_set():
    empty = IntervalSet()
    assert not empty and len(empty) == 0 and empty.bounds is None
    assert empty.total_length() == 0
    assert 1 not in empty


def test_membership_excludes_the_ends():
    s = IntervalSet([I(0, 2), I(5, 7)])
    assert 0 in s and 1.5 in s and 6 in s
    assert 2 not in s and 4 not in s and 7 not in s


def test_equality_and_hashing():
    assert IntervalSet([I(0, 4), I(1, 2)]) == IntervalSet([I(0, 4)])
    assert len({IntervalSet([I(0, 1)]), IntervalSet([I(0, 1)])}) == 1
    assert IntervalSet([I(0, 1)]) != [I(0, 1)]
    assert repr(IntervalSet([I(0, 1)])) == "IntervalSet([Interval(start=0, end=1)])"


def test_union():
    a = IntervalSet([I(0, 3)])
    b = IntervalSet([I(2, 5), I(7, 8)])
    assert list(a.union(b)) == [I(0, 5), I(7, 8)]
    assert a | b == b | a


def test_intersection():
    a = IntervalSet([I(0, 4), I(6, 10)])
    b = IntervalSet([I(3, 7), I(9, 12)])
    assert list(a & b) == [I(3, 4), I(6, 7), I(9, 10)]
    assert not IntervalSet([I(0, 1)]) & IntervalSet([I(5, 6)])


def test_difference():
    a = IntervalSet([I(0, 10)])
    b = IntervalSet([I(2, 3), I(5, 7)])
    assert list(a - b) == [I(0, 2), I(3, 5), I(7, 10)]
    assert list(b - a) == []
    assert list(IntervalSet([I(0, 4), I(6, 9)]) - IntervalSet([I(3, 7)])) == [I(0, 3), I(7, 9)]


def test_complement_within_a_window():
    s = IntervalSet([I(1, 3), I(6, 8)])
    assert list(s.complement(I(0, 10))) == [I(0, 1), I(3, 6), I(8, 10)]
    assert list(s.complement(I(1, 3))) == []


def test_total_length():
    assert IntervalSet([I(0, 4), I(2, 6), I(10, 11)]).total_length() == 7


def test_sets_of_dates():
    days = IntervalSet([I(dt.date(2024, 1, 1), dt.date(2024, 1, 10)), I(dt.date(2024, 1, 5), dt.date(2024, 1, 12))])
    assert days.total_length() == dt.timedelta(days=11)
    assert dt.date(2024, 1, 11) in days and dt.date(2024, 1, 12) not in days
