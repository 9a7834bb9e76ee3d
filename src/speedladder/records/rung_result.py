"""A rung's record: one measured (or skipped, failed) rung, control, beside rung or tune candidate, with its gates
and what the profile predicted for it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from speedladder.measure.judging import Spread
from speedladder.records.checks import (
    Causality,
    Differential,
    Equivalence,
    Explanation,
    LossBand,
    ReferenceCost,
    Role,
    TokensToTarget,
)
from speedladder.records.explanation import ProfiledExplanation
from speedladder.records.timing import TimingRecord
from speedladder.spec import StepSpec


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
    explanation: Explanation | None = None  # a failed gate's: where the divergence starts (verify/bisection.py)
    # The run stopped (Ctrl-C, a cap) during this rung's gates, after it was timed: its speed stands, unverified.
    cut: bool = False
    seconds: dict[str, float] = field(default_factory=dict)  # what this gate's steps cost (verify/gate_rule.py), by step
    references: list[ReferenceCost] = field(default_factory=list)  # the references this gate built, and their cost
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
    spec: StepSpec | None  # what the rung measured; None: a rung whose spec could not be made
    precision: str
    requirement: dict[str, Any]
    status: str = "pending"  # "ok", "skipped", "oom", "error", "interrupted" (or "pending" while it runs)
    source: str = "built-in"  # where the rung was declared: built-in, or the user's rung file or module
    detail: str = ""
    predicted: Prediction | None = None
    wall_s: float | None = None  # the whole rung: build, compile, windows and gates
    peak_memory_bytes: int | None = None
    peak_reserved_bytes: int | None = None  # CUDA's reserved peak: CUDA graphs' pools are reserved, not allocated
    # CUDA: what the process held allocated when the rung's peaks were reset (the gates' references, ...): both
    # peaks above are over it, the rung's own; None off CUDA and in files from before it (their peaks include it).
    held_before_bytes: int | None = None
    timing: TimingRecord | None = None  # measure/timer.Timing as saved: every window's raw time
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
    base_timing: TimingRecord | None = None  # the base re-timed beside this rung: its interleaved windows
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
    # Memory (ladder/rung_memory.py): what one forward saved for backward, that predicted from the shapes, and off CUDA the
    # resident set before the step and its high-water mark during it (a child process); how, or why not.
    saved_activation_bytes: int | None = None
    predicted_activation_bytes: int | None = None
    process_base_bytes: int | None = None
    process_peak_bytes: int | None = None
    memory_note: str = ""
    explanation: ProfiledExplanation | None = None  # a prediction missed beyond the limit: base and rung profiled
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
