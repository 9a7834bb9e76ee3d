"""The verdict of a rung against its base: the spread of each side's clean windows, win / loss / noise, and the
drift of a base re-timed beside a rung."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from speedladder.measure.timer import Timing


@dataclass
class Spread:
    median: float
    min: float
    max: float

    @property
    def rel_spread(self) -> float:
        return (self.max - self.min) / self.median if self.median else 0.0


def tokens_per_s(timing: Timing) -> Spread | None:
    rates = [w.tokens_per_s for w in timing.clean_windows]
    if not rates:
        return None
    return Spread(statistics.median(rates), min(rates), max(rates))


def step_ms(timing: Timing) -> float | None:
    per_step = [w.seconds / w.steps for w in timing.clean_windows]
    return 1e3 * statistics.median(per_step) if per_step else None


MIN_CLEAN_WINDOWS = 3  # a verdict needs at least this many clean windows on each side


def verdict(rung: Spread, base: Spread) -> str:
    """win / loss only when the windows' ranges do not overlap; otherwise the change is noise.

    With n windows on each side and no real change, every rung window lands
    above every base window with probability 1 / C(2n, n): 1/252 for n = 5, so
    a false win or loss in 2/252 = 0.8% of rungs (1/10 for n = 3). Interleaving
    the base's windows with the rung's keeps drift between them out of the ranges
    (timer.interleave); tests/measure/test_verdicts.py checks the rate on synthetic windows.
    """
    if rung.min > base.max:
        return "win"
    if rung.max < base.min:
        return "loss"
    return "noise"


def builds_on(verdict: str | None, ratio: float | None) -> bool:
    """Whether the next rung builds on a speed rung: on its best estimate, never on a claim (docs/measurement.md,
    rule 13). A win builds; any other verdict (noise, inconclusive) builds only when its ratio over its base (its
    x prev: the run's median over its base's, the race's geometric mean over the seeds) is above 1.0x. A loss, a
    ratio at or below 1.0x, a verdict that its test went against (not a win, did not reach) or no ratio: the next
    rung builds on this one's base. Where the estimate is below its base the reason is one word: SLOWER."""
    if verdict == "win":
        return True
    return verdict in ("noise", "inconclusive") and ratio is not None and ratio > 1.0


SLOWER = "slower"  # why a rung is not built upon when its best estimate is at or below its base
# The verdict of a rung timed in one short window beside its base and stopped there (predicted and measured far
# below it): no claim, since one window has no spread; never built upon (builds_on: not noise or inconclusive).
SHORT = "short"


def why_not_built(verdict: str | None) -> str:
    """Why a rung that ran and passed is not built upon, in a word or two: slower (a loss, noise or inconclusive at
    or below 1.0x, did not reach the target), or worse at equal tokens (a race's "not a win": faster, but it
    learns worse)."""
    return "worse at equal tokens" if verdict == "not a win" else SLOWER


def drift(own: Spread, beside: Spread) -> float | None:
    """A base's tokens/s re-timed beside a rung over its own measurement as a rung, less 1, when the two disagree
    beyond both spreads (their min-max ranges do not overlap): the machine's speed moved between the two
    measurements. None when they agree. The rung's x prev is against the base beside it, so it holds; what does not
    hold is reading absolute tokens/s across rows measured minutes apart."""
    if beside.min > own.max or beside.max < own.min:
        return beside.median / own.median - 1
    return None


def judge(rung: Timing, base: Timing) -> tuple[str, str]:
    """The verdict of a rung against its base timed beside it, and why when there is none to give."""
    r, b = tokens_per_s(rung), tokens_per_s(base)
    short = [f"{who} has {len(t.clean_windows)}" for who, t in (("the rung", rung), ("its base", base))
             if len(t.clean_windows) < MIN_CLEAN_WINDOWS]
    if short or r is None or b is None:
        return "inconclusive", (f"fewer than {MIN_CLEAN_WINDOWS} clean windows: " + " and ".join(short)
                                + " (windows that compiled are left out)")
    return verdict(r, b), ""
