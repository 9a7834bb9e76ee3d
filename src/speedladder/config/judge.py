"""`speedladder judge`'s own configuration: the base, the budget and the sequential rule's error rates.

The target, the eval cadence and the caps are the race's (RaceConfig, the `race-target` flags): a judge races as
`speedladder race` does, and a loop that fixes its ruler with --target-from or --target-loss fixes it for both.
"""

from __future__ import annotations

from dataclasses import dataclass

from speedladder.codec import Group, at_least, option, positive
from speedladder.errors import UsageError

# The first look at the paired test comes after this many seeds: with 2, a one-sided t-test at the rule's split
# level (1% over 6 looks) needs a t of about 190, which no pair of seeds gives, so a look there would spend its share
# of the error rate for nothing.
FIRST_LOOK = 3


@dataclass(frozen=True)
class JudgeConfig:
    """`speedladder judge`: keep, revert or undecided, for a candidate raced against its base over seeds, with the
    error rates the sequential rule holds (docs/judge.md)."""

    base: str | None = option(None, help="what the candidate is judged against: a rung file (its rungs composed on "
                                         "eager fp32), a config.toml or winner.toml, or a run folder (its winner)",
                              shown="eager fp32 on the workload", metavar="BASE", group=Group.JUDGE)
    budget_s: float = option(600.0, help="wall seconds for the whole decision, workers, gates and race included; "
                                         "a seed that would not fit is not started, and the decision is then "
                                         "undecided", metavar="S", group=Group.JUDGE)
    max_seeds: int = option(8, help="seeds at most: the rule looks at the paired test after each seed from the "
                                    f"{FIRST_LOOK}rd, and says undecided if none of them decides",
                            metavar="N", group=Group.JUDGE)
    false_keep: float = option(0.01, help="the false-keep rate the rule holds: a candidate no more than --keep-floor "
                                          "faster than its base is kept at most this often (split evenly over the "
                                          "looks)", metavar="P",
                               group=Group.JUDGE)
    false_revert: float = option(0.05, help="a candidate at least --min-gain faster is reverted at most this often "
                                            "(split evenly over the looks)", metavar="P", group=Group.JUDGE)
    min_gain: float = option(0.10, help="the smallest gain in time to the target worth keeping: a candidate "
                                        "shown to fall short of it is reverted (a loss when shown slower, else "
                                        "noise)", metavar="F",
                             group=Group.JUDGE)
    keep_floor: float = option(0.03, help="the gain a keep must be shown to exceed: every seed runs in the same two "
                                          "worker processes, so a bias between them is the same in each seed and "
                                          "the seeds' spread cannot see it (docs/judge.md#the-rule)", metavar="F",
                               group=Group.JUDGE)
    worker_timeout_s: float = option(600.0, help="seconds a worker may take to answer one request (its build and "
                                                 "gates, or one stretch of steps) before it is stopped: an error",
                                     metavar="S", group=Group.JUDGE)

    def __post_init__(self) -> None:
        positive("--budget-s", self.budget_s)
        positive("--worker-timeout-s", self.worker_timeout_s)
        positive("--min-gain", self.min_gain)
        if not 0 <= self.keep_floor < self.min_gain:
            raise UsageError(f"--keep-floor is a gain between 0 and --min-gain ({self.min_gain:g}), got "
                             f"{self.keep_floor:g}")
        at_least("--max-seeds", self.max_seeds, FIRST_LOOK)
        for name, p in (("--false-keep", self.false_keep), ("--false-revert", self.false_revert)):
            if not 0 < p < 0.5:
                raise UsageError(f"{name} is an error rate: between 0 and 0.5, got {p}")

    @property
    def looks(self) -> int:
        """The paired test is read after each seed from FIRST_LOOK to max_seeds."""
        return self.max_seeds - FIRST_LOOK + 1
