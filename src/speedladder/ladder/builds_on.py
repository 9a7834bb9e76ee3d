"""What the climb builds on: a rung that passed its gates is built upon only if it paid, and one that was not says
why in a word first; a rung the profile already knew to be slow stops after one short window; a rung judged by the
race is measured in tokens/s and never built upon for speed; and, of the rungs built upon, which is the fastest."""

from __future__ import annotations

from speedladder.measure import judging
from speedladder.records import Results, Role, RungResult

# A rung the profile predicts below this ratio to its base is timed in one short window beside it, and stops there
# unless it measures at or above it (within 2x of its base): the profile already knew (docs/measurement.md, rule 4).
SHORT_BELOW = 0.5

# Kinds of rung that change how the model learns (rungs/registry.KINDS): Muon can need 5x fewer tokens at 0.3x the
# tokens/s. Their tokens/s is measured and shown, but is not what they are for: a tokens/s ladder does not build on
# them, and the race to a target loss judges them (docs/measurement.md, rule 13).
JUDGED_BY_RACE = ("optimizer", "architecture")
RACE = "race"  # why such a rung is not built upon, in a word


def short_detail(r: RungResult) -> str:
    """Why a rung stopped short has no verdict: what its one window measured against what was predicted."""
    pred = r.predicted.speedup if r.predicted and r.predicted.speedup is not None else float("nan")
    x = f"{r.speedup_prev:.2f}x" if r.speedup_prev is not None else "below"
    return (f"one short window beside its base, {x} where {pred:.2f}x was predicted (below {SHORT_BELOW:g}x): "
            "stopped there, neither gated nor timed further; one window can claim neither a win nor a loss")


def judged_by_race(r: RungResult) -> bool:
    """Whether a rung is judged by time to a target loss rather than by tokens/s (its kind changes how it learns)."""
    return r.kind in JUDGED_BY_RACE


def pays(r: RungResult) -> bool:
    """Whether the rungs above build on this one (it passed its gates): a speed rung's best estimate must be above
    its base, a win or noise above 1.0x (judging.builds_on); the claim of a win or a loss keeps its own test (the
    windows' ranges). A memory rung is expected to cost speed, so it is built upon. A rung judged by the race (an
    optimizer or architecture rung) is never built upon for speed, whatever its tokens/s: the race judges it
    (docs/measurement.md, rule 13)."""
    if judged_by_race(r):
        return False
    return r.kind != "speed" or judging.builds_on(r.verdict, r.speedup_prev)


def not_built_upon(r: RungResult, base: str) -> str:
    """Why the rungs above do not build on a rung that passed its gates, its reason word first."""
    x = f"{r.speedup_prev:.2f}x {base} re-timed beside it" if r.speedup_prev is not None else f"no ratio to {base}"
    if judged_by_race(r):
        return (f"{RACE}: an {r.kind} rung, judged by time to a target loss, not by tokens/s ({x} in tokens/s); "
                f"the race judges it, and the rungs above build on {base}")
    if r.verdict == judging.SHORT:
        why = f"{x} in one short window, below {SHORT_BELOW:g}x as predicted"
    elif r.verdict == "loss":
        why = f"a loss, {x}"
    else:
        why = f"{r.verdict}, {x}: the windows overlap, but the best estimate is not above 1.0x"
    return f"{judging.SLOWER}: {why}; the rungs above build on {base}"


def word(r: RungResult) -> str:
    """The reason word of a rung's `not_built_upon` (slower, race); a file from before the word: slower."""
    head = r.not_built_upon.split(":", 1)[0]
    return head if head in (judging.SLOWER, RACE) else judging.SLOWER


def ranked(results: Results) -> list[RungResult]:
    """The configurations that passed every gate and were not left out of the climb (a control is none), the
    fastest first: fastest by x cum, its ratios each measured beside its base, since the absolute tokens/s of rows
    timed minutes apart are not comparable on a machine whose load moves (docs/measurement.md, rule 8). The
    learns-check tries them in this order; an interrupted run names the first as its best so far."""
    passed = [r for r in results.rungs if r.role != Role.CONTROL and r.passed and not r.not_built_upon]
    return sorted(passed, key=lambda r: r.speedup_cum or 0.0, reverse=True)
