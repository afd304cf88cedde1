"""Means with Student-t confidence intervals over seeds.

The paper reports single numbers; we report mean ± half-width of the two-sided t-interval over
independent seeds, with n beside it. Three seeds give a wide interval — that is the point: it
says how much a table cell can be trusted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

__all__ = ["Estimate", "mean_ci", "diff_ci", "ratio_of_means"]


@dataclass(frozen=True)
class Estimate:
    """A mean over seeds with its confidence interval.

    Attributes:
        mean: sample mean (NaN when ``n == 0``).
        half_width: half-width of the ``confidence`` t-interval; NaN when ``n < 2`` (one seed
            gives no spread) or for point estimates such as a ratio of means.
        n: number of values (seeds) behind the mean.
        values: the values themselves, in input order (kept for CSV/JSON and for re-analysis).
        confidence: the interval's coverage, e.g. 0.95.
        kind: ``"mean"``; ``"diff"`` (difference of two independent means, Welch interval);
            ``"ratio"`` (ratio of two means, no interval).
    """

    mean: float
    half_width: float
    n: int
    values: tuple[float, ...] = ()
    confidence: float = 0.95
    kind: str = "mean"

    @property
    def low(self) -> float:
        return self.mean - self.half_width

    @property
    def high(self) -> float:
        return self.mean + self.half_width

    @property
    def has_ci(self) -> bool:
        return not math.isnan(self.half_width)


def _clean(values: Iterable[float]) -> list[float]:
    out = [float(v) for v in values]
    if any(math.isnan(v) for v in out):
        raise ValueError("NaN among the values of a table cell; leave runs without a value out "
                         "and report them as missing instead")
    return out


def _check_confidence(confidence: float) -> None:
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), e.g. 0.95; got {confidence}")


def mean_ci(values: Sequence[float], confidence: float = 0.95) -> Estimate:
    """Mean and two-sided Student-t interval: ``mean ± t_{(1+c)/2, n-1} * s / sqrt(n)``.

    ``s`` is the sample standard deviation (n - 1 in the denominator). Equal to
    ``scipy.stats.t.interval(confidence, n - 1, loc=mean, scale=scipy.stats.sem(values))``.
    All values equal -> half-width 0. ``n < 2`` -> half-width NaN (no interval).
    """
    _check_confidence(confidence)
    xs = _clean(values)
    n = len(xs)
    if n == 0:
        return Estimate(math.nan, math.nan, 0, (), confidence)
    mean = sum(xs) / n
    if n == 1:
        return Estimate(mean, math.nan, 1, tuple(xs), confidence)
    from scipy import stats

    var = sum((x - mean) ** 2 for x in xs) / (n - 1)
    t = float(stats.t.ppf((1 + confidence) / 2, n - 1))
    return Estimate(mean, t * math.sqrt(var / n), n, tuple(xs), confidence)


def diff_ci(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> Estimate:
    """Difference of means ``mean(a) - mean(b)`` of two independent samples, Welch t-interval.

    Used for "gain over the baseline": the agent's seeds and the baseline's seeds are separate
    runs, so the interval must not assume pairing or equal variances. Degrees of freedom by
    Welch–Satterthwaite. Either side with fewer than 2 values -> half-width NaN.
    ``values`` holds ``a`` then ``b``.
    """
    _check_confidence(confidence)
    xa, xb = _clean(a), _clean(b)
    na, nb = len(xa), len(xb)
    if na == 0 or nb == 0:
        return Estimate(math.nan, math.nan, min(na, nb), tuple(xa + xb), confidence, "diff")
    ma, mb = sum(xa) / na, sum(xb) / nb
    if na < 2 or nb < 2:
        return Estimate(ma - mb, math.nan, min(na, nb), tuple(xa + xb), confidence, "diff")
    from scipy import stats

    va = sum((x - ma) ** 2 for x in xa) / (na - 1) / na
    vb = sum((x - mb) ** 2 for x in xb) / (nb - 1) / nb
    se = math.sqrt(va + vb)
    if se == 0:
        return Estimate(ma - mb, 0.0, min(na, nb), tuple(xa + xb), confidence, "diff")
    # Welch-Satterthwaite in terms of the shares of the variance (each in [0, 1]): the textbook
    # form squares tiny variances and underflows to 0 / 0
    wa, wb = va / (va + vb), vb / (va + vb)
    df = 1.0 / (wa ** 2 / (na - 1) + wb ** 2 / (nb - 1))
    t = float(stats.t.ppf((1 + confidence) / 2, df))
    return Estimate(ma - mb, t * se, min(na, nb), tuple(xa + xb), confidence, "diff")


def ratio_of_means(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> Estimate:
    """``mean(a) / mean(b)`` as a point estimate (no interval; NaN if ``b``'s mean is 0)."""
    xa, xb = _clean(a), _clean(b)
    if not xa or not xb:
        return Estimate(math.nan, math.nan, min(len(xa), len(xb)), (), confidence, "ratio")
    mb = sum(xb) / len(xb)
    ratio = (sum(xa) / len(xa)) / mb if mb != 0 else math.nan
    return Estimate(ratio, math.nan, min(len(xa), len(xb)), tuple(xa + xb), confidence, "ratio")
