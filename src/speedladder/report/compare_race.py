"""`compare` of races: each configuration's seconds to the target in every run, tested against the first run's."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from speedladder import stats

FASTER, SLOWER, NOISE = "faster", "slower", "noise"


@dataclass(frozen=True)
class RaceCell:
    """One race configuration in one run: its time to the target over its seeds."""

    status: str  # "ok", the entry's status when it did not race, "did not reach", or "missing"
    mean: float | None = None  # seconds to the target
    sd: float | None = None
    reached: str = ""  # "3/3"
    ratio: float | None = None  # mean / the first run's mean
    change: str | None = None  # FASTER, SLOWER or NOISE against the first run (Welch, one-sided each way)
    p: float | None = None  # the p-value of that change's side (the smaller of the two)


@dataclass(frozen=True)
class RaceRow:
    config: str
    cells: tuple[RaceCell, ...]

    @property
    def changed(self) -> bool:
        return any(c.change in (FASTER, SLOWER) for c in self.cells)


def _times(entry: dict) -> list[float] | None:
    """An entry's seconds to the target, one per seed, if it reached in every seed."""
    runs = entry.get("runs") or []
    if entry.get("status") != "ok" or not runs or any(r.get("stopped") != "reached" for r in runs):
        return None
    return [r["seconds"] for r in runs]


def _race_cell(entry: dict | None, ref: dict | None, alpha: float) -> RaceCell:
    if entry is None:
        return RaceCell("missing")
    runs = entry.get("runs") or []
    reached = f"{sum(r.get('stopped') == 'reached' for r in runs)}/{len(runs)}"
    mine = _times(entry)
    if entry.get("status") != "ok":
        return RaceCell(entry.get("status") or "unknown", reached=reached)
    if mine is None:
        return RaceCell("did not reach", reached=reached)
    s = stats.summary(mine)
    assert s is not None
    theirs = _times(ref) if ref is not None else None
    if theirs is None or len(mine) < 2 or len(theirs) < 2:
        return RaceCell("ok", s.mean, s.sd, reached)
    v, w = stats.verdict(mine, theirs, alpha)
    change = {stats.WIN: FASTER, stats.LOSS: SLOWER}.get(v, NOISE)
    return RaceCell("ok", s.mean, s.sd, reached, s.mean / statistics.fmean(theirs), change, min(w.p_less, w.p_greater))


def race_rows(runs: Sequence[dict]) -> tuple[RaceRow, ...]:
    """Race configurations aligned by name; each later run's times tested against the first run's (Welch, at the
    first run's alpha)."""
    races = [r.get("race") or {} for r in runs]
    if not any(races):
        return ()
    alpha = races[0].get("alpha") or 0.01
    by_name = [{e["name"]: e for e in race.get("entries") or []} for race in races]
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
