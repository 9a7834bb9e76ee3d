"""The gates' checks, the learns-check and tune's section as typed records (docs/measurement.md, rules 7 and 9).

Every field has a default, so a file that lacks one (an older version's, or a check that did not apply) loads;
a field a record does not declare lands in its `extra`. `applies: False` marks a check that does not apply to
the rung (its `detail` says why): it passes, and measures nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class Role(str, Enum):
    """What a measured record is in its run: a str, so a saved "rung" and Role.RUNG are the same value."""

    RUNG = "rung"  # a step of the ladder
    CONTROL = "control"  # the batch rung's fp32 control at the same batch
    BESIDE = "beside"  # measured on the ladder's top, not built upon
    CANDIDATE = "candidate"  # a combination tune measured
    FINAL = "final"  # a tune finalist measured again beside eager

    def __str__(self) -> str:
        return self.value


@dataclass
class Check:
    """What every check says: whether it applies, whether it passed, and why not."""

    applies: bool = True
    passed: bool = True
    detail: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Distance:
    """One quantity's distance from the truth (verify/distance.py), each relative to its scale: eager's at the rung's
    precision, the rung it built on (same precision and shape; None otherwise), the rung's own, and what it may be."""

    name: str = ""
    eager: float | None = None
    base: float | None = None
    rung: float | None = None
    allowed: float | None = None
    kinks: float | None = None  # added to `allowed`: what kinks the probe could not avoid could move it by
    spread: float | None = None  # the curve's: the largest distance of eager fp32 re-rounded, a floor of its scale
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Kinks:
    """Where the function has kinks and ties near one check's probe (verify/kink_census.py): elements within rounding
    of a ReLU's zero, a clamp's bound, a tie of max or top-k, a comparison's threshold. 0 is a census that found
    none; `ran` False says why none was taken (the gate then judges as if there were none, and says so)."""

    ran: bool = True
    detail: str = ""  # why the census could not run, or what it could not do (the probe not moved)
    band: str = ""  # what "within rounding" means: BAND_K x eager's RMS deviation from fp64 at the op's input
    ops: int = 0  # kink ops the forward ran (relu, clamp, max, comparisons, ...)
    elements: int = 0  # their input elements
    near_first: int = 0  # elements within the band in the first gate batch, before the probe was moved
    near: int = 0  # elements within the band at the probe used: 0 is a probe no rounding can cross
    by_op: dict[str, int] = field(default_factory=dict)  # near_first by op
    probe: str = ""  # which sequences the probe is made of, in words
    rows: list[list[int]] = field(default_factory=list)  # [gate batch, row] per probe row; [] for gate batch 0
    precision: str = "fp32"  # the check's precision
    near_at_precision: int | None = None  # within eager's band at a lower precision: crossed by eager there too
    priced: int = 0  # of `near`, the elements whose flips were priced in fp64 and allowed for (verify/flip_pricing.py)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Fp64(Check):
    """A rung's error judged against the truth: per quantity, rung <= k x max(eager, base) + floor
    (verify/distance.py)."""

    k: float | None = None
    floor: float | None = None
    scale: str = ""  # what set the scale: "eager fp32", "eager bf16 and sdpa (the rung it built on)"
    logits: Distance | None = None
    loss: Distance | None = None
    grad: Distance | None = None  # the worst gradient tensor, by its distance over what it is allowed
    curve: Distance | None = None  # the loss curve over the gate batches (the differential's only)
    tensors: int = 0  # gradient tensors judged
    kinks: Kinks | None = None  # the census at this check's weights and probe; None in files from before it
    # What the distances are measured from: "fp64", or "eager fp32" where float64 could not run (the verdict's
    # status: the allowance then grows by what eager fp32's own error may be; verify/tolerance.py).
    truth: str = "fp64"


@dataclass
class Equivalence(Check):
    """Logits, loss and gradients of the rung against eager fp32, on the same weights and batch."""

    precision: str = ""
    rtol: float | None = None  # the tolerances used, and why
    atol: float | None = None
    loss_rtol: float | None = None
    grad_rel_tol: float | None = None
    tolerance_why: str = ""
    logits_max_abs_err: float | None = None  # what was measured; None: the forward returns a loss only
    logits_rel_err: float | None = None
    loss: float | None = None
    loss_ref: float | None = None
    grad_rel_err: float | None = None  # the worst parameter's gradient, relative to its norm
    grad_worst: str | None = None
    logits: str | None = None  # why the logits were not compared, when they were not
    # The truth `fp64` measured from: "fp64", or "eager fp32" where float64 could not run (`fp64_why`). Files
    # before the one rule say "table": judged by a fixed per-precision table against eager fp32 (the tolerance
    # fields above, None since).
    rule: str = "table"
    fp64: Fp64 | None = None
    fp64_why: str = ""


