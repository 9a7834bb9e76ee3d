"""Every loss and every missed prediction explained, in words and tables: read from saved results alone.

A rung's `explanation` (profile/explain.py, profile/side_by_side.py) sets its profiled step beside its base's, both against
the timed figures; these lines and tables say it in the notes, and in report.html's profile section.
"""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from speedladder.profile.side_by_side import compiler_line, grew_line, sums
from speedladder.records import ProfiledExplanation, Results, RungResult

PERFETTO = "https://ui.perfetto.dev"


def explained(results: Results) -> list[tuple[RungResult, ProfiledExplanation]]:
    return [(r, r.explanation) for r in results.rungs if r.explanation is not None]


def _why(r: RungResult) -> str:
    """What made the rung worth explaining: a loss (× prev below 1.0), a miss, or both."""
    lost = r.kind == "speed" and r.speedup_prev is not None and r.speedup_prev < 1.0
    pred = r.predicted.speedup if r.predicted else None
    x = f"{r.speedup_prev:.2f}× {r.built_on}" if r.speedup_prev is not None else "not measured"
    where = f" where {pred:.2f}× was predicted ({100 * (r.prediction_error or 0.0):+.0f}%)" if pred else ""
    return f"{r.name} {'lost' if lost else 'missed its prediction'}: {x}{where}"


def lines_of(r: RungResult, e: ProfiledExplanation) -> list[str]:
    """The notes of one explained rung: what was set beside what and whether it adds up, the part against the model
    and the category that grew, what the compiler did, and the trace files."""
    if e.error:
        return [f"{_why(r)}; unexplained: {e.error}."]
    base = "+".join(e.base_rungs) or "eager"
    out = [f"{_why(r)}; profiled beside {base}: {sums(e)}.", f"{r.name}: {e.note}."]
    if grew_line(e):
        out[-1] = out[-1][:-1] + f"; {grew_line(e)}."
    if compiler_line(e):
        out.append(f"{r.name}: {compiler_line(e)}.")
    if e.trace:
        beside = f" beside {e.base_trace} ({base})" if e.base_trace else ""
        out.append(f"{r.name}: trace {e.trace}{beside}, in the run folder: open it in {PERFETTO}.")
    return out


def explanation_notes(results: Results) -> list[str]:
    """The lines of every explained rung, in ladder order."""
    return [line for r, e in explained(results) for line in lines_of(r, e)]


def _unit(e: ProfiledExplanation) -> str:
    return "ms/step, each profile scaled to its timed step" if e.basis == "timed" else "profiled ms/step"


def explanation_rows(e: ProfiledExplanation) -> tuple[list[list[str]], list[list[str]]]:
    """The side-by-side category rows (base, rung, change) and the model's part rows (with the expected change)."""
    cats = [[c + (" ▲" if c == e.grew else ""), f"{v.base_ms:.2f}", f"{v.rung_ms:.2f}",
             f"{v.rung_ms - v.base_ms:+.2f}"] for c, v in e.categories.items()]
    parts = [[g + (" ◀" if g == e.culprit else ""), f"{v.base_ms:.2f}", f"{v.rung_ms:.2f}",
              f"{v.rung_ms - v.base_ms:+.2f}", f"{v.expected_ms - v.base_ms:+.2f}"]
             for g, v in e.parts.items()]
    return cats, parts


CATEGORY_HEADERS = ("category", "base ms", "rung ms", "Δ ms")
PART_HEADERS = ("model part", "base ms", "rung ms", "Δ ms", "model's Δ ms")


def explanation_tables(results: Results) -> list[Table]:
    """For each explained rung: the categories of base and rung side by side (▲ grew most), then the model's parts
    (◀ most against the prediction)."""
    out = []
    for r, e in explained(results):
        if e.error:
            continue
        cats, parts = explanation_rows(e)
        base = "+".join(e.base_rungs) or "eager"
        for title, headers, rows in ((f"{r.name} vs {base}, {_unit(e)} (▲ grew most)", CATEGORY_HEADERS, cats),
                                     (f"{r.name}: model parts (◀ most against)", PART_HEADERS, parts)):
            t = Table(title=escape(title), title_justify="left")
            for col in headers:
                t.add_column(col, justify="left" if col in ("category", "model part") else "right")
            for row in rows:
                t.add_row(*(escape(v) for v in row))
            out.append(t)
    return out


def explanation_html(results: Results) -> list[str]:
    """The notes and side-by-side tables of each explained rung, for report.html's profile section."""
    from speedladder.report.htmlkit import esc, table

    out = []
    for r, e in explained(results):
        lines = lines_of(r, e)
        out.append(f"<h3>{esc(lines[0])}</h3>")
        out.extend(f"<p>{esc(line)}</p>" for line in lines[1:])
        if e.error:
            continue
        cats, parts = explanation_rows(e)
        out.append(f"<p>{esc(_unit(e))}</p>")
        out.append(table(list(CATEGORY_HEADERS), cats, left=("category",)))
        out.append(table(list(PART_HEADERS), parts, left=("model part",)))
    return out
