"""Whether the machine was alone while we timed: the CPU time other processes used, read from /proc between windows.

A second process on a core slows a multi-threaded CPU step many times over, and the windows cannot say why. So
the busy time of the cores this process may run on (/proc/stat's per-CPU lines: user, nice, system, irq and
softirq) is read right before each timed window and right after it, never inside one, and this process's own CPU
time is taken away: its threads and its waited-for children (os.times), and every live descendant's (inductor's
compile workers, from /proc/PID/stat: a child of ours is not a neighbour). What is left is the others'. A window in
which the others averaged `shared_cores(cores)` or more (a sixteenth of the cores, at least a quarter of one)
shared the machine with it. Steal, the time a hypervisor gave another machine on the same host, is read apart: it
slows every core of ours alike and is no process here. Which processes the others were is read from every
/proc/PID/stat before the first window of a measurement and after its last, when one of its windows was shared.

Each reading scans /proc/PID/stat once (a few milliseconds for a hundred processes), outside the windows. The kernel
counts CPU time in clock ticks (10 ms at the usual 100 Hz), so a window shorter than a few ticks cannot be judged:
the others must also have used MIN_OTHER_S of CPU time in it. Linux only: elsewhere `Meter.open` gives None, and
nothing is read or recorded.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
SHARED_SHARE = 1 / 16  # others averaging this share of our cores over a window shared the machine with it ...
MIN_SHARED_CORES = 0.25  # ... and at least this many cores: below it, the machine's own chatter (2 cores: 0.25)
MIN_OTHER_S = 0.05  # ... and at least this much CPU time in it: five ticks, beyond the counters' rounding
BEFORE_S = 0.2  # the sample of the machine before anything runs: this process sleeps through it
BUSY_FIELDS = (0, 1, 2, 5, 6)  # of a /proc/stat cpu line's numbers: user nice system (not idle, iowait) irq softirq
STEAL = 7  # steal: time the hypervisor ran another machine on this core


def shared_cores(cores: int) -> float:
    """The others' mean cores over a window that make it shared, on a machine of `cores`: relative to the cores (a
    neighbour on one core of 16 is no neighbour on one of 2 cores), never below MIN_SHARED_CORES."""
    return max(MIN_SHARED_CORES, SHARED_SHARE * cores)


@dataclass(frozen=True)
class Reading:
    """The counters at one moment: the wall clock, the cores' busy time, the hypervisor's steal, and ours."""

    wall: float  # time.perf_counter()
    busy_s: float  # busy seconds of this process's cores since boot, steal not included
    steal_s: float  # seconds the hypervisor gave another machine on those cores
    own_s: float  # this process's CPU seconds, its waited-for children's, and its live descendants'


@dataclass(frozen=True)
class Other:
    """What other processes used over a span: CPU seconds, as mean cores, and whether that shared the machine; the
    hypervisor's steal apart, as mean cores."""

    seconds: float
    wall: float  # the wall seconds between the two readings
    cores: float
    shared: bool
    steal_cores: float = 0.0


@dataclass(frozen=True)
class Busy:
    """One other process and the mean cores it used over a span."""

    name: str
    pid: int | None
    cores: float


@dataclass(frozen=True)
class Process:
    """One /proc/PID/stat: the name, the parent, and the CPU seconds of the process and its reaped children."""

    name: str
    parent: int
    cpu_s: float


Snapshot = tuple[Reading, dict[int, tuple[str, float]]]  # the counters, and every other process's name and CPU seconds


def parse_stat(text: str, tick_s: float) -> Process:
    """A /proc/PID/stat line: "pid (name) state ppid ...", the name may hold spaces and parentheses; utime, stime,
    cutime and cstime are the 12th to 15th fields after it (a reaped child's time moves into its parent's)."""
    name, rest = text[text.index("(") + 1:text.rindex(")")], text[text.rindex(")") + 2:].split()
    return Process(name, int(rest[1]), sum(int(v) for v in rest[11:15]) * tick_s)


