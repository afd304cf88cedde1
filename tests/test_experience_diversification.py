"""diversified_order: score = -rank - lam*ln(1+times) - 1[recent], random demotion of a recent
top-1. Expected orders below are worked out by hand in the comments."""

from __future__ import annotations

import math
import random

import pytest

from crl_bench.experience.manager import RetrievalConfig, diversified_order

NOW = 10_000.0


class FixedDraws(random.Random):
    """A random.Random whose .random() returns the given values in turn (records how many)."""

    def __init__(self, *values: float) -> None:
        super().__init__(0)
        self.values = list(values)
        self.drawn = 0

    def random(self) -> float:
        self.drawn += 1
        return self.values.pop(0)


def cfg(**kw) -> RetrievalConfig:
    return RetrievalConfig(**kw)


CANDS = [(10, 0.9), (20, 0.8), (30, 0.7)]  # ranks 0, 1, 2


def test_no_usage_keeps_similarity_order():
    assert diversified_order(CANDS, {}, {}, NOW, cfg(), FixedDraws()) == [10, 20, 30]
    # input order does not matter, similarity does
    assert diversified_order(CANDS[::-1], {}, {}, NOW, cfg(), FixedDraws()) == [10, 20, 30]


def test_count_penalty_by_hand():
    # lam=0.4. id 10 retrieved 10x: score = -0 - 0.4*ln(11) = -0.959 > -1 (id 20) -> stays first
    assert 0.4 * math.log(11) == pytest.approx(0.959, abs=1e-3)
    assert diversified_order(CANDS, {10: 10}, {}, NOW, cfg(), FixedDraws()) == [10, 20, 30]
    # 12x: 0.4*ln(13) = 1.026 -> score -1.026 < -1 -> id 20 first
    assert diversified_order(CANDS, {10: 12}, {}, NOW, cfg(), FixedDraws()) == [20, 10, 30]
    # 200x: 0.4*ln(201) = 2.122 -> -2.122 < -2 (id 30) -> last
    assert diversified_order(CANDS, {10: 200}, {}, NOW, cfg(), FixedDraws()) == [20, 30, 10]


def test_rank_of_often_retrieved_entry_drops_as_count_grows():
    positions = []
    for count in [0, 5, 11, 12, 50, 147, 148, 1000]:
        order = diversified_order(CANDS, {10: count}, {}, NOW, cfg(), FixedDraws())
        positions.append(order.index(10))
    assert positions == sorted(positions)          # never climbs back
    assert positions[0] == 0 and positions[-1] == 2
    # boundaries by hand: behind id 20 once 0.4*ln(1+n) > 1, i.e. n > e^2.5 - 1 = 11.2 (n >= 12);
    # behind id 30 once 0.4*ln(1+n) > 2, i.e. n > e^5 - 1 = 147.4 (n >= 148)
    assert positions == [0, 0, 0, 1, 1, 1, 2, 2]


def test_recent_penalty_and_random_demotion_by_hand():
    last = {10: NOW - 10.0}  # retrieved 10 s ago (< 300 s): score -0 - 0 - 1 = -1, ties id 20
    # tie (-1 vs -1) keeps similarity order: 10 first, and it is recent -> one draw.
    rng = FixedDraws(0.7)    # 0.7 >= p=0.5: no demotion
    assert diversified_order(CANDS, {}, last, NOW, cfg(), rng) == [10, 20, 30]
    assert rng.drawn == 1
    rng = FixedDraws(0.3)    # 0.3 < 0.5: the recent top-1 goes to the end
    assert diversified_order(CANDS, {}, last, NOW, cfg(), rng) == [20, 30, 10]
    # with one use as well: -0.4*ln 2 - 1 = -1.277 < -1 -> 20 first; 20 is not recent: no draw
    rng = FixedDraws()
    assert diversified_order(CANDS, {10: 1}, last, NOW, cfg(), rng) == [20, 10, 30]
    assert rng.drawn == 0


def test_old_retrieval_is_not_recent():
    last = {10: NOW - 301.0}
    rng = FixedDraws()
    assert diversified_order(CANDS, {}, last, NOW, cfg(), rng) == [10, 20, 30]
    assert rng.drawn == 0
    # with a longer window it is recent again: -1 ties id 20 (similarity order keeps 10 first),
    # then the draw decides
    rng = FixedDraws(0.9)
    assert diversified_order(CANDS, {}, last, NOW, cfg(recent_s=400.0), rng) == [10, 20, 30]
    assert rng.drawn == 1
    assert diversified_order(CANDS, {}, last, NOW, cfg(recent_s=400.0), FixedDraws(0.1)) == [
        20, 30, 10]


def test_switches():
    last = {10: NOW}
    assert diversified_order(CANDS, {10: 10**6}, last, NOW, cfg(diversify=False),
                             FixedDraws()) == [10, 20, 30]
    assert diversified_order(CANDS, {10: 10**6}, {}, NOW, cfg(lam=0.0), FixedDraws()) == [
        10, 20, 30]
    assert diversified_order(CANDS, {}, last, NOW, cfg(drop_recent_top1_p=0.0),
                             FixedDraws(0.0)) == [10, 20, 30]
    assert diversified_order(CANDS, {}, last, NOW, cfg(drop_recent_top1_p=1.0),
                             FixedDraws(0.999)) == [20, 30, 10]
    assert diversified_order([], {}, {}, NOW, cfg(), FixedDraws()) == []
    # a single candidate is never demoted (nothing to demote it behind)
    assert diversified_order([(7, 0.5)], {}, {7: NOW}, NOW, cfg(), FixedDraws()) == [7]


def test_repeated_retrieval_spreads_over_candidates():
    """16 back-to-back retrievals for the same query: plain top-1 gives one entry 16 times;
    diversified, the counts grow and the recent penalty kicks in, so several entries are used."""
    cands = [(i, 1.0 - 0.01 * i) for i in range(16)]
    rng = random.Random(0)
    times: dict[int, int] = {}
    last: dict[int, float] = {}
    picked = []
    for t in range(16):
        top = diversified_order(cands, times, last, NOW + t, cfg(), rng)[0]
        picked.append(top)
        times[top] = times.get(top, 0) + 1
        last[top] = NOW + t
    assert len(set(picked)) >= 3
    assert picked.count(0) < 16


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="probability"):
        RetrievalConfig(drop_recent_top1_p=1.5)
    with pytest.raises(ValueError, match="oversample"):
        RetrievalConfig(oversample=0)
    with pytest.raises(ValueError, match="k must be"):
        RetrievalConfig(k=0)
