"""The typed records of results.json, read and written by the one codec (config/codec.py).

Every record keeps the field names of the JSON file (docs/results.md), so a
file written by any version of speedladder loads: a field the record does not
know lands in its `extra` and is written back unchanged; a field the file
lacks takes the record's default. Nothing read is lost.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from speedladder.config.codec import EXTRA, from_data, to_data
from speedladder.config.parallel import ParallelConfig
from speedladder.config.resolved import Resolved
from speedladder.measure.judging import Spread
from speedladder.records.checks import (
    Causality,
    Check,
    Differential,
    Distance,
    Equivalence,
    Explanation,
    Fp64,
    Kinks,
    LearnsCheck,
    LossBand,
    Role,
    TokensToTarget,
    not_applicable,
)
from speedladder.records.machine import BusyProcess, MachineLoad
from speedladder.records.race import BudgetCheck, EqualTokens, PairedTest, RaceEntry, RaceRun, RaceSection, RaceStage
from speedladder.records.tune import TuneJudge, TuneSection

__all__ = [
    "EXTRA",
    "BudgetCheck",
    "BusyProcess",
    "Causality",
    "Check",
    "Differential",
    "Distance",
    "EqualTokens",
    "Equivalence",
    "Explanation",
    "Fp64",
    "Gate",
    "Kinks",
    "LearnsCheck",
    "LossBand",
    "MachineLoad",
    "PairedTest",
    "ParallelSection",
    "Prediction",
    "ProfileSummary",
    "RaceEntry",
    "RaceRun",
    "RaceSection",
    "RaceStage",
    "Results",
    "Role",
    "RungResult",
    "TokensToTarget",
    "TuneJudge",
    "TuneSection",
    "from_dict",
    "not_applicable",
    "to_dict",
]

T = TypeVar("T")


def to_dict(obj: Any) -> Any:
    """A record (or a list/dict of them) as JSON-ready data: the codec's rules, non-finite numbers as null."""
    return to_data(obj, json=True)


def from_dict(cls: type[T], data: Mapping[str, Any]) -> T:
    """A record from its JSON form, by the codec's rules: types checked, what the record does not declare kept in
    its `extra`, a key of another version that a saved configuration no longer has skipped."""
    return from_data(cls, data, cls.__name__, unknown="skip")


