"""A rung's loss or missed prediction explained (profile/explain.py, profile/side_by_side.py): its step and its base's,
profiled side by side and set against the timed figures."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any


@dataclass
class SideMs:
    """One profiler category's ms a step, base and rung (each profile scaled to its timed step when timed)."""

    base_ms: float = 0.0
    rung_ms: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class PartMs:
    """One of the prediction model's parts: its ms a step, base and rung, and the rung's as the model expected."""

    base_ms: float = 0.0
    rung_ms: float = 0.0
    expected_ms: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class TimedSteps:
    """The two steps as the windows timed them beside each other (ms), and the measured × prev."""

    base_ms: float
    rung_ms: float
    x: float
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class OpsPerStep:
    """Operators a profiled step ran, base and rung."""

    base: float | None = None
    rung: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class ProfiledExplanation:
    """Why a rung lost or missed its prediction, by measurement: or, when it could not be profiled, why not
    (`error`, then saved alone). Categories and parts are keyed by name (profile/categories.py, sides.GROUPS)."""

    error: str | None = None
    rungs: list[str] = field(default_factory=list)  # the rung's spec from eager
    base_rungs: list[str] = field(default_factory=list)  # its base's
    categories: dict[str, SideMs] = field(default_factory=dict)
    parts: dict[str, PartMs] = field(default_factory=dict)
    culprit: str | None = None  # the part that moved against the prediction most
    grew: str | None = None  # the category that grew most
    note: str = ""
    basis: str = "profiled"  # "timed": each profile scaled to its timed step; "profiled": the profiler's ms
    base_step_ms: float = 0.0  # under the profiler
    rung_step_ms: float = 0.0
    base_tokens_per_step: int | None = None
    rung_tokens_per_step: int | None = None
    profiled_x: float | None = None
    timed: TimedSteps | None = None
    adds_up: bool | None = None  # the profiled ratio within sides.ADDS_UP of the timed one
    compiler: dict[str, Any] | None = None  # a compiled rung's: profile/child.compiler_facts, as the profile keeps it
    ops_per_step: OpsPerStep = field(default_factory=OpsPerStep)
    device_type: str | None = None
    trace: str | None = None  # the rung's trace file in the run folder
    base_trace: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_plain(self) -> dict[str, Any]:
        """As saved: an explanation that could not be made is its error alone; one made has no error key."""
        if self.error is not None:
            return {"error": self.error, **self.extra}
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("error", "extra")}
        return {**out, **self.extra}
