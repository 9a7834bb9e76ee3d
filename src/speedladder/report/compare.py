"""`speedladder compare RUN_A RUN_B [RUN_C ...]`: the same rungs across runs, side by side.

The first run is the reference. Rungs are aligned by name (a rung one run lacks is shown as
missing); for each run after the first: tokens/s, the ratio of its median to the first run's, and
whether the change is outside the spread, by the ladder's own rule (measure/judging.verdict): faster or
slower only when the two runs' window ranges (min–max) do not overlap, else within spread. Gate
changes (passed -> failed or back) and configuration or environment differences are marked too.

`compare()` returns typed rows; printing and HTML are drawn from them.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from speedladder.errors import UsageError
from speedladder.measure.judging import Spread, verdict
from speedladder.records import Results, storage
from speedladder.report import htmlkit
from speedladder.report.race_compare import FASTER, SLOWER, RaceRow, letters, race_columns, race_rows, ruler_warnings

WITHIN = "within spread"
PASSED, FAILED = "passed", "failed"


@dataclass(frozen=True)
class Cell:
    """One rung in one run."""

    status: str  # "ok", the rung's status when it did not run (skipped, oom, error, ...), or "missing"
    median: float | None = None  # tokens/s over the timed windows
    min: float | None = None
    max: float | None = None
    gate: str | None = None  # PASSED / FAILED for a measured rung; None when it did not run
    ratio: float | None = None  # median / the first run's median; None when either did not run
    change: str | None = None  # FASTER, SLOWER or WITHIN against the first run; None: nothing to compare
    gate_change: str | None = None  # "passed -> failed" or "failed -> passed" against the first run


@dataclass(frozen=True)
class Row:
    rung: str
    cells: tuple[Cell, ...]  # one per run, in the order given

    @property
    def changed(self) -> bool:
        return any(c.change in (FASTER, SLOWER) or c.gate_change for c in self.cells)


@dataclass(frozen=True)
class Difference:
    """A configuration or environment field whose value is not the same in every run."""

    field: str
    values: tuple[str, ...]




@dataclass(frozen=True)
class Comparison:
    labels: tuple[str, ...]
    rows: tuple[Row, ...]
    differences: tuple[Difference, ...]
    race_rows: tuple[RaceRow, ...] = ()  # the runs' race configurations, when any run is a race
    warnings: tuple[str, ...] = ()  # runs that drifted beyond the limit (drift_warnings)

    def row(self, rung: str) -> Row:
        return next(r for r in self.rows if r.rung == rung)

    def difference(self, field: str) -> Difference | None:
        return next((d for d in self.differences if d.field == field), None)


@dataclass(frozen=True)
class Measured:
    """One comparable measurement of a run: its status, tokens/s when it ran, and its gate's verdict."""

    status: str
    tokens_per_s: Spread | None = None
    gate_passed: bool | None = None


# What makes two runs' tokens/s comparable, or explains why they differ: each read from the run's records.
FIELDS: tuple[tuple[str, Callable[[Results], object]], ...] = (
    ("device", lambda r: r.environment.device_name), ("device type", lambda r: r.environment.device_type),
    ("torch", lambda r: r.environment.torch), ("CUDA", lambda r: r.environment.cuda),
    ("CPU threads", lambda r: r.environment.cpu_threads),
    ("preset", lambda r: r.config.run.preset), ("batch size", lambda r: r.config.run.batch_size),
    ("seq len", lambda r: r.config.run.seq_len), ("batch multiplier", lambda r: r.config.run.batch_multiplier),
    ("rungs", lambda r: r.config.run.rungs), ("data", lambda r: r.config.run.data),
    ("tokenizer", lambda r: r.config.run.tokenizer),
    ("steps per window", lambda r: r.config.run.timing.steps), ("windows", lambda r: r.config.run.timing.windows),
    ("seed", lambda r: r.config.run.seed), ("lr", lambda r: r.config.run.lr),
    ("git commit", lambda r: r.environment.git_commit),
)


def _text(value: object) -> str:
    if value is None:
        return "none"
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    return str(value)


def differences(runs: Sequence[Results]) -> list[Difference]:
    """The configuration and environment fields whose values are not the same in every run."""
    out = []
    for name, get in FIELDS:
        values = tuple(_text(get(r)) for r in runs)
        if len(set(values)) > 1:
            out.append(Difference(name, values))
    return out


