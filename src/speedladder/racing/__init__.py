"""`speedladder race`: time to a target val loss over seeds, in stages (engine.py), judged by a paired test by seed
on log times that knows censored runs (verdicts.py), on a ruler that can be reused (target.py)."""

from speedladder.racing.engine import Clock, Race, WallClock
from speedladder.racing.verdicts import (
    BASELINE,
    DID_NOT_REACH,
    NOT_A_WIN,
    PAYS,
    changes_learning,
    equal_tokens,
    judge,
    versus,
)

__all__ = ["BASELINE", "DID_NOT_REACH", "NOT_A_WIN", "PAYS", "Clock", "Race", "WallClock", "changes_learning",
           "equal_tokens", "judge", "versus"]
