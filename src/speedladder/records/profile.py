"""The profiled step's record (profile/child.py): categories, regime, device facts; or the error that stopped it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


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
