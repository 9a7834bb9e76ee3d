"""Whether the machine was alone: the header line of a run or race that shared it, and which windows or runs did,
from the saved `machine` section and each window's (run's) `shared` alone (measure/machine_load.py)."""

from __future__ import annotations

from speedladder.records import MachineLoad, RaceSection, Results, TimingRecord, WindowRecord

# Others' load is worth a word when it reaches this share of the cores the run may use (and at least the share of
# one core that marks a window shared): on 16 cores a third of one says nothing; on 2 cores a quarter says something.
SHARE_OF_CORES = 0.1


def threshold(m: MachineLoad) -> float:
    """The cores others must use, over a window or before the first, before the report says so."""
    return max(m.shared_cores, SHARE_OF_CORES * m.cores)


def worth_saying(m: MachineLoad | None) -> bool:
    """Whether other processes' load was large enough, before or during the windows (a race's runs), to be said.
    The one place the report decides it (measure/machine_load.py marks each window)."""
    if m is None or m.alone:
        return False
    return max(m.most, m.before or 0.0) >= threshold(m)


def _windows(timing: TimingRecord | None) -> list[WindowRecord]:
    return list(timing.windows) if timing else []


def header_line(results: Results) -> str | None:
    """One line for the top of the output when other processes ran before or during the timed windows (or a race's
    runs); None when the machine was alone, or its load was not read (an older file, not Linux)."""
    m = results.machine
    if m is None or not worth_saying(m):
        return None
    during = [f"{m.shared_windows} of {m.windows} timed windows"] if m.shared_windows else []
    during += [f"{m.shared_runs} of {m.runs} race runs"] if m.shared_runs else []
    parts = [f"other processes used up to {m.most:.2f} of {m.cores} cores during " + " and ".join(during)
             if during else f"other processes used {m.before or 0.0:.2f} of {m.cores} cores before the first window"]
    if during and m.before is not None:
        parts.append(f"{m.before:.2f} before the first" + (f" (load average {m.loadavg:.2f})" if m.loadavg else ""))
    line = "machine not alone: " + "; ".join(parts)
    if m.processes:
        line += ". Busiest: " + ", ".join(
            f"{p.name}" + (f" (pid {p.pid})" if p.pid is not None else "") + f" {p.cores:.2f} cores"
            for p in m.processes[:3])
    return line + (". Figures timed beside them can be slower than on the machine alone; the shared "
                   + ("windows" if m.shared_windows else "runs") + " are marked (shared) in results.json."
                   if during else ". The windows that followed did not overlap them.")


def window_lines(results: Results) -> list[str]:
    """Each rung whose windows (or its base's beside it) other processes shared, and how much, when that load is
    worth saying (worth_saying)."""
    if not worth_saying(results.machine):
        return []
    out = []
    for r in results.rungs:
        mine, base = _windows(r.timing), _windows(r.base_timing)
        shared = [w for w in mine + base if w.shared]
        if not shared:
            continue
        most = max(w.other_cores or 0.0 for w in shared)
        out.append(f"{r.name}: other processes shared {sum(w.shared for w in mine)} of its {len(mine)} "
                   + (f"windows and {sum(w.shared for w in base)} of its base's {len(base)}"
                      if base else "windows") + f" (up to {most:.2f} cores).")
    return out


def run_lines(section: RaceSection) -> list[str]:
    """Each configuration whose race runs other processes shared: the seeds, and how much."""
    out = []
    for e in section.entries:
        shared = [r for r in e.runs if r.shared]
        if shared:
            seeds = ", ".join(f"{r.seed} (stage {r.stage}, {r.other_cores or 0.0:.2f} cores)" for r in shared)
            out.append(f"{e.name}: other processes shared its runs of seed {seeds}.")
    return out


def html_value(results: Results) -> str | None:
    """report.html's header entry: alone, or the header line; None when the load was not read."""
    m = results.machine
    if m is None:
        return None
    if m.alone:
        return (f"alone: no other process used {m.shared_cores:g} of a core over any of {m.windows + m.runs} timed "
                f"windows or runs, nor before them ({m.cores} cores read)")
    if not worth_saying(m):
        return (f"quiet: other processes used at most {max(m.most, m.before or 0.0):.2f} of {m.cores} cores, under "
                f"{threshold(m):.2f} ({SHARE_OF_CORES:.0%} of the cores), which the report leaves unsaid")
    return header_line(results)
