"""What the climb builds on: a rung that passed its gates is built upon only if it paid, and one that was not says
why in a word first; a rung the profile already knew to be slow stops after one short window."""

from __future__ import annotations

from speedladder.measure import judging
from speedladder.records import RungResult

# A rung the profile predicts below this ratio to its base is timed in one short window beside it, and stops there
# unless it measures at or above it (within 2x of its base): the profile already knew (docs/measurement.md, rule 4).
SHORT_BELOW = 0.5


def short_detail(r: RungResult) -> str:
    """Why a rung stopped short has no verdict: what its one window measured against what was predicted."""
    pred = r.predicted.speedup if r.predicted and r.predicted.speedup is not None else float("nan")
    x = f"{r.speedup_prev:.2f}x" if r.speedup_prev is not None else "below"
    return (f"one short window beside its base, {x} where {pred:.2f}x was predicted (below {SHORT_BELOW:g}x): "
            "stopped there, neither gated nor timed further; one window can claim neither a win nor a loss")


def pays(r: RungResult) -> bool:
    """Whether the rungs above build on this one (it passed its gates): a speed rung's best estimate must be above
    its base, a win or noise above 1.0x (judging.builds_on); the claim of a win or a loss keeps its own test (the
    windows' ranges). A memory rung is expected to cost speed and an optimizer rung is judged by tokens to a loss,
    so both are built upon (docs/measurement.md, rule 13)."""
    return r.kind != "speed" or judging.builds_on(r.verdict, r.speedup_prev)


def not_built_upon(r: RungResult, base: str) -> str:
    """Why the rungs above do not build on a rung that passed its gates, its reason word first."""
    x = f"{r.speedup_prev:.2f}x {base} re-timed beside it" if r.speedup_prev is not None else f"no ratio to {base}"
    if r.verdict == judging.SHORT:
        why = f"{x} in one short window, below {SHORT_BELOW:g}x as predicted"
    elif r.verdict == "loss":
        why = f"a loss, {x}"
    else:
        why = f"{r.verdict}, {x}: the windows overlap, but the best estimate is not above 1.0x"
    return f"{judging.SLOWER}: {why}; the rungs above build on {base}"
