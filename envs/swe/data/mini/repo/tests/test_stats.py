import math

import pytest

from handykit.stats import mean, median, mode, percentile, stdev, variance


def test_mean():
    assert mean([1, 2, 3, 4]) == 2.5


def test_mean_of_nothing_raises():
    with pytest.raises(ValueError):
        mean([])


def test_median_sorted_input():
    assert median([1, 2, 3]) == 2
    assert median([1, 2, 3, 4]) == 2.5


def test_mode_prefers_smallest_on_tie():
    assert mode([3, 1, 3, 1, 2]) == 1


def test_population_variance_and_stdev():
    assert variance([2, 4, 4, 4, 5, 5, 7, 9], ddof=0) == 4
    assert stdev([2, 4, 4, 4, 5, 5, 7, 9], ddof=0) == 2


def test_percentile_interpolates():
    data = [15, 20, 35, 40, 50]
    assert percentile(data, 0) == 15
    assert percentile(data, 50) == 35
    assert math.isclose(percentile(data, 30), 23.0)


def test_percentile_rejects_out_of_range():
    with pytest.raises(ValueError):
        percentile([1, 2], 101)
