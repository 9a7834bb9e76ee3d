"""The typical profiled step and its spread: medians, interquartile ranges, outlier steps, a borderline margin.

One disturbed step (a burst of page faults, another process on the core) must
not move the profile: every figure is kept per step, the breakdown is the
median step, and the spread beside it is the interquartile range across the
steps. Pure arithmetic on numbers per step: no torch here.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

SPREAD_BASIS = "interquartile range (25th to 75th percentile) across the profiled steps"

# Outlier steps. A step is an outlier when its wall time is more than OUTLIER_K scaled median absolute deviations
# (MAD) from the median step's, and more than OUTLIER_MIN_REL of the median away:
#   |t - median| > max(OUTLIER_K * MAD_TO_SIGMA * MAD, OUTLIER_MIN_REL * median)
# MAD x 1.4826 estimates a standard deviation for normally spread data, so k = 3 is "three sigma" made robust: the
# disturbed steps cannot widen the scale that judges them, as they would a standard deviation (Leys et al. 2013
# recommend 2.5 to 3). The 10% floor: a run of near-identical steps has a MAD near zero, and a step 2% slower than
# the others is not a disturbance. Outliers stay in the data; the medians and quartiles already ignore them.
OUTLIER_K = 3.0
MAD_TO_SIGMA = 1.4826
OUTLIER_MIN_REL = 0.10
OUTLIER_RULE = (f"|wall - median| > max({OUTLIER_K:g} x {MAD_TO_SIGMA} x MAD, {OUTLIER_MIN_REL:.0%} of the median), "
                "MAD the median absolute deviation of the steps' wall times")

# Borderline. The regime is borderline (the top two buckets cannot be told apart) when any of:
#  1. the median step's margin between them is under MIN_MARGIN. One run's steps cannot show the drift between runs:
#     in four sets of five runs of the default workload (d2l-cpu, one thread, 2026-11-29, the 2-core Xeon test
#     machine shared with other work) the compute-over-memory margin moved by up to 14 points within a set (11 to 27
#     points over the twenty), about +-7 around its middle, while each run's quartiles were a few points wide;
#  2. their interquartile ranges across the steps overlap: a typical step-to-step swing is as large as the margin;
#  3. the step was starved with more than one intra-op thread: in the median step its threads waited, ready to run,
#     for a core another process held for over STARVED_WAIT of the core time the step asked for (wall x threads).
#     A multi-threaded operator waits at its barrier for a thread that is not running, spinning meanwhile, and that
#     wait lands in whichever operators are parallel. On the test machine (same day, two threads against the other
#     engineers' work) the threads waited for half to two thirds of it, steps took up to 70 times a quiet step, all
#     alike, and runs said "memory-bound" with the optimizer near 30%. One thread is time-sliced evenly instead: it
#     waited for a third of its time in the same hour, and the median step of every run put compute first.
# Unsteady steps (the wall times' interquartile range over UNSTEADY_REL of their median) are said in the notes but
# do not by themselves make the regime borderline: a time slice lost to another process lands in one category of
# one step, and the median of each category leaves it out.
MIN_MARGIN = 0.10
UNSTEADY_REL = 0.25
STARVED_WAIT = 0.25


def quantile(xs: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) of xs, linearly interpolated between order statistics (numpy's default)."""
    if not xs:
        raise ValueError("quantile of no values")
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def iqr(xs: Sequence[float]) -> list[float]:
    """[25th, 75th] percentile of xs."""
    return [quantile(xs, 0.25), quantile(xs, 0.75)]


def outliers(walls: Sequence[float]) -> list[int]:
    """Indices of the steps whose wall time is far outside the others' (OUTLIER_RULE)."""
    if len(walls) < 3:
        return []  # two steps cannot say which of them is the odd one
    med = statistics.median(walls)
    mad = statistics.median(abs(w - med) for w in walls)
    limit = max(OUTLIER_K * MAD_TO_SIGMA * mad, OUTLIER_MIN_REL * med)
    return [i for i, w in enumerate(walls) if abs(w - med) > limit]


def medians(per_step: Sequence[dict[str, float]]) -> dict[str, float]:
    """Each key's median across the steps (0 for a step that lacks it)."""
    keys = list(dict.fromkeys(k for step in per_step for k in step))
    return {k: statistics.median(step.get(k, 0.0) for step in per_step) for k in keys}


def unsteady(walls: Sequence[float]) -> bool:
    """Whether the steps' wall times spread by more than UNSTEADY_REL of their median (a busy machine)."""
    if len(walls) < 2:
        return False
    lo, hi = iqr(walls)
    return hi - lo > UNSTEADY_REL * statistics.median(walls)


def starved(wait_shares: Sequence[float], threads: int | None) -> bool:
    """Whether a multi-threaded CPU step waited too long for cores to trust its shares (rule 3)."""
    return bool(wait_shares) and (threads or 1) > 1 and statistics.median(wait_shares) > STARVED_WAIT


def borderline(buckets: dict[str, float], per_step: Sequence[dict[str, float]], starved: bool = False) -> list[str]:
    """The top two buckets when the margin between them is inside the spread (the rules above); empty when not.

    buckets: the median step's; per_step: the same buckets of each step alone; starved: rule 3 holds.
    """
    first, second = sorted(buckets, key=buckets.__getitem__, reverse=True)[:2]
    if starved or buckets[first] - buckets[second] < MIN_MARGIN:
        return [first, second]
    if len(per_step) < 2:
        return []
    lo_first = quantile([s[first] for s in per_step], 0.25)
    return [first, second] if lo_first <= quantile([s[second] for s in per_step], 0.75) else []
