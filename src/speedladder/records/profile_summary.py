"""The profiled step's record (profile/step_profile.py): categories, regime, device facts; or the error that stopped it."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from speedladder.spec import StepSpec


@dataclass
class CategoryTime:
    """One operator category of the median profiled step (profile/categories.breakdown)."""

    ms: float = 0.0
    share: float = 0.0  # of the step
    floor_ms: float = 0.0  # each operator's fixed cost within it (CPU only)
    ms_iqr: list[float] | None = None  # across the steps; None in a file from before they were kept
    share_iqr: list[float] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class StepFigures:
    """One profiled step: its wall time, operators, and ms (and fixed cost) by category."""

    wall_ms: float = 0.0
    ops: int = 0
    ms: dict[str, float] = field(default_factory=dict)  # by category name
    floor_ms: dict[str, float] = field(default_factory=dict)
    minor_faults: int | None = None  # pages the kernel mapped for the step (profile/step_profile.py)
    wait_share: float | None = None  # a CPU step's threads waiting for a core, over the core time it asked for
    device_ms: float | None = None  # CUDA: the union of the step's kernel intervals (None on a CPU, or older files)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_plain(self) -> dict[str, Any]:
        """As saved: the figures the child adds only where it read them are left out when absent."""
        out: dict[str, Any] = {"wall_ms": self.wall_ms, "ops": self.ops, "ms": self.ms, "floor_ms": self.floor_ms}
        for name in ("minor_faults", "wait_share", "device_ms"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return {**out, **self.extra}


@dataclass
class ProfilePrediction:
    """A rung's predicted × from the baseline's profile, chained along the ladder (profile/predict.Prediction)."""

    rung: str
    speedup: float | None  # None: no prediction model for the rung
    reason: str
    parts_ms: dict[str, float] = field(default_factory=dict)  # the predicted step, by the model's part
    tokens_per_step: int = 0
    speedup_iqr: list[float] | None = None  # the same made from each profiled step alone: its quartiles
    # Where host and device are apart (CUDA): the predicted step's host and device time (profiled ms) and which of
    # the two bounds it ("host" or "device"); None on a CPU, or in a file from before them.
    host_ms: float | None = None
    device_ms: float | None = None
    bound: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


FP32, BF16 = "fp32", "bf16"  # the precisions the matmul facts are keyed by


@dataclass
class MatmulFacts:
    """This model's own matmul shapes timed in fp32 and bf16, and the device's matmul ceiling (measure/microbench.py).
    The per-precision figures are keyed by precision (FP32, BF16). None measured (no facts asked for, or a model
    without our GPT's shapes): saved as an empty table, as the child writes it."""

    ceiling_tflops: dict[str, float] = field(default_factory=dict)  # an n³ matmul's TFLOP/s
    ceiling_n: int | None = None
    shapes: list[dict[str, Any]] = field(default_factory=list)  # each shape timed: its sizes, <precision>[_k]_ms
    skipped: list[str] = field(default_factory=list)  # shapes too slow for the budget, or out of memory
    multiplier: int | None = None  # the batch-up multiple the "_k" times were taken at
    bf16_speedup: float | None = None
    batch_gain: dict[str, float | None] = field(default_factory=dict)
    attention_fraction: dict[str, float] = field(default_factory=dict)
    head_fraction: dict[str, float] = field(default_factory=dict)
    pad_vocab_speedup: dict[str, float] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def measured(self) -> bool:
        """Any fact in it (the child writes all of them or none)."""
        return self != MatmulFacts(extra=self.extra)

    def to_plain(self) -> dict[str, Any]:
        """As saved: every fact, or an empty table where none was measured."""
        if not self.measured:
            return dict(self.extra)
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}
        return {**out, **self.extra}


@dataclass
class ProfileSummary:
    """The profiled step (profile/step_profile.py): categories, regime, device facts; or the error that stopped it."""

    error: str | None = None
    categories: dict[str, CategoryTime] = field(default_factory=dict)  # by category name
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
    spec: StepSpec | None = None  # None in a file whose profile saved no spec
    rungs: list[str] = field(default_factory=list)
    device_type: str | None = None
    tokens_per_step: int | None = None
    params: int | None = None
    model: dict[str, Any] | None = None
    matmuls: MatmulFacts = field(default_factory=MatmulFacts)
    copy_gbps: float | None = None
    trace: str | None = None
    # A compiled spec's: graphs, recompiles, graph breaks (count and reasons), kernel calls of its generated code
    # (profile/child.compiler_facts); None for an eager one, or a file from before it.
    compiler: dict[str, Any] | None = None
    # Step by step: `categories` is the median step (each category's median across the steps, with its
    # "ms_iqr" and "share_iqr"); these keep the steps themselves and what their spread says.
    per_step: list[StepFigures] = field(default_factory=list)
    spread_basis: str = ""  # what the ranges are (the interquartile range across the steps)
    outlier_steps: list[int] = field(default_factory=list)  # indices into per_step of steps far outside the others
    outlier_rule: str = ""
    bucket_iqr: dict[str, list[float]] = field(default_factory=dict)  # compute, memory, overhead across the steps
    unsteady: bool = False  # the steps' wall times spread widely (a busy machine); said, not a borderline by itself
    starved: bool = False  # a multi-threaded CPU step's threads waited for cores other processes held
    threads: int | None = None  # intra-op threads of a CPU step (None: not a CPU profile, or an older file)
    borderline: list[str] = field(default_factory=list)  # the two regimes the margin cannot tell apart; [] if clear
    regime_label: str | None = None  # the regime, or "borderline (compute / memory)"; None in older files
    # Host and device apart (CUDA; None on a CPU, whose host is its device, and in files from before them): the host's
    # part of a step (issuing its work, timed without the profiler), the device's busy time (the union of its kernel
    # intervals, median step), the unprofiled step (back to back), and what of it did not overlap.
    host_ms: float | None = None
    device_ms: float | None = None
    timed_step_ms: float | None = None
    serial_ms: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str | None:
        """The regime as it should be said: borderline where the margin is inside the spread."""
        return self.regime_label or self.regime

    @property
    def apart(self) -> bool:
        """Host and device timed apart (CUDA): the step costs about the larger of the two, not their sum."""
        return self.host_ms is not None and self.device_ms is not None

    @property
    def bound(self) -> str | None:
        """"host" or "device": which takes longer a step, where they are apart."""
        if self.host_ms is None or self.device_ms is None:
            return None
        return "host" if self.host_ms >= self.device_ms else "device"
