"""The race's typed records (racing/, `speedladder race`): a run, the equal-token comparison, a configuration, the
section. Imported through speedladder.records, which the rest of the package reads."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from speedladder.records.checks import Causality

# A race's configuration: a step of a cumulative ladder, given rungs together, or a run's winner.
RaceRole = Literal["rung", "combo", "winner"]
from speedladder.stats import Summary


@dataclass
class RaceRun:
    """One configuration trained from one seed until its val loss reached the target, or it was stopped.

    The curve is kept as columns, one entry per evaluation (the first at step 0, before any training):
    `seconds` is the training clock there, which runs over training steps only (compile, warm-up and every
    evaluation are outside it).
    """

    seed: int
    stopped: str  # "reached", "time cap", "diverged" (a non-finite val loss) or "error: ..."
    seconds: float | None = None  # the training clock at the first evaluation at or below the target
    tokens: int | None = None  # tokens trained by then
    steps: int | None = None
    best_loss: float | None = None  # the lowest val loss seen, and when
    best_seconds: float | None = None
    best_tokens: int | None = None
    train_seconds: float = 0.0  # the training clock when it stopped
    eval_seconds: float = 0.0  # wall time of its evaluations, the clock paused
    recompiles: int = 0  # graphs compiled while the clock ran: a time that includes compiling
    curve_steps: list[int] = field(default_factory=list)
    curve_tokens: list[int] = field(default_factory=list)
    curve_seconds: list[float] = field(default_factory=list)
    curve_val: list[float | None] = field(default_factory=list)  # None: a non-finite loss
    curve_train: list[float | None] = field(default_factory=list)  # the training loss of the step before
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def reached(self) -> bool:
        return self.stopped == "reached"


@dataclass
class EqualTokens:
    """A rung that changes how the model learns (batch, optimizer, learning rate) against its base at equal tokens:
    per seed, both val losses where the shorter of the two runs stopped; one-sided Welch test that it is worse."""

    tokens: list[int]  # per seed: the tokens both runs trained
    loss: list[float]  # the rung's val loss there (interpolated between evaluations)
    base_loss: list[float]
    p_worse: float | None
    worse: bool  # p_worse below alpha
    detail: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class RaceEntry:
    """One configuration of a race: what it is, how it was prepared, its runs and its verdict."""

    name: str
    rungs: list[str]  # composed on the workload's eager fp32 spec, in order
    role: RaceRole
    reason: str
    kind: str  # the last rung's kind: "speed", "memory" or "optimizer"
    built_on: str | None  # the entry it is judged against
    spec: dict[str, Any]
    precision: str
    status: str = "pending"  # "ok", "skipped", "error", "failed" (the causality probe) or "pending"
    detail: str = ""
    changes_learning: bool = False  # batch, optimizer or learning rate differ from its base's
    compile_s: float | None = None  # first step and compiling warm-up steps, less steady steps: outside the clock
    warmup_s: float | None = None  # the whole warm-up, outside the clock
    causality: Causality | None = None  # the gates' probe on this configuration's own shape
    runs: list[RaceRun] = field(default_factory=list)
    time: Summary | None = None  # seconds to the target over the seeds that reached it
    tokens: Summary | None = None
    steps: Summary | None = None
    tokens_per_s: float | None = None  # median over seeds of tokens trained / training clock
    speedup_prev: float | None = None  # the base's mean time to target / this one's
    speedup_cum: float | None = None  # ... the baseline's / this one's
    tokens_per_s_prev: float | None = None  # tokens/s against the base's, from the same runs
    tokens_per_s_cum: float | None = None
    token_ratio: float | None = None  # mean tokens to target over the base's: above 1 needs more tokens
    verdict: str | None = None  # "baseline", "win", "loss", "noise", "did not reach", "not a win" or None
    verdict_detail: str = ""
    p_win: float | None = None  # Welch, one-sided: faster than its base
    p_loss: float | None = None  # ... slower
    detectable: float | None = None  # the smallest relative change these seeds and spreads could detect at alpha
    equal_tokens: EqualTokens | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def reached_all(self) -> bool:
        return bool(self.runs) and all(r.reached for r in self.runs)


@dataclass
class RaceSection:
    """`speedladder race`: the target, how it was set, the val set, the rule, and every configuration's runs."""

    target_loss: float | None = None
    target_from: str = ""  # "--target-loss", or the calibration that set it
    calibration: RaceRun | None = None  # eager fp32 on a seed of its own, when the target was calibrated
    calibrate_steps: int | None = None
    seeds: list[int] = field(default_factory=list)
    eval_every: int = 0  # base steps' worth of tokens between evaluations
    eval_tokens: int = 0  # ... in tokens
    val_sequences: int = 0
    val_seq_len: int = 0
    time_cap_s: float | None = None
    cap_from: str = ""
    alpha: float = 0.01
    detect: float = 0.10
    batch_lr_scale: str = "none"
    order: str = ""  # how runs were ordered (seed by seed across configurations, so drift lands on all alike)
    entries: list[RaceEntry] = field(default_factory=list)
    fastest: str | None = None  # the configuration with the shortest mean time that reached in every seed
    config: dict[str, Any] = field(default_factory=dict)  # the race's own RaceConfig, resolved, through the codec
    extra: dict[str, Any] = field(default_factory=dict)

    def entry(self, name: str) -> RaceEntry | None:
        return next((e for e in self.entries if e.name == name), None)
