"""The sequential rule on synthetic races: the false-keep rate it states, the wins it keeps, the censored runs it
never keeps (judge/rule.py; docs/judge.md#the-rule)."""

from __future__ import annotations

import math
import random

import pytest

from speedladder.config.judge import FIRST_LOOK, JudgeConfig
from speedladder.errors import UsageError
from speedladder.judge import rule

CFG = JudgeConfig()


def race(rng: random.Random, speedup: float, spread: float, position: float = 0.0,
         cfg: JudgeConfig = CFG, bias: float = 0.0) -> rule.Look:
    """One judgement on synthetic seeds: per seed, log(candidate time / base time) = -log(speedup) + noise, plus a
    first-mover penalty of `position` on whichever side starts the seed (the order alternates, as the race's does),
    plus the two processes' own bias: drawn once per judgement (normal, of standard deviation `bias`), the same in
    every seed. Seeds until the rule decides or the seeds run out; the last look."""
    d: list[float] = []
    look = None
    processes = rng.gauss(0.0, bias) if bias else 0.0
    for i in range(cfg.max_seeds):
        first_mover = position if i % 2 else -position
        d.append(-math.log(speedup) + rng.gauss(0.0, spread) + first_mover + processes)
        look = rule.look(d, d, cfg)
        if look.decision is not None:
            break
    assert look is not None
    return look


@pytest.mark.parametrize("spread, position", [(0.02, 0.0), (0.08, 0.0), (0.05, 0.03)])
def test_a_no_op_is_kept_at_most_at_the_stated_rate(spread, position):
    """2,000 no-op candidates at each spread: kept at most 1% of the time (the stated false_keep), with room for
    the binomial's spread (20 expected at 1%: 33 is three of its standard deviations above)."""
    rng = random.Random(48)
    looks = [race(rng, 1.0, spread, position) for _ in range(2000)]
    kept = sum(k.decision == rule.KEEP for k in looks)
    assert kept <= 33, kept
    reverted = sum(k.decision == rule.REVERT for k in looks)
    # A no-op is no gain of 10% or more: at a 2% spread the rule says so within the seeds.
    if spread <= 0.02:
        assert reverted >= 0.99 * len(looks)


def test_a_bias_between_the_two_processes_keeps_a_no_op_without_the_floor_and_not_with_it():
    """Every seed of a judgement runs in the same two processes: a bias between them is the same in each seed, so
    the t-test over seeds reads it as a gain. At a 1% bias and a 0.2% spread per seed (a steady machine), a rule
    that keeps any gain it shows keeps far more no-ops than its stated 1%; one that needs the gain shown above the
    floor (3%) stays within it (docs/judge.md#the-rule)."""
    rng = random.Random(50)
    bare = JudgeConfig(keep_floor=0.0)
    kept_bare = sum(race(rng, 1.0, 0.002, cfg=bare, bias=0.01).decision == rule.KEEP for _ in range(2000))
    kept = sum(race(rng, 1.0, 0.002, bias=0.01).decision == rule.KEEP for _ in range(2000))
    assert kept_bare > 100, kept_bare  # five times the stated 20 in 2,000
    assert kept <= 33, kept


def test_a_slower_candidate_is_kept_even_less():
    rng = random.Random(7)
    assert sum(race(rng, 0.97, 0.05).decision == rule.KEEP for _ in range(2000)) <= 5


@pytest.mark.parametrize("speedup, spread", [(1.5, 0.05), (1.25, 0.05), (1.5, 0.10)])
def test_a_real_win_is_kept(speedup, spread):
    """A win of 25% or more at the spreads the development CPU showed (docs/race.md) is kept, within 8 seeds, in at
    least 95% of races, and never reverted as noise more than the stated 5%."""
    rng = random.Random(3)
    looks = [race(rng, speedup, spread) for _ in range(1000)]
    assert sum(k.decision == rule.KEEP for k in looks) >= 950
    assert sum(k.why == "noise" for k in looks) <= 50


def test_no_decision_before_the_first_look():
    d = [-math.log(3.0)] * (FIRST_LOOK - 1)  # three times faster, every seed alike: still no look before the third
    assert rule.look(d, d, CFG).decision is None
    d.append(-math.log(3.0) + 0.001)
    assert rule.look(d, d, CFG).decision == rule.KEEP


def test_a_censored_candidate_is_never_kept_and_a_censored_base_gives_no_loss():
    """A candidate run that stopped before the target has no upper bound: no keep, however fast its other seeds.
    A base run that stopped has no lower bound: no loss, no noise."""
    fast = -math.log(2.0)
    low, high = [fast, fast, fast - 0.01, fast], [fast, math.inf, fast - 0.01, fast]
    look = rule.look(low, high, CFG)
    assert look.decision is None and look.p_win == 1.0
    slow = math.log(2.0)
    low, high = [slow, -math.inf, slow + 0.01, slow], [slow, slow, slow + 0.01, slow]
    look = rule.look(low, high, CFG)
    assert look.decision is None and look.p_loss == 1.0 and look.p_short == 1.0


def test_the_interval_is_the_one_the_keep_and_loss_tests_read():
    rng = random.Random(11)
    for _ in range(300):
        d = [rng.gauss(-0.05, 0.05) for _ in range(rng.randint(3, 8))]
        look = rule.look(d, d, CFG)
        lo, hi = look.interval
        assert lo is not None and hi is not None and lo <= (look.speedup or 0) <= hi
        assert (look.decision == rule.KEEP) == (lo > 1 + CFG.keep_floor)
        if look.why == "loss":
            assert look.speedup is not None and look.speedup < 1 / (1 + CFG.min_gain)


def test_the_rule_refuses_rates_it_cannot_hold():
    for bad in ({"false_keep": 0.0}, {"false_keep": 0.6}, {"max_seeds": 2}, {"min_gain": -0.1}, {"budget_s": 0},
                {"keep_floor": -0.01}, {"keep_floor": 0.1}, {"keep_floor": 0.05, "min_gain": 0.04}):
        with pytest.raises(UsageError):
            JudgeConfig(**bad)
