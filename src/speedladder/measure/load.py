"""Whether the machine was alone while we timed: the CPU time other processes used, read from /proc between windows.

A second process on a core slows a multi-threaded CPU step many times over, and the windows cannot say why. So
the busy time of the cores this process may run on (/proc/stat's per-CPU lines: user, nice, system, irq, softirq
and steal, the time a hypervisor gave another machine) is read right before each timed window and right after it,
never inside one, and this process's own CPU time (its threads and its waited-for children, os.times) is taken
away: what is left is the others'. A window in which the others averaged SHARED_CORES or more shared the machine
with it. Which processes they were is read from every /proc/PID/stat before the first window of a measurement and
after its last, when one of its windows was shared (a few milliseconds; never inside a window).

The kernel counts CPU time in clock ticks (10 ms at the usual 100 Hz), so a window shorter than a few ticks cannot
be judged: the others must also have used MIN_OTHER_S of CPU time in it. Linux only: elsewhere `Meter.open`
gives None, and nothing is read or recorded.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
SHARED_CORES = 0.25  # others averaging a quarter of a core over a window shared the machine with it
MIN_OTHER_S = 0.05  # ... and used at least this much CPU time in it: five ticks, beyond the counters' rounding
BEFORE_S = 0.2  # the sample of the machine before anything runs: this process sleeps through it
BUSY_FIELDS = (0, 1, 2, 5, 6)  # of a /proc/stat cpu line's numbers: user nice system (not idle, iowait) irq softirq
STEAL = 7  # steal: time the hypervisor ran another machine on this core


@dataclass(frozen=True)
class Reading:
    """The counters at one moment: the wall clock, the cores' busy time, the hypervisor's share of it, and ours."""

    wall: float  # time.perf_counter()
    busy_s: float  # busy seconds of this process's cores since boot, steal included
    steal_s: float  # of which the hypervisor gave to another machine
    own_s: float  # this process's CPU seconds and its waited-for children's


@dataclass(frozen=True)
class Other:
    """What other processes used over a span: CPU seconds, as mean cores, and whether that shared the machine."""

    seconds: float
    wall: float  # the wall seconds between the two readings
    cores: float
    shared: bool


@dataclass(frozen=True)
class Busy:
    """One other process (or the hypervisor's steal) and the mean cores it used over a span."""

    name: str
    pid: int | None
    cores: float


Snapshot = tuple[Reading, dict[int, tuple[str, float]]]  # the counters, and every other process's name and CPU seconds


def shared(other_s: float, wall_s: float) -> bool:
    """Whether others' CPU time over a span of wall time means they shared the machine with it."""
    return wall_s > 0 and other_s >= MIN_OTHER_S and other_s / wall_s >= SHARED_CORES


class Meter:
    """Reads the machine's load for one process: `read` around a window, `between` two readings, `snapshot` and
    `busiest` to name the others."""

    def __init__(self, root: Path, cpus: tuple[int, ...], tick_s: float) -> None:
        self.root, self.cpus, self.tick_s = root, cpus, tick_s

    @classmethod
    def open(cls, root: Path | None = None) -> Meter | None:
        """A meter for this process's cores, or None where /proc/stat cannot be read (not Linux)."""
        root = PROC if root is None else root
        try:
            lines = (root / "stat").read_text().splitlines()
            tick_s = 1.0 / os.sysconf("SC_CLK_TCK")
            allowed = os.sched_getaffinity(0)
        except (OSError, ValueError, AttributeError):
            return None
        present = {int(ln.split()[0][3:]) for ln in lines if ln.startswith("cpu") and ln[3:4].isdigit()}
        cpus = tuple(sorted(present & allowed)) or tuple(sorted(present))
        return cls(root, cpus, tick_s) if cpus else None

    @property
    def cores(self) -> int:
        return len(self.cpus)

    def read(self) -> Reading:
        busy = steal = 0
        for ln in (self.root / "stat").read_text().splitlines():
            if ln.startswith("cpu") and ln[3:4].isdigit():
                name, *numbers = ln.split()
                if int(name[3:]) in self.cpus:
                    values = [int(v) for v in numbers]
                    busy += sum(values[i] for i in BUSY_FIELDS if i < len(values))
                    steal += values[STEAL] if len(values) > STEAL else 0
        t = os.times()
        own = t.user + t.system + t.children_user + t.children_system
        return Reading(time.perf_counter(), (busy + steal) * self.tick_s, steal * self.tick_s, own)

    def between(self, a: Reading, b: Reading) -> Other:
        """Others' CPU time from reading a to reading b (never below zero: the counters round apart)."""
        other = max(0.0, (b.busy_s - a.busy_s) - (b.own_s - a.own_s))
        wall = b.wall - a.wall
        return Other(other, wall, min(other / wall, self.cores) if wall > 0 else 0.0, shared(other, wall))

    def before(self, seconds: float = BEFORE_S) -> Other:
        """Others' load over a short sample, this process asleep: what the machine was doing before we began."""
        a = self.read()
        time.sleep(seconds)
        return self.between(a, self.read())

    def loadavg(self) -> float | None:
        """/proc/loadavg's 1-minute figure (runnable and waiting tasks, ours included), or None."""
        try:
            return float((self.root / "loadavg").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def snapshot(self) -> Snapshot:
        """Every other process's name and CPU seconds so far, by pid, with a reading of the counters. Only this
        process is left out: a child of ours that runs beside a window is as much a neighbour as a stranger."""
        reading, me = self.read(), os.getpid()
        others: dict[int, tuple[str, float]] = {}
        for entry in self.root.iterdir():
            if not entry.name.isdigit() or int(entry.name) == me:
                continue
            try:
                text = (entry / "stat").read_text()
            except OSError:  # it ended meanwhile
                continue
            # "pid (name) state ppid ...": the name may hold spaces and parentheses; utime and stime follow it.
            name, rest = text[text.index("(") + 1:text.rindex(")")], text[text.rindex(")") + 2:].split()
            others[int(entry.name)] = (name, (int(rest[11]) + int(rest[12])) * self.tick_s)
        return reading, others

    def busiest(self, a: Snapshot, b: Snapshot, n: int = 10) -> list[Busy]:
        """The other processes that used the most CPU between two snapshots (each at least MIN_OTHER_S), and the
        hypervisor's steal when it took that much, as mean cores over the span: the busiest first, n at most."""
        wall = b[0].wall - a[0].wall
        if wall <= 0:
            return []
        # A process that began between the two has all its CPU time inside the span.
        used: list[tuple[float, str, int | None]] = [(cpu - a[1].get(pid, (name, 0.0))[1], name, pid)
                                                     for pid, (name, cpu) in b[1].items()]
        used.append((b[0].steal_s - a[0].steal_s, "steal: another machine on this host", None))
        top = sorted((u for u in used if u[0] >= MIN_OTHER_S), key=lambda u: -u[0])[:n]
        return [Busy(name, pid, seconds / wall) for seconds, name, pid in top]
