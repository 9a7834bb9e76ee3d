"""The sequential rule: after each seed from the third, keep, revert or race another seed.

Per seed, d = log(the candidate's time to the target) - log(its base's), with a censored run's bounds (stats.paired:
`low` and `high` per seed, equal where both runs reached). Each look reads one-sided t-tests on the mean of d:

- keep (why "win"): faster by more than keep_floor, on the upper bounds, at p < false_keep / looks;
- revert: the gain falls short of min_gain, on the lower bounds, at p < false_revert / looks; why "loss" when its
  estimate is slower by at least that much (a speedup below 1 / (1 + min_gain)), else "noise": a name for the
  revert, not a second decision.

Neither: another seed, or undecided when the seeds or the budget run out. Each error rate is split evenly over the
looks (Bonferroni), so whatever look stops the race, a candidate no more than keep_floor faster than its base is
kept with probability at most false_keep, and one at least min_gain faster is reverted at most false_revert of the
time (under the t-test's own model: independent, normal log ratios). The floor is there because the model misses one
thing: every seed of a judgement runs in the same two worker processes, so a bias between them (their memory
layout, where the scheduler put them) is the same in every seed, and the seeds' spread cannot see it
(docs/judge.md#the-rule). The interval is the one the keep test reads, at 1 - 2 false_keep / looks: its lower end
above 1 + keep_floor is a keep.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from speedladder.config.judge import FIRST_LOOK, JudgeConfig
from speedladder.measure import stats

KEEP, REVERT, UNDECIDED = "keep", "revert", "undecided"


@dataclass(frozen=True)
class Look:
    """The paired test read after `seeds` seeds, and what the rule made of it (decision None: race another)."""

    seeds: int
    decision: str | None
    why: str | None  # "win", "loss" or "noise" when decided
    p_win: float  # faster than the base by more than keep_floor (one-sided, on the censoring-safe bounds)
    p_loss: float  # slower
    p_short: float  # the gain falls short of min_gain
    level_keep: float  # false_keep / looks: what p_win is held to
    level_revert: float  # false_revert / looks: what p_short is held to
    speedup: float | None  # the base's time over the candidate's, the geometric mean over seeds (a bound: `bound`)
    bound: str | None  # None: exact; "at least" or "at most" where a censored run bounds it
    interval: tuple[float | None, float | None]  # the speedup's, at `confidence`; None: unbounded that side
    confidence: float  # 1 - 2 level_keep


def _side(values: Sequence[float], quantile: float) -> float | None:
    """mean + t_quantile x standard error of finite values; None when one is infinite or there are fewer than 2."""
    from scipy import stats as sp

    if len(values) < 2 or not all(math.isfinite(v) for v in values):
        return None
    se = statistics.stdev(values) / math.sqrt(len(values))
    return statistics.fmean(values) + float(sp.t.ppf(quantile, len(values) - 1)) * se


def look(low: Sequence[float], high: Sequence[float], cfg: JudgeConfig) -> Look:
    """The rule at one look, from the per-seed bounds of the log time ratio (candidate over base)."""
    n = len(low)
    level_keep, level_revert = cfg.false_keep / cfg.looks, cfg.false_revert / cfg.looks
    p_win = stats.one_sided([hi + math.log1p(cfg.keep_floor) for hi in high], "less")
    p_loss = stats.one_sided(low, "greater")
    p_short = stats.one_sided([lo + math.log1p(cfg.min_gain) for lo in low], "greater")
    exact = all(lo == hi for lo, hi in zip(low, high))
    speedup: float | None = None
    bound: str | None = None
    if n and exact and all(math.isfinite(v) for v in low):
        speedup = math.exp(-statistics.fmean(low))
    elif n and all(math.isfinite(v) for v in high):
        speedup, bound = math.exp(-statistics.fmean(high)), "at least"  # the candidate's time at least its clock
    elif n and all(math.isfinite(v) for v in low):
        speedup, bound = math.exp(-statistics.fmean(low)), "at most"
    slow_end = _side(high, 1 - level_keep)  # the largest mean d the keep test allows
    fast_end = _side(low, level_keep)
    interval = (math.exp(-slow_end) if slow_end is not None else None,
                math.exp(-fast_end) if fast_end is not None else None)
    decision = why = None
    if n >= FIRST_LOOK:
        if p_win < level_keep:
            decision, why = KEEP, "win"
        elif p_short < level_revert:
            slower = speedup is not None and speedup < 1 / (1 + cfg.min_gain)
            decision, why = REVERT, "loss" if slower else "noise"
    return Look(n, decision, why, p_win, p_loss, p_short, level_keep, level_revert, speedup, bound, interval,
                1 - 2 * level_keep)