@dataclass
class LossBand(Check):
    """The rung's loss over eager fp32's, step by step over the same batches."""

    steps: int = 0
    band: float | None = None
    max_rel_diff: float | None = None
    losses: Sequence[float | None] = field(default_factory=list)
    ref_losses: Sequence[float | None] = field(default_factory=list)


@dataclass
class TokensToTarget(Check):
    """A rung that changes the update rule against AdamW: the tokens each needs to reach AdamW's final loss."""

    steps: int = 0
    target_loss: float | None = None
    window: int | None = None
    tokens: int | None = None
    adamw_tokens: int | None = None
    token_ratio: float | None = None
    losses: Sequence[float | None] = field(default_factory=list)
    adamw_losses: Sequence[float | None] = field(default_factory=list)


@dataclass
class Causality(Check):
    """The future tokens changed: the past logits must not move beyond the rung's own noise."""

    position: int | None = None
    past_max_abs: float | None = None
    future_max_abs: float | None = None
    noise_max_abs: float | None = None
    allowed: float | None = None
    how: str = ""


@dataclass
class Differential(Check):
    """The rung against the rung it built on, at the same precision and shape, at the probe weights."""

    base: str | None = None
    precision: str = ""
    logits_rel: float | None = None
    logits_allowed: float | None = None
    grad_worst: str | None = None
    grad_rel: float | None = None
    grad_allowed: float | None = None
    base_logits_rel_to_fp32: float | None = None
    base_grad_rel_to_fp32: float | None = None
    k: float | None = None
    floor: float | None = None
    curve_rel: float | None = None
    curve_allowed: float | None = None
    # The truth `fp64` measured from at the probe weights: "fp64", or "eager fp32" where float64 could not run
    # (logits_rel, grad_rel and curve_rel are distances from it). Files before the one rule say "base": against
    # the base itself, allowed k x the base's distance from eager fp32 + floor.
    rule: str = "base"
    fp64: Fp64 | None = None


LEARNS_PASSED, LEARNS_FAILED, LEARNS_NOT_CHECKED = "passed", "failed", "not checked"  # LearnsCheck.state


@dataclass
class LearnsCheck(Check):
    """The fastest configuration trained beside eager fp32 over the same batches: it must learn as well.

    A check that did not run (--learns-steps 0, or a run stopped before it) is `skipped`, with why in `detail`, and
    never `passed`: a file written before that rule (skipped, passed true) is read as not passed."""

    rung: str | None = None
    skipped: bool = False  # not run: --learns-steps 0, or the run stopped before it (detail says which)
    steps: int = 0
    first_loss: float | None = None
    final_loss: float | None = None  # the mean of the last tenth
    eager_final_loss: float | None = None  # None in schema 1 files, which kept `min_drop` instead
    band: float | None = None
    unigram_entropy: float | None = None
    drop: float | None = None
    losses: Sequence[float | None] = field(default_factory=list)
    eager_losses: Sequence[float | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.skipped:
            self.passed = False

    @property
    def state(self) -> str:
        """passed, failed, or not checked (skipped)."""
        return LEARNS_NOT_CHECKED if self.skipped else LEARNS_PASSED if self.passed else LEARNS_FAILED


@dataclass
class ReferenceCost:
    """What building eager fp32's reference at one batch shape cost, phase by phase (docs/measurement.md, rule 16;
    verify/reference.py names the phases)."""

    batch_size: int = 0
    seq_len: int = 0
    micro: int | None = None  # its curve accumulated over micro-batches of this many sequences
    steps: int = 0  # its loss curve's steps
    seconds: dict[str, float] = field(default_factory=dict)  # by phase, in the order they ran
    total_s: float = 0.0
    # At a batch m times the workload's: the batch whose reference its outputs, census and truth are (its probe
    # rolled m ways); None where they are its own.
    function_at: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Explanation:
    """Why a gate failed, found after it failed (verify/bisection.py): where the difference from fp64 begins, whether
    it looks like a change of function or a flip at a kink, and the command that re-runs the gates alone."""

    check: str = ""  # the check it explains: equivalence, differential, causality
    module: str | None = None  # the first module whose output or input gradient leaves the rounding band
    where: str = ""  # "output" or "output's gradient" ("gradient" before; "past positions" for causality)
    rung: float | None = None  # that module's distance from fp64
    eager: float | None = None  # eager's there, at the rung's precision
    allowed: float | None = None
    compiled: bool = False  # the uncompiled model stays in the band: the divergence is in torch.compile's code
    kind: str = ""  # "function": fails at a second probe too; "kink": passes there; "" not told
    second_probe: str = ""  # what the second probe was and showed
    summary: str = ""  # one line, for the console and the report
    command: str = ""  # re-runs this rung's gates alone on the saved run
    extra: dict[str, Any] = field(default_factory=dict)


def not_applicable(cls: type[Check], why: str) -> Any:
    """A check that does not apply to this rung: it passes, measures nothing, and says why."""
    return cls(applies=False, passed=True, detail=f"not applicable: {why}")