@dataclass
class Gate:
    """A rung's correctness gates (docs/measurement.md, rules 7 and 9): each check's own record, and the verdict."""

    passed: bool
    detail: str = ""  # why it failed: the first failing check's line
    reference: bool = False  # the rung is eager fp32 itself, the reference of every check
    equivalence: Equivalence | None = None  # logits, loss and gradients against eager fp32
    loss_band: LossBand | None = None  # the loss curve against eager fp32's over the same batches
    tokens_to_target: TokensToTarget | None = None  # a rung that changes the update: tokens to AdamW's loss
    causality: Causality | None = None  # the future tokens changed: the past logits must not move
    differential: Differential | None = None  # against the rung it built on, at the same precision
    explanation: Explanation | None = None  # a failed gate's: where the divergence starts (verify/bisect.py)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Prediction:
    """What the profile's model predicted for a rung, on the spec it built on."""

    speedup: float | None
    reason: str
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class RungResult:
    """One measured (or skipped, failed, interrupted) rung, control, beside rung or tune candidate."""

    name: str
    rung: str  # the rung it applies (a control is named "<rung>-fp32")
    role: Role  # a step of the ladder, the batch rung's control, beside the top, a tune candidate or finalist
    reason: str
    kind: str  # "speed", "memory" or "optimizer"
    built_on: str | None  # the result it is compared with
    spec: dict[str, Any]  # the StepSpec, as saved
    precision: str
    requirement: dict[str, Any]
    status: str = "pending"  # "ok", "skipped", "oom", "error", "interrupted" (or "pending" while it runs)
    source: str = "built-in"  # where the rung was declared: built-in, or the user's rung file or module
    detail: str = ""
    predicted: Prediction | None = None
    wall_s: float | None = None  # the whole rung: build, compile, windows and gates
    peak_memory_bytes: int | None = None
    peak_reserved_bytes: int | None = None  # CUDA's reserved peak: CUDA graphs' pools are reserved, not allocated
    timing: dict[str, Any] | None = None  # measure/timer.Timing as saved: every window's raw time
    tokens_per_s: Spread | None = None
    step_ms: float | None = None
    compile_s: float | None = None
    warnings: list[str] = field(default_factory=list)
    flops_per_token: int | None = None
    tflops: float | None = None
    peak_tflops: float | None = None
    peak_basis: str = ""  # how peak_tflops was had when it is not one precision's (fp8: blended by FLOP share)
    mfu: float | None = None
    gate: Gate | None = None
    speedup_prev: float | None = None
    speedup_cum: float | None = None
    verdict: str | None = None  # "baseline", "win", "loss", "noise", "inconclusive" or "control"
    verdict_detail: str = ""  # why a verdict is inconclusive
    base_timing: dict[str, Any] | None = None  # the base re-timed beside this rung: its interleaved windows
    base_tokens_per_s: Spread | None = None  # ... and their tokens/s; x prev and the verdict use these
    # The base re-timed beside this rung against its own measurement as a rung, less 1, when they disagree beyond
    # both spreads (measure/judging.drift): the machine drifted between the two; None when they agree.
    base_drift: float | None = None
    prediction_error: float | None = None  # measured x prev over predicted, less 1
    # Why the rungs above do not build on this one though it passed its gates, its reason word first ("slower: a
    # loss, ..."; a speed rung whose best estimate is not above its base: ladder.pays); empty when they do, or when
    # it did not pass.
    not_built_upon: str = ""
    rungs_combined: list[str] | None = None  # a tune candidate's rungs
    # Memory (climbing/meters.py): what one forward saved for backward, that predicted from the shapes, and off CUDA the
    # resident set before the step and its high-water mark during it (a child process); how, or why not.
    saved_activation_bytes: int | None = None
    predicted_activation_bytes: int | None = None
    process_base_bytes: int | None = None
    process_peak_bytes: int | None = None
    memory_note: str = ""
    explanation: dict[str, Any] | None = None  # a prediction missed beyond the limit: base and rung profiled
    # fp16's gradient scaler: the updates it skipped (inf or NaN gradients) of those the rung's measurement made
    # (its first step, warm-up and windows); None without a scaler.
    scaler_skipped: int | None = None
    scaler_updates: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def resident_rise(self) -> int | None:
        """The resident set's rise during the measured steps over what the process held before them."""
        if self.process_peak_bytes is None or self.process_base_bytes is None:
            return None
        return max(self.process_peak_bytes - self.process_base_bytes, 0)

    @property
    def passed(self) -> bool:
        """Measured and through every gate."""
        return self.ok and self.gate is not None and self.gate.passed


