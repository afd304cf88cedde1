"""The per-seed statistics of the "does experience help?" analysis against hand-derived values
(results/experience_helps/PLAN.md § Statistics)."""

from __future__ import annotations

import math

import pytest

from crl_bench.report.seed_tests import (bootstrap_diff, bootstrap_mean, curve_auc,
                                         permutation_test, sign_flip_test, sign_test)


def test_auc_is_the_trapezoid_over_the_evaluated_steps_divided_by_the_steps() -> None:
    # 5 * (0 + .5) / 2 + 5 * (.5 + .5) / 2 + 5 * (.5 + 1) / 2 + 5 * (1 + 1) / 2 = 12.5; / 20
    assert curve_auc([0, 5, 10, 15, 20], [0, 0.5, 0.5, 1, 1], 20) == pytest.approx(0.625)
    assert curve_auc([0, 20], [0.25, 0.25], 20) == pytest.approx(0.25)  # flat: its level
    assert curve_auc([0, 2, 20], [0, 1, 1], 20) == pytest.approx((1 + 18) / 20)  # uneven steps


def test_auc_refuses_a_curve_that_does_not_span_the_run() -> None:
    with pytest.raises(ValueError, match="from 0 to 20"):
        curve_auc([0, 5, 10, 15], [0, 0, 0, 0], 20)  # the last evaluation missing
    with pytest.raises(ValueError, match="from 0 to 20"):
        curve_auc([5, 20], [0, 0], 20)


def test_permutation_test_enumerated_by_hand() -> None:
    """a = [3, 4], b = [1, 2]; the C(4, 2) = 6 ways to label two of {3, 4, 1, 2} as a give
    mean(a) - mean(b) = 2 ({3,4}), -1 ({3,1}), 0 ({3,2}), 0 ({4,1}), 1 ({4,2}), -2 ({1,2}).
    Observed 2: one of six >= 2; two of six with |.| >= 2."""
    r = permutation_test([3, 4], [1, 2])
    assert (r.statistic, r.n) == (2.0, 6)
    assert r.p_greater == pytest.approx(1 / 6) and r.p_two_sided == pytest.approx(2 / 6)
    r = permutation_test([1, 2], [3, 4])  # the other direction: every labelling is >= -2
    assert r.p_greater == pytest.approx(1.0) and r.p_two_sided == pytest.approx(2 / 6)


def test_permutation_test_five_against_five_separated_is_one_in_252() -> None:
    r = permutation_test([0.6, 0.7, 0.8, 0.9, 1.0], [0.1, 0.2, 0.3, 0.4, 0.5])
    assert r.n == math.comb(10, 5) == 252
    assert r.p_greater == pytest.approx(1 / 252) and r.p_two_sided == pytest.approx(2 / 252)
    tied = permutation_test([0.5] * 5, [0.5] * 5)  # no difference: every labelling ties it
    assert tied.p_greater == 1.0 and tied.p_two_sided == 1.0


def test_sign_flip_test_enumerated_by_hand() -> None:
    """d = [1, 2, 3]: of the 8 sign patterns only (+,+,+) reaches mean 2 (and (-,-,-) -2)."""
    r = sign_flip_test([1, 2, 3])
    assert r.n == 8 and r.p_greater == pytest.approx(1 / 8) and r.p_two_sided == pytest.approx(2 / 8)
    # d = [1, -1]: patterns give means 0, 1, -1, 0; observed 0 -> 3 of 4 are >= 0; all |.| >= 0
    r = sign_flip_test([1, -1])
    assert r.p_greater == pytest.approx(3 / 4) and r.p_two_sided == 1.0
    assert sign_flip_test([0.1] * 5).p_greater == pytest.approx(1 / 32)  # the 5-seed floor


def test_sign_test_by_hand_and_against_scipy() -> None:
    r = sign_test([0.1, 0.2, 0.3, 0.1, 0.05])  # 5 of 5 positive: 1/32
    assert (r.statistic, r.n) == (5.0, 5)
    assert r.p_greater == pytest.approx(1 / 32) and r.p_two_sided == pytest.approx(2 / 32)
    r = sign_test([0.1, 0.2, 0.3, 0.1, -0.05, 0.0])  # the zero is dropped: 4 of 5 -> (5 + 1)/32
    assert (r.statistic, r.n) == (4.0, 5) and r.p_greater == pytest.approx(6 / 32)
    assert sign_test([0.0, 0.0]).p_greater == 1.0
    scipy_stats = pytest.importorskip("scipy.stats")
    for diffs in ([1, 1, 1, 1, -1], [1, -1, -1, -1, -1], [1, 1, -1, 2, -3, 4, 5], [-1] * 6):
        mine = sign_test(diffs)
        k, n = int(mine.statistic), mine.n
        assert mine.p_greater == pytest.approx(
            scipy_stats.binomtest(k, n, 0.5, alternative="greater").pvalue)
        assert mine.p_two_sided == pytest.approx(scipy_stats.binomtest(k, n, 0.5).pvalue)


def test_bootstrap_intervals_by_hand() -> None:
    # constant samples: every resample has the same mean, the interval is the point
    assert bootstrap_mean([0.25] * 5) == pytest.approx((0.25, 0.25, 0.25))
    assert bootstrap_diff([1.0] * 5, [0.0] * 5) == pytest.approx((1.0, 1.0, 1.0))
    # [0, 1]: a resample's mean is 0, 1/2 or 1 with probability 1/4, 1/2, 1/4, so over 10,000
    # resamples the 2.5th and 97.5th percentiles are 0 and 1
    assert bootstrap_mean([0.0, 1.0]) == pytest.approx((0.5, 0.0, 1.0))
    # one seed per agent: a resample is that seed, the interval is the difference itself
    assert bootstrap_diff([0.7], [0.2]) == pytest.approx((0.5, 0.5, 0.5))


def test_bootstrap_is_the_plans_fixed_draw() -> None:
    """numpy.random.default_rng(0), 10,000 resamples: the same call gives the same interval, and
    the interval lies inside the range a resampled mean can take."""
    a, b = [0.31, 0.42, 0.18, 0.55, 0.27], [0.12, 0.2, 0.15, 0.33, 0.09]
    first = bootstrap_diff(a, b)
    assert bootstrap_diff(a, b) == first and bootstrap_diff(a, b, seed=1) != first
    diff, low, high = first
    assert diff == pytest.approx(sum(a) / 5 - sum(b) / 5)
    assert min(a) - max(b) <= low < diff < high <= max(a) - min(b)
