"""Per-seed comparisons of two agents: the learning-curve area, bootstrap intervals and exact
tests over seeds (the seed is the unit, never the episode).

Pure functions on lists of per-seed values, used by ``results/experience_helps/PLAN.md``'s
analysis (``experiments/experience_records.py``):

* :func:`curve_auc` — trapezoid area under a curve over its evaluated steps / total steps;
* :func:`bootstrap_mean` / :func:`bootstrap_diff` — percentile bootstrap over seeds;
* :func:`permutation_test` — two-sample test over every assignment of the pooled values;
* :func:`sign_flip_test` — paired test over every sign pattern of the per-seed differences;
* :func:`sign_test` — exact binomial sign test on the per-seed differences.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Sequence

__all__ = ["TestResult", "curve_auc", "bootstrap_mean", "bootstrap_diff", "permutation_test",
           "sign_flip_test", "sign_test"]

TIE = 1e-12
"""Statistics within this of the observed one count as at least as extreme (float round-off)."""


@dataclass(frozen=True)
class TestResult:
    """An exact test's observed statistic and p-values.

    ``p_greater``: one-sided, the share of the reference set with a statistic >= the observed one
    (the alternative: the first sample is larger); ``p_two_sided``: |statistic| >= |observed| for
    the resampling tests, twice the smaller tail (capped at 1) for the sign test; ``n``: the size
    of the reference set (assignments or sign patterns; for the sign test, the non-zero
    differences)."""

    statistic: float
    p_greater: float
    p_two_sided: float
    n: int


def curve_auc(steps: Sequence[int], values: Sequence[float], total_steps: int) -> float:
    """Trapezoid area under ``values`` over the evaluated ``steps``, divided by ``total_steps``
    (a number in [0, 1] for success rates). The steps must run from 0 to ``total_steps``,
    increasing: a curve with a missing end is not given an area."""
    if len(steps) != len(values) or len(steps) < 2:
        raise ValueError(f"need >= 2 evaluated steps with one value each, got steps={list(steps)}")
    if list(steps) != sorted(set(steps)) or steps[0] != 0 or steps[-1] != total_steps:
        raise ValueError(f"evaluated steps {list(steps)} must increase from 0 to {total_steps}: "
                         "a run without its step-0 or last evaluation has no area (report it)")
    area = sum((s1 - s0) * (v0 + v1) / 2
               for s0, s1, v0, v1 in zip(steps, steps[1:], values, values[1:]))
    return area / total_steps


def _percentiles(stats, confidence: float) -> tuple[float, float]:
    import numpy as np

    tail = 100 * (1 - confidence) / 2
    low, high = np.percentile(stats, [tail, 100 - tail])
    return float(low), float(high)


def bootstrap_mean(values: Sequence[float], n_resamples: int = 10_000, seed: int = 0,
                   confidence: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high): the percentile bootstrap interval of the mean over seeds, resampling
    the values with replacement (``numpy.random.default_rng(seed).integers``, one
    ``(n_resamples, n)`` draw; ``numpy.percentile``'s linear interpolation)."""
    import numpy as np

    x = np.asarray(values, dtype=float)
    if x.size == 0:
        raise ValueError("no values to bootstrap")
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(n_resamples, x.size))].mean(axis=1)
    return (float(x.mean()), *_percentiles(means, confidence))


def bootstrap_diff(a: Sequence[float], b: Sequence[float], n_resamples: int = 10_000,
                   seed: int = 0, confidence: float = 0.95) -> tuple[float, float, float]:
    """(mean(a) - mean(b), low, high): percentile bootstrap interval of the difference of means,
    resampling seeds with replacement within each sample (one ``default_rng(seed)``: the
    ``(n_resamples, len(a))`` indices of ``a`` drawn first, then those of ``b``)."""
    import numpy as np

    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if x.size == 0 or y.size == 0:
        raise ValueError(f"both samples need values, got {x.size} and {y.size}")
    rng = np.random.default_rng(seed)
    ia = rng.integers(0, x.size, size=(n_resamples, x.size))
    ib = rng.integers(0, y.size, size=(n_resamples, y.size))
    diffs = x[ia].mean(axis=1) - y[ib].mean(axis=1)
    return (float(x.mean() - y.mean()), *_percentiles(diffs, confidence))


def permutation_test(a: Sequence[float], b: Sequence[float]) -> TestResult:
    """Exact two-sample permutation test on mean(a) - mean(b): every way of choosing which
    ``len(a)`` of the pooled values are labelled ``a`` (C(10, 5) = 252 for 5 + 5 seeds), the
    observed labelling among them."""
    pooled = [float(v) for v in a] + [float(v) for v in b]
    na, nb = len(a), len(b)
    if na == 0 or nb == 0:
        raise ValueError(f"both samples need values, got {na} and {nb}")
    total = sum(pooled)
    observed = sum(pooled[:na]) / na - sum(pooled[na:]) / nb
    stats = []
    for chosen in itertools.combinations(range(na + nb), na):
        sa = sum(pooled[i] for i in chosen)
        stats.append(sa / na - (total - sa) / nb)
    return _tail_shares(stats, observed)


def sign_flip_test(diffs: Sequence[float]) -> TestResult:
    """Exact paired test on the mean of per-seed differences: all 2^n sign patterns (the null:
    each difference is as likely to have either sign). One-sided p >= 1/2^n."""
    d = [float(v) for v in diffs]
    if not d:
        raise ValueError("no differences to test")
    observed = sum(d) / len(d)
    stats = [sum(s * v for s, v in zip(signs, d)) / len(d)
             for signs in itertools.product((1, -1), repeat=len(d))]
    return _tail_shares(stats, observed)


def _tail_shares(stats: list[float], observed: float) -> TestResult:
    n = len(stats)
    greater = sum(s >= observed - TIE for s in stats) / n
    two = sum(abs(s) >= abs(observed) - TIE for s in stats) / n
    return TestResult(observed, greater, two, n)


def sign_test(diffs: Sequence[float]) -> TestResult:
    """Exact binomial sign test: ``statistic`` = the number of positive differences among the
    non-zero ones (zeros dropped); ``p_greater`` = P(X >= k), X ~ Binomial(n, 1/2);
    ``p_two_sided`` = min(1, 2 min(P(X >= k), P(X <= k))) (scipy's ``binomtest`` for p = 1/2)."""
    nonzero = [float(v) for v in diffs if abs(float(v)) > TIE]
    n, k = len(nonzero), sum(v > 0 for v in nonzero)
    if n == 0:
        return TestResult(0.0, 1.0, 1.0, 0)
    upper = sum(math.comb(n, i) for i in range(k, n + 1)) / 2 ** n
    lower = sum(math.comb(n, i) for i in range(0, k + 1)) / 2 ** n
    return TestResult(float(k), upper, min(1.0, 2 * min(upper, lower)), n)
