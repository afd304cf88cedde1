"""Half-open numeric intervals ``[start, end)`` and operations on collections of them."""

from dataclasses import dataclass

__all__ = ["Interval", "merge_intervals", "total_length"]


@dataclass(frozen=True, order=True)
class Interval:
    """The half-open interval ``[start, end)``: ``start`` is inside, ``end`` is not."""

    start: float
    end: float

    def __post_init__(self):
        if self.end < self.start:
            raise ValueError(f"end {self.end} is before start {self.start}")

    @property
    def length(self):
        return self.end - self.start

    def contains(self, x):
        return self.start <= x < self.end

    def overlaps(self, other):
        """True when the two intervals share at least one point."""
        return self.start < other.end and other.start < self.end

    def intersection(self, other):
        """The common part, or ``None`` when the intervals do not overlap."""
        if not self.overlaps(other):
            return None
        return Interval(max(self.start, other.start), min(self.end, other.end))


def merge_intervals(intervals):
    """Merge overlapping or touching intervals; the result is sorted and disjoint.

    >>> merge_intervals([Interval(5, 8), Interval(1, 3), Interval(2, 4)])
    [Interval(start=1, end=4), Interval(start=5, end=8)]
    """
    merged = []
    for iv in sorted(intervals):
        if merged and iv.start <= merged[-1].end:
            last = merged[-1]
            merged[-1] = Interval(last.start, max(last.end, iv.end))
        else:
            merged.append(iv)
    return merged


def total_length(intervals):
    """Length of the union of ``intervals`` (overlaps counted once)."""
    return sum(iv.length for iv in merge_intervals(intervals))