def records(saved: Results) -> dict[str, Measured]:
    """Name -> what was measured, for every comparable measurement of a run.

    A ladder's rungs and controls; for predict/ddp, the one-process measurement and the measured job.
    """
    out = {}
    for r in saved.rungs:
        out[r.name] = Measured(r.status, r.tokens_per_s if r.ok else None,
                               r.gate.passed if r.ok and r.gate is not None else None)
    p = saved.parallel
    if p:
        if p.single:
            out["one process"] = Measured("ok", p.single.tokens_per_s)
        m = p.measured
        if m:
            out[f"{p.strategy} k={m.k}"] = Measured("ok", m.tokens_per_s, m.param_check.identical)
    return out


def _change(new: Spread, ref: Spread) -> str:
    """The ladder's own verdict rule: a change counts only when the window ranges do not overlap."""
    return {"win": FASTER, "loss": SLOWER}.get(verdict(new, ref), WITHIN)


def _gate(passed: bool | None) -> str | None:
    return None if passed is None else PASSED if passed else FAILED


def _cell(rec: Measured | None, ref: Measured | None) -> Cell:
    if rec is None:
        return Cell("missing")
    t = rec.tokens_per_s
    if rec.status != "ok" or t is None:
        return Cell(rec.status or "unknown")
    gate = _gate(rec.gate_passed)
    if ref is None or ref.tokens_per_s is None:
        return Cell("ok", t.median, t.min, t.max, gate)
    ref_gate = _gate(ref.gate_passed)
    return Cell("ok", t.median, t.min, t.max, gate, ratio=t.median / ref.tokens_per_s.median,
                change=_change(t, ref.tokens_per_s),
                gate_change=f"{ref_gate} -> {gate}" if ref_gate and gate and ref_gate != gate else None)


def drift_warnings(runs: Sequence[Results], labels: Sequence[str], limit: float) -> list[str]:
    """A line per run whose rungs' bases drifted beyond `limit` (records' base_drift): its absolute tokens/s moved
    with the machine within the run, so across runs compare the ratios."""
    out = []
    for run, name in zip(runs, labels):
        moved = [(r.name, r.base_drift) for r in run.rungs if r.base_drift is not None and abs(r.base_drift) > limit]
        if moved:
            out.append(f"warning: {name} drifted beyond {limit:.0%}: " + ", ".join(
                f"{n}'s base ran {d:+.0%} beside it" for n, d in moved)
                + "; its × prev hold, its absolute tokens/s do not.")
    return out


def compare(runs: Sequence[Results], labels: Sequence[str]) -> Comparison:
    """Rows aligned by rung name, in the order rungs first appear across the runs."""
    if len(runs) < 2:
        raise UsageError("compare needs at least two runs")
    recs = [records(r) for r in runs]
    names: list[str] = []
    for rec in recs:  # a rung only a later run has goes right after the rung it follows there
        after = -1
        for n in rec:
            if n not in names:
                names.insert(after + 1, n)
            after = names.index(n)
    rows = []
    for name in names:
        ref = recs[0].get(name)
        ref_ok = ref if ref is not None and ref.status == "ok" else None
        first = _cell(ref, None)
        rows.append(Row(name, (first, *(_cell(rec.get(name), ref_ok) for rec in recs[1:]))))
    comp = Comparison(tuple(labels), tuple(rows), tuple(differences(runs)), race_rows(runs))
    return dataclasses.replace(comp, warnings=tuple(ruler_warnings(runs, letters(comp))))


def labels_for(paths: Sequence[str]) -> list[str]:
    """Each run's folder name (its timestamp); the path as given where two names clash."""
    names = [Path(p).resolve().name if Path(p).is_dir() else Path(p).resolve().parent.name for p in paths]
    if len(set(names)) == len(names):
        return names
    given = [str(p) for p in paths]
    return given if len(set(given)) == len(given) else [f"{p} (#{i + 1})" for i, p in enumerate(given)]


def load(paths: Sequence[str], drift_limit: float | None = None) -> Comparison:
    """Compare saved runs as their files hold them (docs/results.md): any schema this project has written."""
    runs, labels = [storage.load(p) for p in paths], labels_for(paths)
    comp = compare(runs, labels)
    if drift_limit is None:
        return comp
    return dataclasses.replace(comp, warnings=(*comp.warnings, *drift_warnings(runs, letters(comp), drift_limit)))


# -- output ----------------------------------------------------------------------------------------

def _tps(c: Cell) -> str:
    if c.status != "ok":
        return c.status
    return f"{c.median:,.0f} ({c.min:,.0f}–{c.max:,.0f})"


def _mark(c: Cell) -> str:
    parts = []
    if c.change in (FASTER, SLOWER):
        parts.append(("▲ " if c.change == FASTER else "▼ ") + c.change)
    elif c.change:
        parts.append(c.change)
    if c.gate_change:
        parts.append(f"gate {c.gate_change}")
    return "; ".join(parts) or "—"


