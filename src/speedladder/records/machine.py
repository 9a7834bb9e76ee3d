"""Whether the machine was alone while a run timed its windows or a race its runs (measure/machine_load.py), as a record.

Every field has a default, so a file from before it loads (its `machine` is null: not read).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from speedladder.measure.machine_load import Busy

NAMED = 10  # the busiest other processes kept (the header names the first three)


@dataclass
class BusyProcess:
    """Another process that used CPU time while windows were shared, as mean cores over the measurement it was read
    across (files from before steal was read apart may hold "steal: another machine on this host" among them)."""

    name: str = ""
    pid: int | None = None
    cores: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class MachineLoad:
    """Other processes' CPU time before and during the timed windows of a run, and the clocked stretches of a race's
    runs, read from /proc between windows and stretches, never inside one. A run's window is judged alone; a race's
    run over all its stretches (one can be shorter than the counters' ticks)."""

    cores: int = 0  # the cores this process may run on: what the others' load is read on
    # Others averaging this many cores over a window shared the machine with it: load.shared_cores(cores), a
    # sixteenth of the cores and at least a quarter of one (files from before it: 0.25 whatever the cores).
    shared_cores: float = 0.0
    before: float | None = None  # others' mean cores over a short sample before anything ran
    loadavg: float | None = None  # /proc/loadavg's 1-minute figure then (ours included)
    windows: int = 0  # timed windows read (a rung's and its base's beside it)
    shared_windows: int = 0  # of those, the ones others shared the machine with
    runs: int = 0  # race runs read
    shared_runs: int = 0
    most: float = 0.0  # the most cores the others used over one window or run
    # The hypervisor's steal, apart from the others (no process here: it slows every core of ours alike), as mean
    # cores: over the sample before anything ran, and the most over one timed window. None: not read apart.
    steal_before: float | None = None
    steal_most: float | None = None
    processes: list[BusyProcess] = field(default_factory=list)  # the busiest others while one was shared
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def alone(self) -> bool:
        """Nothing else ran: before the first window, nor during any window or run."""
        return (self.shared_windows == 0 and self.shared_runs == 0
                and (self.before is None or self.before < self.shared_cores))

    def add(self, others: Sequence[float], shared: Sequence[bool], runs: bool = False,
            steal: Sequence[float] = ()) -> None:
        """Windows (or race runs) read: the others' mean cores over each, whether each was shared, and the steal
        over each where it was read."""
        if runs:
            self.runs, self.shared_runs = self.runs + len(others), self.shared_runs + sum(shared)
        else:
            self.windows, self.shared_windows = self.windows + len(others), self.shared_windows + sum(shared)
        self.most = max([self.most, *others])
        if steal:
            self.steal_most = max([self.steal_most or 0.0, *steal])

    def name(self, busy: Sequence[Busy]) -> None:
        """Other processes seen while a window was shared: each kept once, at the most cores it was seen using."""
        by_key = {(p.name, p.pid): p for p in self.processes}
        for b in busy:
            seen = by_key.get((b.name, b.pid))
            if seen is None:
                by_key[(b.name, b.pid)] = BusyProcess(b.name, b.pid, b.cores)
            else:
                seen.cores = max(seen.cores, b.cores)
        self.processes = sorted(by_key.values(), key=lambda p: -p.cores)[:NAMED]
