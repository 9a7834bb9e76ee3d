"""The race's statistics: Welch's t-test one-sided each way, the verdict it gives, and the power it has.

A race runs each configuration over a few seeds and compares its times to the target with those of the
configuration it builds on. The rule is modded-nanogpt's: a record must beat the base at p < 0.01, one-sided.
Welch's test does not assume the two spreads are equal (a bigger batch may vary more from seed to seed than a
small one). The t-distribution comes from scipy.stats, not from code of our own.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

WIN, LOSS, NOISE = "win", "loss", "noise"


@dataclass(frozen=True)
class Summary:
    """Values over seeds: their mean, standard deviation (n - 1), range and count."""

    mean: float
    sd: float
    min: float
    max: float
    n: int

    @property
    def rel_sd(self) -> float:
        return self.sd / self.mean if self.mean else 0.0


def summary(values: Sequence[float]) -> Summary | None:
    if not values:
        return None
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return Summary(statistics.fmean(values), sd, min(values), max(values), len(values))


@dataclass(frozen=True)
class Welch:
    """Welch's t-test of a against b: the p-value of "a is smaller" and of "a is larger", and the change that
    would be needed to reach alpha with these spreads (relative to b's mean)."""

    p_less: float
    p_greater: float
    df: float | None  # Welch-Satterthwaite degrees of freedom; None when both spreads are zero
    detectable: float | None  # the smallest relative change that could reach alpha, one-sided, at these spreads


def _se_df(a: Sequence[float], b: Sequence[float]) -> tuple[float, float | None]:
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    se = math.sqrt(va + vb)
    if se == 0:
        return 0.0, None
    df = (va + vb) ** 2 / ((va**2 / (len(a) - 1) if va else 0.0) + (vb**2 / (len(b) - 1) if vb else 0.0))
    return se, df


def welch(a: Sequence[float], b: Sequence[float], alpha: float) -> Welch:
    """Both one-sided p-values of Welch's test (scipy.stats.ttest_ind, equal_var=False); at least 2 values each.

    Two samples with no spread at all carry no doubt: p is 0 on the side their means differ and 1 on the other
    (scipy would answer NaN).
    """
    from scipy import stats  # a dependency, imported where it is used: most commands never need it

    if len(a) < 2 or len(b) < 2:
        raise ValueError("Welch's test needs at least 2 values on each side")
    se, df = _se_df(a, b)
    mean_b = statistics.fmean(b)
    if df is None:
        diff = statistics.fmean(a) - mean_b
        return Welch(0.0 if diff < 0 else 1.0, 0.0 if diff > 0 else 1.0, None, 0.0)
    less = float(stats.ttest_ind(a, b, equal_var=False, alternative="less").pvalue)
    greater = float(stats.ttest_ind(a, b, equal_var=False, alternative="greater").pvalue)
    detectable = float(stats.t.ppf(1 - alpha, df)) * se / mean_b if mean_b else None
    return Welch(less, greater, df, detectable)


def verdict(a: Sequence[float], b: Sequence[float], alpha: float) -> tuple[str, Welch]:
    """Times a against the base's times b: win if a is smaller at p < alpha, loss if larger, else noise."""
    w = welch(a, b, alpha)
    if w.p_less < alpha:
        return WIN, w
    if w.p_greater < alpha:
        return LOSS, w
    return NOISE, w


def seeds_for(sd_a: float, sd_b: float, change: float, alpha: float, most: int = 64) -> int | None:
    """Seeds per side that would let a relative change of `change` reach alpha, one-sided, with Welch's degrees of
    freedom, when the two sides spread by sd_a and sd_b (standard deviations relative to the base's mean, as
    Welch.detectable is); None if even `most` would not."""
    from scipy import stats

    var = sd_a**2 + sd_b**2
    if var <= 0:
        return 2
    for n in range(2, most + 1):
        df = var**2 / ((sd_a**4 + sd_b**4) / (n - 1))
        if float(stats.t.ppf(1 - alpha, df)) * math.sqrt(var / n) <= change:
            return n
    return None