def processes(root: Path, tick_s: float) -> dict[int, Process]:
    """Every process's /proc/PID/stat, by pid (one that ends while it is read is left out)."""
    out: dict[int, Process] = {}
    for entry in root.iterdir():
        if entry.name.isdigit():
            try:
                out[int(entry.name)] = parse_stat((entry / "stat").read_text(), tick_s)
            except (OSError, ValueError, IndexError):  # it ended meanwhile
                continue
    return out


def descendants(procs: dict[int, Process], pid: int) -> set[int]:
    """The pids whose chain of parents reaches `pid`: its children, theirs, and so on (not `pid` itself)."""
    children: dict[int, list[int]] = {}
    for p, proc in procs.items():
        children.setdefault(proc.parent, []).append(p)
    out: set[int] = set()
    todo = list(children.get(pid, []))
    while todo:
        p = todo.pop()
        if p not in out:
            out.add(p)
            todo.extend(children.get(p, []))
    return out


def cpu_lines(text: str, cpus: tuple[int, ...], tick_s: float) -> tuple[float, float]:
    """/proc/stat's busy seconds (steal left out) and steal seconds, summed over `cpus`."""
    busy = steal = 0
    for ln in text.splitlines():
        if ln.startswith("cpu") and ln[3:4].isdigit():
            name, *numbers = ln.split()
            if int(name[3:]) in cpus:
                values = [int(v) for v in numbers]
                busy += sum(values[i] for i in BUSY_FIELDS if i < len(values))
                steal += values[STEAL] if len(values) > STEAL else 0
    return busy * tick_s, steal * tick_s


def shared(other_s: float, wall_s: float, cores: int) -> bool:
    """Whether others' CPU time over a span of wall time means they shared a machine of `cores` with it."""
    return wall_s > 0 and other_s >= MIN_OTHER_S and other_s / wall_s >= shared_cores(cores)


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

    @property
    def shared_cores(self) -> float:
        """The others' mean cores over a window that make it shared, on this process's cores."""
        return shared_cores(self.cores)

    def read(self) -> Reading:
        busy, steal = cpu_lines((self.root / "stat").read_text(), self.cpus, self.tick_s)
        t = os.times()
        procs = processes(self.root, self.tick_s)
        ours = sum(procs[p].cpu_s for p in descendants(procs, os.getpid()))
        own = t.user + t.system + t.children_user + t.children_system + ours
        return Reading(time.perf_counter(), busy, steal, own)

    def between(self, a: Reading, b: Reading) -> Other:
        """Others' CPU time from reading a to reading b (never below zero: the counters round apart), and steal."""
        other = max(0.0, (b.busy_s - a.busy_s) - (b.own_s - a.own_s))
        wall = b.wall - a.wall
        if wall <= 0:
            return Other(other, wall, 0.0, False)
        steal = max(0.0, b.steal_s - a.steal_s)
        return Other(other, wall, min(other / wall, self.cores), shared(other, wall, self.cores),
                     min(steal / wall, self.cores))

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
        """Every other process's name and CPU seconds so far, by pid, with a reading of the counters. This process and
        its descendants are left out: a compile worker of ours is the run's own work, not a neighbour."""
        reading, me = self.read(), os.getpid()
        procs = processes(self.root, self.tick_s)
        ours = descendants(procs, me) | {me}
        return reading, {pid: (p.name, p.cpu_s) for pid, p in procs.items() if pid not in ours}

    def busiest(self, a: Snapshot, b: Snapshot, n: int = 10) -> list[Busy]:
        """The other processes that used the most CPU between two snapshots (each at least MIN_OTHER_S), as mean
        cores over the span: the busiest first, n at most. Steal is not a process: the windows hold it apart."""
        wall = b[0].wall - a[0].wall
        if wall <= 0:
            return []
        # A process that began between the two has all its CPU time inside the span.
        used = [(cpu - a[1].get(pid, (name, 0.0))[1], name, pid) for pid, (name, cpu) in b[1].items()]
        top = sorted((u for u in used if u[0] >= MIN_OTHER_S), key=lambda u: -u[0])[:n]
        return [Busy(name, pid, seconds / wall) for seconds, name, pid in top]
