"""Small iteration helpers."""

from collections import deque
from itertools import islice

__all__ = ["chunked", "windowed", "unique", "flatten"]


def chunked(iterable, size):
    """Yield lists of ``size`` items; the last list may be shorter.

    >>> list(chunked(range(5), 2))
    [[0, 1], [2, 3], [4]]
    """
    if size < 1:
        raise ValueError("size must be at least 1")
    it = iter(iterable)
    while True:
        chunk = list(islice(it, size))
        if not chunk:
            return
        yield chunk


def windowed(iterable, n):
    """Yield tuples of ``n`` consecutive items (nothing if there are fewer than ``n``)."""
    if n < 1:
        raise ValueError("n must be at least 1")
    window = deque(maxlen=n)
    for item in iterable:
        window.append(item)
        if len(window) == n:
            yield tuple(window)


def unique(iterable, key=None):
    """Items in first-seen order, skipping repeats (compared by ``key(item)`` if given)."""
    seen = set()
    for item in iterable:
        k = key(item) if key is not None else item
        if k not in seen:
            seen.add(k)
            yield item


def flatten(nested):
    """Flatten lists and tuples nested to any depth; strings are kept whole."""
    for item in nested:
        if isinstance(item, (list, tuple)):
            yield from flatten(item)
        else:
            yield item