def columns(comp: Comparison) -> tuple[list[str], list[list[str]]]:
    """The comparison as display strings: the same for the terminal and the HTML."""
    names = letters(comp)
    headers = ["rung"]
    for i, n in enumerate(names):
        headers.extend([f"{n} tok/s", f"{n} gate"] + ([f"{n} × {names[0]}", f"{n} change"] if i else []))
    rows = []
    for row in comp.rows:
        cells = [row.rung]
        for i, c in enumerate(row.cells):
            cells.extend([_tps(c), c.gate or "—"])
            if i:
                cells.extend(["—" if c.ratio is None else f"{c.ratio:.2f}×", _mark(c)])
        rows.append(cells)
    return headers, rows


def legend(comp: Comparison) -> str:
    return ", ".join(f"{n} = {label}" + (" (reference)" if i == 0 else "")
                     for i, (n, label) in enumerate(zip(letters(comp), comp.labels)))


def difference_lines(comp: Comparison) -> list[str]:
    if not comp.differences:
        return ["configuration and environment: the same in every run."]
    return [f"differs: {d.field}: " + " | ".join(f"{n} {v}" for n, v in zip(letters(comp), d.values))
            for d in comp.differences]


def print_comparison(comp: Comparison) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console(highlight=False, width=None if sys.stdout.isatty() else 200)
    headers, rows = columns(comp)
    if comp.rows or not comp.race_rows:  # a comparison of races alone has no rung to show
        t = Table(title=escape(f"speedladder compare · {legend(comp)}"), title_justify="left")
        for h in headers:
            t.add_column(escape(h), justify="left" if h == "rung" or h.endswith(("gate", "change")) else "right",
                         no_wrap=True)
        for row, cells in zip(comp.rows, rows):
            t.add_row(*(escape(v) for v in cells), style="bold" if row.changed else None)
        console.print(t)
    else:
        console.print(escape(f"speedladder compare · {legend(comp)}"))
    if comp.race_rows:
        headers, rows = race_columns(comp)
        rt = Table(title="race: seconds to the target val loss; faster / slower at p < 0.01 (one-sided, paired by seed)",
                   title_justify="left")
        for h in headers:
            rt.add_column(escape(h), justify="left" if h == "config" or h.endswith("change") else "right",
                          no_wrap=True)
        for race_row, cells in zip(comp.race_rows, rows):
            rt.add_row(*(escape(v) for v in cells), style="bold" if race_row.changed else None)
        console.print(rt)
    for line in (*difference_lines(comp), *comp.warnings):
        console.print(escape(line), soft_wrap=True)


def html(comp: Comparison, paths: Sequence[str] = ()) -> str:
    """The comparison as one self-contained HTML page (the same style as report.html)."""

    headers, rows = columns(comp)
    change_col = [headers.index(f"{n} change") for n in letters(comp)[1:]]
    attrs = []
    for row in comp.rows:
        a: dict[int, tuple[str, str]] = {}
        for col, c in zip(change_col, row.cells[1:]):
            worse = c.change == SLOWER or (c.gate_change or "").endswith(FAILED)
            if worse or c.change == FASTER or c.gate_change:
                a[col] = ("changed", f"color:{'#d62728' if worse else '#1f6fb4'};font-weight:bold")
        attrs.append(a)
    names = letters(comp)
    runs = htmlkit.kv((f"{n} = {label}", path) for n, label, path in zip(names, comp.labels, [*paths] or comp.labels))
    diffs = htmlkit.table(["field", *names], [[d.field, *d.values] for d in comp.differences],
                    left=("field", *names)) if comp.differences else htmlkit.missing(difference_lines(comp)[0])
    body = [f'<header id="header"><h1>{htmlkit.esc("speedladder compare")}</h1>{runs}</header>',
            htmlkit.section("comparison", f"Tokens/s by rung, against A ({comp.labels[0]})",
                      htmlkit.table(headers, rows, left=[x for x in headers if x == "rung" or x.endswith(("gate", "change"))],
                              cell_attrs=attrs)
                      + "<p>faster / slower: the two runs' window ranges (min–max) do not overlap; within spread: "
                        "they do.</p>"),
            *([htmlkit.section("race", "Race: seconds to the target val loss, against A",
                               htmlkit.table(*race_columns(comp), left=[h for h in race_columns(comp)[0]
                                                                        if h == "config" or h.endswith("change")])
                               + "<p>faster / slower: a t-test on the log times paired by seed (Welch's test where "
                                 "the seeds differ), one-sided, p &lt; 0.01; noise otherwise.</p>")] if comp.race_rows else []),
            htmlkit.section("differences", "Configuration and environment",
                            diffs + htmlkit.notes(comp.warnings))]
    return htmlkit.page("speedladder compare · " + " vs ".join(comp.labels), body)
