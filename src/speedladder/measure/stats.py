"""The race's statistics: a paired test by seed on log times that knows about censored runs, its power at 80%,
and modded-nanogpt's own criterion (a one-sample t-test of the val loss at a fixed budget against the target).

A race trains a configuration and the one it builds on from the same seeds: the same initial weights and the same
batch order. So their times are compared seed by seed: per seed, d = log(time) - log(base's time), and the test is
a one-sided t-test that the mean of d is below 0 (a win) or above 0 (a loss). Pairing removes the seed-to-seed
spread both sides share; logs make a 2x and a 0.5x change the same size, and the test's ratio is the geometric mean
of the per-seed ratios. Wilcoxon's signed-rank test is not used: with n seeds its smallest one-sided p-value is
2^-n, so it cannot reach p < 0.01 below 7 seeds. The t-distribution comes from scipy.stats.

**Censoring.** A run that did not reach the target was stopped at some clock c (its cap, a divergence, an error):
its time to the target is at least c. Each side of the test is computed on the bound that works against it:

- the win test on the largest d the data allow: a base that stopped counts as its clock c (its time was at least
  that, so its speed is overstated, and the rung's gain understated); a rung that stopped makes a win impossible
  (its d has no upper bound);
- the loss test on the smallest d the data allow: a rung that stopped counts as its clock c (its slowness is
  understated); a base that stopped makes a loss impossible.

Each bound is on the safe side of the true d in every seed, so each one-sided test is at most as likely to reject
as it would be on the true times: a censored base gives no free win, and a censored rung no free loss.

**Power.** For n pairs whose log ratios spread by s (their standard deviation), the change the test finds with
80% probability at alpha is found from the noncentral t-distribution (scipy.stats.nct): the noncentrality
delta * sqrt(n) / s at which P(t > t_crit) = 0.8. That is what the notes and `--seeds` advice say.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

WIN, LOSS, NOISE = "win", "loss", "noise"
POWER = 0.8  # the power the notes and the --seeds advice are stated at


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


# -- censored times --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Time:
    """A time to the target: `seconds` exactly, or, when `censored`, at least `seconds` (the run stopped first)."""

    seconds: float
    censored: bool = False

    @property
    def low(self) -> float:
        return self.seconds

    @property
    def high(self) -> float:
        return math.inf if self.censored else self.seconds


def _log(x: float) -> float:
    return math.log(x) if x > 0 else -math.inf


def log_ratio_bounds(a: Time, b: Time) -> tuple[float, float]:
    """The smallest and the largest log(a) - log(b) the two times allow."""
    lo = _log(a.low) - (math.inf if b.censored else _log(b.high))
    hi = (math.inf if a.censored else _log(a.high)) - _log(b.low)
    if math.isnan(lo):
        lo = -math.inf
    if math.isnan(hi):
        hi = math.inf
    return lo, hi


def one_sided(d: Sequence[float], side: str) -> float:
    """p of a one-sample t-test that the mean of d is below 0 (side "less") or above 0 ("greater"): what
    scipy.stats.ttest_1samp(d, 0, alternative=side) gives, from the t-distribution directly (a race's judge runs it
    for every configuration, and the tests thousands of times).

    A value with no finite bound makes the test impossible (p = 1): a censored rung is never a win, a censored base
    never gives a loss. Values with no spread at all carry no doubt: p is 0 on the side their mean lies and 1 on
    the other (scipy would answer NaN). Fewer than 2 values: no test (p = 1).
    """
    from scipy import stats  # a dependency, imported where it is used: most commands never need it

    if len(d) < 2 or not all(math.isfinite(v) for v in d):
        return 1.0
    mean, sd = statistics.fmean(d), statistics.stdev(d)
    if sd == 0:
        beyond = mean < 0 if side == "less" else mean > 0
        return 0.0 if beyond else 1.0
    t = mean / (sd / math.sqrt(len(d)))
    return float(stats.t.cdf(t, len(d) - 1) if side == "less" else stats.t.sf(t, len(d) - 1))


@dataclass(frozen=True)
class Paired:
    """A paired one-sided test of a's times against b's, seed by seed, on log times, censoring-aware.

    `low` and `high` are the per-seed bounds of log(a) - log(b); they are equal where both runs reached. `ratio` is
    exp(mean) of the exact log ratios when every pair is exact; else of the bound that is finite (`bound` says
    which: "at least" a's time over b's, or "at most").
    """

    n: int
    low: tuple[float, ...]
    high: tuple[float, ...]
    p_less: float  # a is faster: on the upper bounds
    p_greater: float  # a is slower: on the lower bounds
    ratio: float | None  # a's time over b's: the geometric mean of the per-seed ratios
    bound: str | None  # None (exact), "at least" or "at most"
    sd: float | None  # the standard deviation of the exact log ratios (n - 1), when at least 2 are exact
    detectable: float | None  # the relative change found with 80% power at alpha, at that spread

    @property
    def exact(self) -> bool:
        return self.bound is None and self.ratio is not None


def paired(a: Sequence[Time], b: Sequence[Time], alpha: float, power: float = POWER) -> Paired:
    """The paired test of a against b (the same seeds in the same order); never raises, whatever the runs."""
    if len(a) != len(b):
        raise ValueError("a paired test needs one time a side for every seed")
    bounds = [log_ratio_bounds(x, y) for x, y in zip(a, b)]
    low = tuple(lo for lo, _ in bounds)
    high = tuple(hi for _, hi in bounds)
    p_less, p_greater = one_sided(high, "less"), one_sided(low, "greater")
    exact = [lo for lo, hi in bounds if lo == hi and math.isfinite(lo)]
    sd = statistics.stdev(exact) if len(exact) > 1 else None
    ratio: float | None = None
    bound: str | None = None
    if bounds and len(exact) == len(bounds):
        ratio = math.exp(statistics.fmean(exact))
    elif bounds and all(math.isfinite(v) for v in low):
        ratio, bound = math.exp(statistics.fmean(low)), "at least"
    elif bounds and all(math.isfinite(v) for v in high):
        ratio, bound = math.exp(statistics.fmean(high)), "at most"
    detect = detectable(sd, len(bounds), alpha, power) if sd is not None else None
    return Paired(len(bounds), low, high, p_less, p_greater, ratio, bound, sd, detect)


def verdict_of(p: Paired, alpha: float) -> str:
    """win if a is faster at p < alpha, loss if slower, else noise (a loss is tested first: it needs no reach)."""
    if p.p_greater < alpha:
        return LOSS
    if p.p_less < alpha:
        return WIN
    return NOISE


# -- power -----------------------------------------------------------------------------------------

def power_of(change: float, sd: float, n: int, alpha: float) -> float:
    """The probability that the paired one-sided test finds a true change of `change` (a relative change in time:
    0.25 is 1.25x or 1/1.25x) at alpha, with n pairs whose log ratios spread by sd (scipy.stats.nct)."""
    from scipy import stats

    if n < 2:
        return 0.0
    if sd <= 0:
        return 1.0
    crit = float(stats.t.ppf(1 - alpha, n - 1))
    return float(stats.nct.sf(crit, n - 1, math.log1p(change) * math.sqrt(n) / sd))


@functools.lru_cache(maxsize=256)
def _noncentrality(n: int, alpha: float, power: float) -> float:
    """The noncentrality at which the one-sided t-test of n pairs rejects at alpha with probability `power`."""
    from scipy import optimize, stats

    crit = float(stats.t.ppf(1 - alpha, n - 1))
    return float(optimize.brentq(lambda k: float(stats.nct.sf(crit, n - 1, k)) - power, 1e-6, 1e4))


def detectable(sd: float, n: int, alpha: float, power: float = POWER) -> float | None:
    """The relative change in time found with probability `power` at alpha by n pairs spread by sd; None for
    fewer than 2 pairs."""
    if n < 2:
        return None
    if sd <= 0:
        return 0.0
    return math.expm1(_noncentrality(n, alpha, power) * sd / math.sqrt(n))


def seeds_for(sd: float, change: float, alpha: float, power: float = POWER, most: int = 64) -> int | None:
    """The fewest seeds whose paired test finds a change of `change` with probability `power` at alpha, when the
    per-seed log ratios spread by sd; None if even `most` would not."""
    for n in range(2, most + 1):
        d = detectable(sd, n, alpha, power)
        if d is not None and d <= change:
            return n
    return None


# -- modded-nanogpt's criterion --------------------------------------------------------------------

def below(values: Sequence[float], target: float) -> float | None:
    """One-sided p of a one-sample t-test that the mean of `values` is below `target` (scipy.stats.ttest_1samp, as
    modded-nanogpt judges a record's final val losses against 3.28); None for fewer than 2 values."""
    from scipy import stats

    if len(values) < 2:
        return None
    if statistics.pstdev(values) == 0:
        return 0.0 if statistics.fmean(values) < target else 1.0
    return float(stats.ttest_1samp(values, target, alternative="less").pvalue)


# -- unpaired: races compared across runs whose seeds differ ---------------------------------------

@dataclass(frozen=True)
class Welch:
    """Welch's t-test of a against b: the p-value of "a is smaller" and of "a is larger"."""

    p_less: float
    p_greater: float
    df: float | None  # Welch-Satterthwaite degrees of freedom; None when both spreads are zero


def welch(a: Sequence[float], b: Sequence[float]) -> Welch:
    """Both one-sided p-values of Welch's test (scipy.stats.ttest_ind, equal_var=False): for samples that share no
    seed, so cannot be paired. Fewer than 2 values a side: no test (p = 1 both ways)."""
    from scipy import stats

    if len(a) < 2 or len(b) < 2:
        return Welch(1.0, 1.0, None)
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    if va + vb == 0:
        diff = statistics.fmean(a) - statistics.fmean(b)
        return Welch(0.0 if diff < 0 else 1.0, 0.0 if diff > 0 else 1.0, None)
    df = (va + vb) ** 2 / ((va**2 / (len(a) - 1) if va else 0.0) + (vb**2 / (len(b) - 1) if vb else 0.0))
    less = float(stats.ttest_ind(a, b, equal_var=False, alternative="less").pvalue)
    greater = float(stats.ttest_ind(a, b, equal_var=False, alternative="greater").pvalue)
    return Welch(less, greater, df)
