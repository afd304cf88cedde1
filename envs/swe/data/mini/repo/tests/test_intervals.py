import pytest

from handykit.intervals import Interval, merge_intervals, total_length


def test_interval_rejects_reversed_bounds():
    with pytest.raises(ValueError):
        Interval(5, 1)


def test_length_and_contains():
    iv = Interval(2, 5)
    assert iv.length == 3
    assert iv.contains(2)
    assert not iv.contains(5)


def test_overlapping_intervals_overlap():
    assert Interval(1, 5).overlaps(Interval(3, 8))
    assert not Interval(1, 2).overlaps(Interval(4, 8))


def test_intersection():
    assert Interval(1, 5).intersection(Interval(3, 8)) == Interval(3, 5)
    assert Interval(1, 2).intersection(Interval(4, 8)) is None


def test_merge_overlapping_and_unsorted():
    got = merge_intervals([Interval(5, 8), Interval(1, 3), Interval(2, 4)])
    assert got == [Interval(1, 4), Interval(5, 8)]


def test_merge_touching():
    assert merge_intervals([Interval(1, 3), Interval(3, 5)]) == [Interval(1, 5)]


def test_total_length_counts_overlap_once():
    assert total_length([Interval(0, 2), Interval(1, 3), Interval(10, 11)]) == 4
