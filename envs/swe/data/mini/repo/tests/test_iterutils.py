import pytest

from handykit.iterutils import chunked, flatten, unique, windowed


def test_chunked_exact_multiple():
    assert list(chunked(range(6), 3)) == [[0, 1, 2], [3, 4, 5]]


def test_chunked_empty_and_bad_size():
    assert list(chunked([], 3)) == []
    with pytest.raises(ValueError):
        list(chunked([1], 0))


def test_windowed():
    assert list(windowed("abcd", 2)) == [("a", "b"), ("b", "c"), ("c", "d")]
    assert list(windowed("ab", 3)) == []


def test_unique_keeps_first_seen_order():
    assert list(unique([3, 1, 3, 2, 1])) == [3, 1, 2]
    assert list(unique(["a", "A", "b"], key=str.lower)) == ["a", "b"]


def test_flatten_nested():
    assert list(flatten([1, [2, (3, [4])], "ab"])) == [1, 2, 3, 4, "ab"]
