"""The race's typed records (racing/, `speedladder race`): a run, the equal-token comparison, a configuration, the
section. Imported through speedladder.records, which the rest of the package reads."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from speedladder.config.settings import RaceConfig
from speedladder.measure.stats import Summary
from speedladder.records.checks import Causality
from speedladder.spec import StepSpec

# A race's configuration: a step of a cumulative ladder, given rungs together, a run's winner, or a tune finalist.
RaceRole = Literal["rung", "combo", "winner", "finalist"]


@dataclass
class RaceRun:
    """One configuration trained from one seed until its val loss reached the target, or it was stopped.

    The curve is kept as columns, one entry per evaluation (the first at step 0, before any training):
    `seconds` is the training clock there, which runs over training steps only (compile, warm-up and every
    evaluation are outside it).

    The time to the target (`seconds`, `tokens`, `steps`) is where the curve crosses the target, interpolated
    linearly between the evaluation above it and the first at or below it; `first_eval_*` keep that first
    evaluation's own figures. A run that did not reach is censored: its time to the target is more than
    `train_seconds`, the clock when it stopped.
    """

    seed: int
    stopped: str  # "reached", "time cap", "diverged" (a non-finite val loss), "steps" or "error: ..."
    seconds: float | None = None  # the training clock where the val loss crossed the target (interpolated)
    tokens: float | None = None  # tokens trained by then (interpolated)
    steps: float | None = None
    first_eval_seconds: float | None = None  # the clock at the first evaluation at or below the target
    first_eval_tokens: int | None = None
    first_eval_steps: int | None = None
    best_loss: float | None = None  # the lowest val loss seen, and when
    best_seconds: float | None = None
    best_tokens: int | None = None
    train_seconds: float = 0.0  # the training clock when it stopped
    train_tokens: int | None = None  # tokens trained when it stopped (past its last evaluation too)
    train_steps: int | None = None
    eval_seconds: float = 0.0  # wall time of its evaluations, the clock paused
    recompiles: int = 0  # graphs compiled while the clock ran: a time that includes compiling
    stage: int | None = None  # the stage it ran in (RaceStage.index)
    position: int | None = None  # its place in its seed's order within the stage, from 0
    cap_s: float | None = None  # the clock at which it would be stopped
    cap_from: str = ""  # why that cap ("2x compile's time in this seed", "the race's time cap", ...)
    budget_loss: float | None = None  # the val loss at the race's token budget (interpolated); None: not trained
    # Other processes' mean cores while its clock ran, read from /proc between its stretches (measure/machine_load.py; None
    # where not read), and whether that shared the machine with it.
    other_cores: float | None = None
    shared: bool = False
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
class PairedTest:
    """A configuration's times against its base's, seed by seed (stats.paired): per seed, the bounds of
    log(time) - log(base's time), equal where both reached; null where a censored run leaves one side unbounded."""

    seeds: list[int]
    low: list[float | None]
    high: list[float | None]
    p_win: float
    p_loss: float
    ratio: float | None  # time over the base's time, the geometric mean over seeds; see `bound`
    bound: str | None  # None: exact; "at least" or "at most" (censored runs counted at their clock)
    sd: float | None  # the spread of the exact per-seed log ratios
    detectable: float | None  # the relative change these seeds would find with 80% power at alpha
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class BudgetCheck:
    """modded-nanogpt's criterion: the val loss at a fixed token budget, one value per seed, with a one-sided
    one-sample t-test that its mean is below the target (stats.below)."""

    tokens: int  # the budget in tokens (budget_steps base steps' worth)
    losses: list[float | None]  # per seed; None: the run stopped before the budget
    mean: float | None
    p_below: float | None
    passed: bool  # p_below < alpha
    detail: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class RaceStage:
    """One stage of a race: its configurations trained seed by seed, in an order rotated from seed to seed
    (a Latin square: with two, base-rung then rung-base, ABBA over the seeds), each judged against `base`."""

    index: int
    names: list[str]  # the configurations, the first order's
    base: str
    orders: list[list[str]] = field(default_factory=list)  # per seed, the order the runs went in
    wall_s: float | None = None  # the stage's wall time, evaluations and all
    decided: list[str] = field(default_factory=list)  # configurations whose later seeds were not run (capped out)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class EqualTokens:
    """A rung that changes how the model learns (batch, optimizer, learning rate) against its base at equal tokens:
    per seed, both val losses where the shorter of the two runs stopped; a one-sided t-test paired by seed that
    it is worse there."""

    tokens: list[int]  # per seed: the tokens both runs trained
    loss: list[float]  # the rung's val loss there (interpolated between evaluations)
    base_loss: list[float]
    p_worse: float | None
    worse: bool  # p_worse below alpha
    detail: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class RaceEntry:
    """One configuration of a race: what it is, how it was prepared, its runs and its verdict.

    `runs` holds every run of it, in every stage it ran in (as the rung judged, or as the base of a later stage);
    its own are those of `stage`, the stage where it was judged (the baseline's: its first). The verdict pairs
    them by seed with its base's runs of the same stage.
    """

    name: str
    rungs: list[str]  # composed on the workload's eager fp32 spec, in order
    role: RaceRole
    reason: str
    kind: str  # the last rung's kind: "speed", "memory" or "optimizer"
    built_on: str | None  # the entry it is judged against
    spec: StepSpec
    precision: str
    status: str = "pending"  # "ok", "skipped", "error", "failed" (the causality probe) or "pending"
    detail: str = ""
    changes_learning: bool = False  # batch, optimizer or learning rate differ from its base's
    compile_s: float | None = None  # first step and compiling warm-up steps, less steady steps: outside the clock
    warmup_s: float | None = None  # the whole warm-up, outside the clock
    causality: Causality | None = None  # the gates' probe on this configuration's own shape
    stage: int | None = None  # the stage where it was judged (the baseline: the first it ran in)
    runs: list[RaceRun] = field(default_factory=list)
    time: Summary | None = None  # seconds to the target over its own runs that reached it
    tokens: Summary | None = None
    steps: Summary | None = None
    tokens_per_s: float | None = None  # median over its own runs of tokens trained / training clock
    speedup_prev: float | None = None  # the base's time to target over this one's, paired by seed (geometric)
    speedup_bound: str | None = None  # None: exact; "at most" or "at least" when censored runs bound it
    speedup_cum: float | None = None  # against the baseline: the chain of paired ratios down to it
    speedup_cum_bound: str | None = None  # None: exact; "at least" or "at most" when a link of the chain is a bound
    tokens_per_s_prev: float | None = None  # tokens/s against the base's, from the same stage's runs
    tokens_per_s_cum: float | None = None
    token_ratio: float | None = None  # mean tokens to target over the base's: above 1 needs more tokens
    verdict: str | None = None  # "baseline", "win", "loss", "noise", "did not reach", "not a win" or None
    verdict_detail: str = ""
    p_win: float | None = None  # the paired test, one-sided: faster than its base
    p_loss: float | None = None  # ... slower
    detectable: float | None = None  # the relative change these seeds would find with 80% power at alpha
    paired: PairedTest | None = None
    equal_tokens: EqualTokens | None = None
    budget: BudgetCheck | None = None  # modded-nanogpt's criterion
    built_upon: bool | None = None  # a cumulative ladder's next stage built on it (a win, or noise above 1.0x)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def own_runs(self) -> list[RaceRun]:
        """Its runs in the stage where it was judged (every run, in a file from before stages)."""
        return [r for r in self.runs if r.stage == self.stage] if self.stage is not None else list(self.runs)

    def runs_in(self, stage: int | None) -> list[RaceRun]:
        return [r for r in self.runs if r.stage == stage]

    @property
    def reached_all(self) -> bool:
        own = self.own_runs
        return bool(own) and all(r.reached for r in own)


@dataclass
class RaceSection:
    """`speedladder race`: the target, how it was set, the val set, the rule, and every configuration's runs."""

    target_loss: float | None = None
    target_from: str = ""  # "--target-loss", the calibration that set it, or the race it was taken from
    calibration: RaceRun | None = None  # eager fp32 on a seed of its own, when the target was calibrated
    calibrate_steps: int | None = None
    seeds: list[int] = field(default_factory=list)
    eval_every: int = 0  # base steps' worth of tokens between evaluations
    eval_tokens: int = 0  # ... in tokens
    val_sequences: int = 0
    val_seq_len: int = 0
    val_hash: str | None = None  # sha256 of the val set's token ids (its first 16 hex digits): the ruler's identity
    time_cap_s: float | None = None  # the race's own cap: every run stops there at the latest
    cap_from: str = ""
    cap_factor: float | None = None  # a run stops at this multiple of its base's time in the same seed
    budget_tokens: int | None = None  # modded-nanogpt's criterion: the val loss at this many tokens
    budget_steps: int | None = None  # ... in base steps
    alpha: float = 0.01
    detect: float = 0.10
    batch_lr_scale: str = "none"
    stack_all: bool = False  # every configuration that ran built upon, losers too
    order: str = ""  # how runs were ordered (rotated from seed to seed within each stage)
    stages: list[RaceStage] = field(default_factory=list)
    entries: list[RaceEntry] = field(default_factory=list)
    fastest: str | None = None  # the configuration fastest to the target (the chained paired ratio)
    config: RaceConfig | None = None  # the race's own configuration, resolved (None in a file of before it was kept)
    extra: dict[str, Any] = field(default_factory=dict)

    def entry(self, name: str) -> RaceEntry | None:
        return next((e for e in self.entries if e.name == name), None)


# -- the ruler: what two races' times must share to be compared (racing/target.py) ------------------------

def ruler(race: RaceSection | dict[str, Any]) -> dict[str, Any]:
    """A race section's ruler (the record, or as saved), as plain values."""
    if isinstance(race, RaceSection):
        return {"target": race.target_loss, "val set": race.val_hash,
                "val windows": (race.val_sequences, race.val_seq_len), "eval every": race.eval_tokens}
    return {"target": race.get("target_loss"), "val set": race.get("val_hash"),
            "val windows": (race.get("val_sequences"), race.get("val_seq_len")),
            "eval every": race.get("eval_tokens")}


def _same(key: str, a: Any, b: Any) -> bool:
    if a is None or b is None:
        return key == "val set"  # a file from before the val set's hash was kept: nothing to compare
    if key == "target":
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=0.0)
    return a == b


def _show(key: str, v: Any) -> str:
    if key == "target":
        return f"{v:.4f}" if isinstance(v, (int, float)) else str(v)
    if key == "val windows":
        return f"{v[0]} x {v[1]} tokens"
    if key == "eval every":
        return f"{v:,} tokens" if isinstance(v, int) else str(v)
    return str(v)


def ruler_differences(a: RaceSection | dict[str, Any], b: RaceSection | dict[str, Any]) -> list[str]:
    """How two saved race sections' rulers differ ("target 2.0954 vs 2.1098", ...); empty when they agree."""
    ra, rb = ruler(a), ruler(b)
    return [f"{k} {_show(k, ra[k])} vs {_show(k, rb[k])}" for k in ra if not _same(k, ra[k], rb[k])]
