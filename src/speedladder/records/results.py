"""The run's record: a whole results.json, its header, what was measured, and what kind of run wrote it."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from speedladder.config.resolved import Resolved
from speedladder.models.model_record import SavedModel
from speedladder.records.checks import LearnsCheck, Role
from speedladder.records.corpus_record import CorpusRecord
from speedladder.records.header import Environment
from speedladder.records.machine import MachineLoad
from speedladder.records.parallel_section import ParallelSection
from speedladder.records.profile_summary import ProfilePrediction, ProfileSummary
from speedladder.records.race_section import RaceSection
from speedladder.records.rung_result import RungResult
from speedladder.records.sweep_section import SweepSection
from speedladder.records.tune_section import TuneSection


class RunKind(str, Enum):
    """Which command wrote a results.json: a str, so RunKind.RACE and "race" are the same value."""

    RUN = "run"  # a ladder: `speedladder run`
    TUNE = "tune"
    RACE = "race"
    SWEEP = "sweep"
    PREDICT = "predict"  # data parallelism priced, one process measured
    DDP = "ddp"  # ... and the k-process job measured
    PROFILE = "profile"  # a `speedladder profile` folder's profile.json


@dataclass
class Results:
    """A whole results.json: the header (what the numbers need to be trusted), then what was measured."""

    schema: str
    created: str
    command: list[str]
    config: Resolved  # the resolved configuration, saved flat (Resolved.to_plain)
    environment: Environment
    model: SavedModel
    # "running", "complete", "interrupted", "failed" (ddp) or "elsewhere" (ddp, rank 0 elsewhere); a profile.json
    # of schema 1 has none: it was written once, complete.
    status: str = "complete"
    corpus: CorpusRecord | None = None
    # As saved: "profile" for a `speedladder profile` folder's profile.json, "race", "sweep"; None for the others.
    # `run_kind` is what every reader asks: it names every kind, whether or not the file says it.
    kind: str | None = None
    updated: str | None = None
    rungs: list[RungResult] = field(default_factory=list)
    learns_check: LearnsCheck | None = None
    fastest: str | None = None
    profile: ProfileSummary | None = None
    predictions: list[ProfilePrediction] | None = None
    tune: TuneSection | None = None
    parallel: ParallelSection | None = None
    sweep: SweepSection | None = None  # `speedladder sweep`: the axis, its points and each rung's crossover
    race: RaceSection | None = None  # `speedladder race`: time to a target val loss, over seeds
    machine: MachineLoad | None = None  # run, tune, race: other processes' load before and during the windows
    # The recipe's learning-rate schedule as the command made it (its length the recipe's, else the command's
    # training: step/schedule.Schedule.describe); the recipe's values are in config.recipe.
    schedule: str | None = None
    error: str | None = None
    detail: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def run_kind(self) -> RunKind:
        """Which command wrote the file, from its sections: the one place a result's kind is worked out."""
        if self.kind == RunKind.PROFILE:
            return RunKind.PROFILE
        if self.parallel is not None:
            return RunKind(self.parallel.command)
        if self.race is not None:
            return RunKind.RACE
        if self.sweep is not None:
            return RunKind.SWEEP
        if self.tune is not None:
            return RunKind.TUNE
        return RunKind.RUN

    def rung(self, name: str) -> RungResult | None:
        return next((r for r in self.rungs if r.name == name), None)

    @property
    def baseline(self) -> RungResult | None:
        """The first ladder rung that ran: what every x cum is against."""
        return next((r for r in self.rungs if r.role == Role.RUNG and r.ok), None)

    @property
    def failed_baseline(self) -> RungResult | None:
        """The first ladder rung when it was tried and failed (an error, out of memory): nothing is measured against
        it, so the run failed. One that was skipped (a budget, a requirement) is not a failure."""
        first = next((r for r in self.rungs if r.role == Role.RUNG), None)
        return first if first is not None and first.status in ("error", "oom") else None

    def chain(self, record: RungResult) -> tuple[str, ...]:
        """The rung names that give a record's spec from eager: a candidate's own, a ladder rung's chain."""
        if record.rungs_combined is not None:
            return tuple(record.rungs_combined)
        names = []
        r: RungResult | None = record
        while r is not None:
            names.append(r.rung)
            r = self.rung(r.built_on) if r.built_on else None
        return tuple(reversed(names))

    def winner(self) -> tuple[str, tuple[str, ...]] | None:
        """The configuration this file names best, and its rungs above eager: tune's winner, a race's fastest to
        the target, else the fastest rung that passed every gate; None when there is none."""
        if self.tune and self.tune.winner:
            return self.tune.winner, tuple(self.tune.winner_rungs)
        if self.race is not None:
            raced = self.race.entry(self.race.fastest) if self.race.fastest else None
            return (raced.name, tuple(n for n in raced.rungs if n != "eager")) if raced is not None else None
        best = self.rung(self.fastest) if self.fastest else None
        if best is None:
            return None
        return best.name, tuple(n for n in self.chain(best) if n != "eager")
