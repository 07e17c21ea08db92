import pytest

from spans import Interval, gaps, merge, total_length


def test_end_before_start_is_refused():
    with pytest.raises(ValueError):
        Interval(3, 1)


def test_contains_excludes_the_end():
    assert Interval(1, 3).contains(1) and Interval(1, 3).contains(2.5)
    assert not Interval(1, 3).contains(3)


def test_overlaps_basic():
    assert Interval(0, 5).overlaps(Interval(4, 8))
    assert not Interval(0, 2).overlaps(Interval(5, 8))


def test_intersection():
    assert Interval(0, 5).intersection(Interval(3, 9)) == Interval(3, 5)
    assert Interval(0, 1).intersection(Interval(4, 9)) is None


def test_shift():
    assert Interval(1, 2).shift(10) == Interval(11, 12)


def test_merge_overlapping():
    assert merge([Interval(5, 7), Interval(0, 3), Interval(2, 4)]) == [Interval(0, 4), Interval(5, 7)]


def test_merge_drops_empty():
    assert merge([Interval(1, 1)]) == []


def test_gaps_inside_window():
    assert gaps([Interval(2, 3)], Interval(0, 5)) == [Interval(0, 2), Interval(3, 5)]


def test_total_length_counts_overlap_once():
    assert total_length([Interval(0, 4), Interval(2, 6)]) == 6
    assert total_length([]) == 0


def test_covers():
    assert Interval(0, 10).covers(Interval(2, 10))
    assert Interval(0, 10).covers(Interval(0, 10))
    assert not Interval(0, 10).covers(Interval(5, 11))


def test_split():
    assert Interval(0, 10).split(4) == (Interval(0, 4), Interval(4, 10))
    assert Interval(0, 10).split(0) == (Interval(0, 0), Interval(0, 10))
    with pytest.raises(ValueError):
        Interval(0, 10).split(11)
