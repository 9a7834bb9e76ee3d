"""tune's typed records: its section of results.json, with the race it runs among its finalists and the two
judges (tokens/s and time to the target) whose answers it sets side by side."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from speedladder.records.race_section import RaceSection
from speedladder.spec import StepSpec


@dataclass
class TuneJudge:
    """One judge's answer: the configuration it names best, and the figures it names it by."""

    judge: str  # "tokens" (tokens/s in timed windows) or "time" (time to the target val loss, raced over seeds)
    winner: str | None  # the record's name (a rung, a candidate, a final re-measurement, or a raced finalist)
    rungs: list[str] = field(default_factory=list)  # above eager
    spec: StepSpec | None = None
    batch_lr_scale: str | None = None  # the learning-rate rule of its batch rung, when it has one
    tokens_per_s_x: float | None = None  # × eager's tokens/s
    time_x: float | None = None  # × faster than eager to the target (paired by seed)
    p_vs_eager: float | None = None  # the paired test's one-sided p that it is faster than eager
    p_vs_other: float | None = None  # ... faster than the other judge's winner (when they differ)
    detail: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class TuneCandidate:
    """A combination of the survivors tune measured, or found already measured under another name (`same_as`)."""

    name: str
    rungs: list[str] = field(default_factory=list)
    same_as: str | None = None  # the record whose configuration it is; then it has no status of its own
    status: str | None = None
    detail: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_plain(self) -> dict[str, Any]:
        """As saved: a measured candidate has status and detail, one measured already `same_as`; never both."""
        out = {k: v for k, v in (("name", self.name), ("rungs", self.rungs), ("same_as", self.same_as),
                                 ("status", self.status), ("detail", self.detail)) if v is not None}
        return {**out, **self.extra}


@dataclass
class TuneCommands:
    """How the winner leaves the tool (tune/search.commands): measured again, trained, put in the user's loop.
    A file from before winner.toml has no "apply", and a "train_rungs" command line, kept in `extra`."""

    run: str = ""
    train: str = ""
    apply: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class TuneSection:
    """`speedladder tune`: the budget, what was kept and dropped, the combinations, the winner."""

    budget_minutes: float | None = None
    seconds: float | None = None
    survivors: list[str] | None = None  # None: the search stopped before the survivors were combined
    dropped: dict[str, str] = field(default_factory=dict)
    candidates: list[TuneCandidate] = field(default_factory=list)
    finalists: list[str] = field(default_factory=list)
    winner: str | None = None
    winner_rungs: list[str] = field(default_factory=list)
    winner_spec: StepSpec | None = None
    winner_batch_lr_scale: str | None = None  # the winner's batch rule, when the race chose one of its own
    commands: TuneCommands | None = None
    judge: str = "tokens"  # which judge chose the winner: "time" or "tokens" (a file from before the race: tokens)
    judged_by: str = ""  # why that judge: asked for, or the race could not be run (and why)
    tokens_judge: TuneJudge | None = None
    time_judge: TuneJudge | None = None
    race: RaceSection | None = None  # the finalists raced to the target val loss over seeds
    extra: dict[str, Any] = field(default_factory=dict)
