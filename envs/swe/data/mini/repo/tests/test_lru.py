import pytest

from handykit.lru import LRUCache


def test_capacity_must_be_positive():
    with pytest.raises(ValueError):
        LRUCache(0)


def test_put_and_get():
    cache = LRUCache(2)
    cache.put("a", 1)
    assert cache.get("a") == 1
    assert cache.get("zzz", "default") == "default"
    assert (cache.hits, cache.misses) == (1, 1)


def test_oldest_insert_is_evicted():
    cache = LRUCache(2)
    for key in "abc":
        cache.put(key, key.upper())
    assert "a" not in cache
    assert cache.keys() == ["b", "c"]
    assert cache.evictions == 1


def test_updating_a_key_below_capacity():
    cache = LRUCache(3)
    cache.put("a", 1)
    cache.put("a", 2)
    assert cache.get("a") == 2
    assert len(cache) == 1


def test_clear():
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.clear()
    assert len(cache) == 0
