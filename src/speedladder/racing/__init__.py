"""`speedladder race`: time to a target val loss over seeds (engine.py), judged by Welch's t-test (verdicts.py)."""

from speedladder.racing.engine import Clock, Race, WallClock, changes_learning
from speedladder.racing.verdicts import BASELINE, DID_NOT_REACH, NOT_A_WIN, equal_tokens, judge

__all__ = ["BASELINE", "DID_NOT_REACH", "NOT_A_WIN", "Clock", "Race", "WallClock", "changes_learning",
           "equal_tokens", "judge"]
