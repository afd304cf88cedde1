"""Descriptive statistics on plain sequences of numbers."""

import math
from collections import Counter

__all__ = ["mean", "median", "mode", "variance", "stdev", "percentile"]


def _require_data(xs, at_least=1):
    xs = list(xs)
    if len(xs) < at_least:
        raise ValueError(f"need at least {at_least} data point(s), got {len(xs)}")
    return xs


def mean(xs):
    xs = _require_data(xs)
    return sum(xs) / len(xs)


def median(xs):
    """The middle value; for an even count, the mean of the two middle values."""
    s = sorted(_require_data(xs))
    mid = len(s) // 2
    if len(s) % 2:
        return s[mid]
    return (s[mid - 1] + s[mid]) / 2


def mode(xs):
    """The most common value; ties go to the smallest value."""
    counts = Counter(_require_data(xs))
    best = max(counts.values())
    return min(x for x, c in counts.items() if c == best)


def variance(xs, ddof=1):
    """Variance with ``ddof`` delta degrees of freedom: ``ddof=1`` (default) is the sample
    variance, ``ddof=0`` the population variance."""
    xs = _require_data(xs, at_least=ddof + 1)
    m = mean(xs)
    return sum((x - m) ** 2 for x in xs) / (len(xs) - ddof)


def stdev(xs, ddof=1):
    return math.sqrt(variance(xs, ddof=ddof))


def percentile(xs, p):
    """The ``p``-th percentile (0 <= p <= 100), interpolating linearly between ranks.

    ``percentile(xs, 0)`` is the minimum and ``percentile(xs, 100)`` the maximum.
    """
    if not 0 <= p <= 100:
        raise ValueError(f"p must be between 0 and 100, got {p}")
    s = sorted(_require_data(xs))
    k = (len(s) - 1) * p / 100
    lo = math.floor(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)
