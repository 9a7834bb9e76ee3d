"""`compare` of races: each configuration's seconds to the target in every run, tested against the first run's.

A race's times are read from its own stage (RaceEntry.own_runs). Two races of the same seeds share each seed's
initial weights and batch order, so their times are paired by seed (stats.paired, on log times, censoring-aware);
races of different seeds are compared by Welch's test. Races measured on different rulers (target, val set or eval
cadence) are compared all the same, under a warning that their times do not compare (`ruler_warnings`).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from speedladder.measure import stats
from speedladder.records import RaceEntry, Results
from speedladder.records.race_section import ruler_differences

FASTER, SLOWER, NOISE = "faster", "slower", "noise"


@dataclass(frozen=True)
class RaceCell:
    """One race configuration in one run: its time to the target over its seeds."""

    status: str  # "ok", the entry's status when it did not race, "did not reach", or "missing"
    mean: float | None = None  # seconds to the target
    sd: float | None = None
    reached: str = ""  # "3/3"
    ratio: float | None = None  # mean / the first run's mean
    change: str | None = None  # FASTER, SLOWER or NOISE against the first run (one-sided each way)
    p: float | None = None  # the p-value of that change's side (the smaller of the two)


@dataclass(frozen=True)
class RaceRow:
    config: str
    cells: tuple[RaceCell, ...]

    @property
    def changed(self) -> bool:
        return any(c.change in (FASTER, SLOWER) for c in self.cells)


def _times(entry: RaceEntry) -> dict[int, float] | None:
    """An entry's seconds to the target by seed, if it reached in every seed."""
    runs = entry.own_runs
    if entry.status != "ok" or not runs or not all(r.reached and r.seconds is not None for r in runs):
        return None
    return {r.seed: r.seconds for r in runs if r.seconds is not None}


def change_test(mine: dict[int, float], theirs: dict[int, float], alpha: float) -> tuple[float, float]:
    """p that `mine` is faster and p that it is slower than `theirs`: paired by seed on log times when both hold
    the same seeds, else Welch's test on the times."""
    if sorted(mine) == sorted(theirs):
        seeds = sorted(mine)
        t = stats.paired([stats.Time(mine[k]) for k in seeds], [stats.Time(theirs[k]) for k in seeds], alpha)
        return t.p_less, t.p_greater
    w = stats.welch(list(mine.values()), list(theirs.values()))
    return w.p_less, w.p_greater


def _race_cell(entry: RaceEntry | None, ref: RaceEntry | None, alpha: float) -> RaceCell:
    if entry is None:
        return RaceCell("missing")
    runs = entry.own_runs
    reached = f"{sum(r.reached for r in runs)}/{len(runs)}"
    mine = _times(entry)
    if entry.status != "ok":
        return RaceCell(entry.status or "unknown", reached=reached)
    if mine is None:
        return RaceCell("did not reach", reached=reached)
    s = stats.summary(list(mine.values()))
    assert s is not None
    theirs = _times(ref) if ref is not None else None
    if theirs is None or len(mine) < 2 or len(theirs) < 2:
        return RaceCell("ok", s.mean, s.sd, reached)
    p_less, p_greater = change_test(mine, theirs, alpha)
    change = FASTER if p_less < alpha else SLOWER if p_greater < alpha else NOISE
    return RaceCell("ok", s.mean, s.sd, reached, s.mean / statistics.fmean(theirs.values()), change,
                    min(p_less, p_greater))


def ruler_warnings(runs: Sequence[Results], names: Sequence[str]) -> list[str]:
    """One loud line per race whose ruler differs from the first race's: its times do not compare."""
    first = runs[0].race if runs else None
    if first is None:
        return []
    out = []
    for name, run in zip(names[1:], runs[1:]):
        if run.race is None:
            continue
        differ = ruler_differences(first, run.race)
        if differ:
            out.append(f"WARNING: races {names[0]} and {name} were measured on different rulers ({'; '.join(differ)})"
                       f": their times to the target do not compare (--target-from {names[0]}'s folder races on "
                       "its ruler).")
    return out


def race_rows(runs: Sequence[Results]) -> tuple[RaceRow, ...]:
    """Race configurations aligned by name; each later run's times tested against the first run's (paired by seed
    where the seeds agree, else Welch; at the first run's alpha)."""
    races = [r.race for r in runs]
    if not any(race is not None for race in races):
        return ()
    alpha = (races[0].alpha if races[0] is not None else None) or 0.01
    by_name = [{e.name: e for e in race.entries} if race is not None else {} for race in races]
    names = list(dict.fromkeys(n for entries in by_name for n in entries))
    return tuple(RaceRow(n, (_race_cell(by_name[0].get(n), None, alpha),
                             *(_race_cell(b.get(n), by_name[0].get(n), alpha) for b in by_name[1:])))
                 for n in names)


def letters(comp) -> list[str]:
    """Short column names for a comparison's runs: A (the reference), B, C, ..."""
    return [chr(ord("A") + i) if i < 26 else f"R{i + 1}" for i in range(len(comp.labels))]


def race_columns(comp) -> tuple[list[str], list[list[str]]]:
    """The race rows as display strings: seconds to the target (mean ± sd), seeds reached, × A, change and p."""
    names = letters(comp)
    headers = ["config"]
    for i, n in enumerate(names):
        headers.extend([f"{n} s to target", f"{n} reached"] + ([f"{n} × {names[0]}", f"{n} change"] if i else []))
    rows = []
    for row in comp.race_rows:
        cells = [row.config]
        for i, c in enumerate(row.cells):
            cells.extend([f"{c.mean:.2f} ± {c.sd:.2f}" if c.mean is not None else c.status, c.reached or "—"])
            if i:
                mark = "—" if c.change is None else (("▲ " if c.change == FASTER else "▼ " if c.change == SLOWER
                                                      else "") + c.change + (f" (p={c.p:.2g})" if c.p is not None
                                                                              else ""))
                cells.extend(["—" if c.ratio is None else f"{c.ratio:.2f}×", mark])
        rows.append(cells)
    return headers, rows
