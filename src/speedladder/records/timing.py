"""A rung's timing as results.json keeps it: measure/timer.Timing and its windows, field for field."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from speedladder.codec import from_data
from speedladder.measure.timer import Timing


@dataclass
class WindowRecord:
    """One timed window (measure/timer.Window as saved)."""

    seconds: float
    steps: int
    tokens: int
    recompiles: int = 0  # graphs compiled while it ran: any leaves it out of the statistics
    other_cores: float | None = None  # other processes' mean cores while it ran (None: not read)
    shared: bool = False
    steal_cores: float | None = None  # the hypervisor's steal while it ran, as mean cores (None: not read)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class TimingRecord:
    """Every window's raw time and the warm-up before them (measure/timer.Timing as saved). A mirror rather than
    Timing itself, so that a saved key this version does not know is kept in `extra`."""

    first_step_s: float = 0.0
    warmup_step_s: list[float] = field(default_factory=list)
    warmup_compiled: list[bool] = field(default_factory=list)
    windows: list[WindowRecord] = field(default_factory=list)
    settled: bool = True
    cache_hits: int = 0  # graphs that came from a compile cache during warm-up
    warmup_recorded: list[bool] = field(default_factory=list)
    window_steps: int | None = None
    sized_from_step_s: float | None = None  # the step time the window length was sized from (CUDA)
    min_window_s: float | None = None
    short: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, timing: Timing) -> TimingRecord:
        """The record of a measurement's timing, by the codec's rules (what results.json has always held)."""
        return from_data(cls, dataclasses.asdict(timing), cls.__name__)