@dataclass
class ProfileSummary:
    """The profiled step (profile/child.py): categories, regime, device facts; or the error that stopped it."""

    error: str | None = None
    categories: dict[str, Any] = field(default_factory=dict)
    regime: str | None = None
    evidence: str = ""
    buckets: dict[str, float] = field(default_factory=dict)
    steps: int = 0
    step_ms: float | None = None
    wall_step_ms: float | None = None
    ops_per_step: float | None = None
    floor_share: float = 0.0
    op_floor_us: float = 0.0
    ops_ms: dict[str, float] = field(default_factory=dict)
    top_ops: list[dict[str, Any]] = field(default_factory=list)
    top_table: str = ""
    time_basis: str = ""
    matmul_tflops: float | None = None
    memory_gbps: float | None = None
    memory_counted_share: float | None = None
    spec: dict[str, Any] = field(default_factory=dict)
    rungs: list[str] = field(default_factory=list)
    device_type: str | None = None
    tokens_per_step: int | None = None
    params: int | None = None
    model: dict[str, Any] | None = None
    matmuls: dict[str, Any] = field(default_factory=dict)
    copy_gbps: float | None = None
    trace: str | None = None
    # A compiled spec's: graphs, recompiles, graph breaks (count and reasons), kernel calls of its generated code
    # (profile/child.compiler_facts); None for an eager one, or a file from before it.
    compiler: dict[str, Any] | None = None
    # Step by step (issue 16): `categories` is the median step (each category's median across the steps, with its
    # "ms_iqr" and "share_iqr"); these keep the steps themselves and what their spread says.
    per_step: list[dict[str, Any]] = field(default_factory=list)  # wall_ms, ops, minor_faults; ms, floor_ms by category
    spread_basis: str = ""  # what the ranges are (the interquartile range across the steps)
    outlier_steps: list[int] = field(default_factory=list)  # indices into per_step of steps far outside the others
    outlier_rule: str = ""
    bucket_iqr: dict[str, list[float]] = field(default_factory=dict)  # compute, memory, overhead across the steps
    unsteady: bool = False  # the steps' wall times spread widely (a busy machine); said, not a borderline by itself
    starved: bool = False  # a multi-threaded CPU step's threads waited for cores other processes held
    threads: int | None = None  # intra-op threads of a CPU step (None: not a CPU profile, or an older file)
    borderline: list[str] = field(default_factory=list)  # the two regimes the margin cannot tell apart; [] if clear
    regime_label: str | None = None  # the regime, or "borderline (compute / memory)"; None in older files
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str | None:
        """The regime as it should be said: borderline where the margin is inside the spread."""
        return self.regime_label or self.regime


@dataclass
class ParallelSection:
    """predict / ddp: the priced k, the bandwidth, the single-process measurement and the job's (parallel/)."""

    command: str
    strategy: str
    nproc: list[int]
    threads_per_process: int
    cpu_cores: int | None
    config: ParallelConfig
    spec: dict[str, Any]
    rungs: list[str]
    tokens_per_step_per_process: int
    grad_bytes: int
    param_bytes: list[int]
    unit_bytes: list[int]
    bucket_cap_bytes: int
    first_bucket_bytes: int
    ddp_buckets: list[int]
    single: dict[str, Any] | None = None
    bandwidth: dict[str, Any] | None = None
    probes: list[dict[str, Any]] = field(default_factory=list)
    predictions: list[dict[str, Any]] = field(default_factory=list)
    measured: dict[str, Any] | None = None
    launch: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Results:
    """A whole results.json: the header (what the numbers need to be trusted), then what was measured."""

    schema: str
    created: str
    command: list[str]
    config: Resolved  # the resolved configuration, saved flat (Resolved.to_plain)
    environment: dict[str, Any]
    model: dict[str, Any]
    # "running", "complete", "interrupted", "failed" (ddp) or "elsewhere" (ddp, rank 0 elsewhere); a profile.json
    # of schema 1 has none: it was written once, complete.
    status: str = "complete"
    corpus: dict[str, Any] | None = None
    kind: str | None = None  # "profile" for a `speedladder profile` folder's profile.json; "race" for a race
    updated: str | None = None
    rungs: list[RungResult] = field(default_factory=list)
    learns_check: LearnsCheck | None = None
    fastest: str | None = None
    profile: ProfileSummary | None = None
    predictions: list[dict[str, Any]] | None = None
    tune: TuneSection | None = None
    parallel: ParallelSection | None = None
    sweep: dict[str, Any] | None = None  # `speedladder sweep`: the axis, its points and each rung's crossover
    race: RaceSection | None = None  # `speedladder race`: time to a target val loss, over seeds
    machine: MachineLoad | None = None  # run, tune, race: other processes' load before and during the windows
    # The recipe's learning-rate schedule as the command made it (its length the recipe's, else the command's
    # training: training/recipe.Schedule.describe); the recipe's values are in config.recipe.
    schedule: str | None = None
    error: str | None = None
    detail: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

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
