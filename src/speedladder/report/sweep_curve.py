"""A sweep's curve, table and crossovers: printed, plotted and written as HTML from its saved results.json alone."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from speedladder.records import Results
from speedladder.records.sweep_section import SweepRung, SweepSection
from speedladder.report.common import console
from speedladder.report.htmlkit import esc, kv, notes, page, section, svg, table
from speedladder.report.memory_notes import short_bytes
from speedladder.report.waterfall import COLOURS

SWEEP_PLOT = "sweep.png"
AXIS_WORDS = {"width": "width (n_embd; heads keep their size)", "layers": "layers", "seq_len": "sequence length T",
              "batch_size": "batch size B"}
LINE_COLOURS = ("#1f6fb4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2")


def cell(rec: SweepRung | None) -> str:
    """One rung at one point: × over eager, the range its windows allow, the verdict; or why there is none."""
    if rec is None:
        return "—"
    if rec.x is None:
        return rec.status if rec.status != "ok" else ("failed gate" if not rec.passed else "—")
    return f"{rec.x:.2f}× ({rec.x_lo:.2f}–{rec.x_hi:.2f}) {rec.verdict}"


def sweep_of(saved: Results) -> SweepSection:
    """The sweep section of a sweep folder (the only folders these views are called for)."""
    if saved.sweep is None:
        raise ValueError("not a sweep folder: no sweep section")
    return saved.sweep


def rows(saved: Results) -> tuple[list[str], list[list[str]]]:
    """The points as display strings, the skipped ones last: the same for the terminal and the HTML."""
    s = sweep_of(saved)
    others = s.others
    headers = [s.axis, "model · batch", "eager tokens/s", "eager saved act", *others]
    out = []
    for p in s.points:
        e = p.rungs.get("eager")
        t = e.tokens_per_s if e is not None else None
        out.append([str(p.value), f"{p.shape} B{p.batch_size} T{p.seq_len}",
                    f"{t.median:,.0f}" if t else e.status if e is not None else "—",
                    short_bytes(e.saved_activation_bytes if e is not None else None),
                    *(cell(p.rungs.get(r)) for r in others)])
    for sk in s.skipped:
        out.append([str(sk.value), "—", sk.detail, "—", *("—" for _ in others)])
    return headers, out


def lines(saved: Results) -> list[str]:
    """Each rung's crossover line, how to read ×, and what the budget allowed."""
    s = sweep_of(saved)
    out = [v.line + "." for v in s.summary.values()]
    out.append("× over eager: the medians' ratio; in brackets the slowest rung window over eager's fastest, and the "
               "fastest over the slowest; the verdict is the ladder's (win or loss only when the windows do not "
               "overlap).")
    if s.seconds is not None:
        out.append(f"{len(s.points)} of {len(s.values)} points measured in {s.seconds:.0f} s "
                   f"(budget {s.budget_minutes} min).")
    return out


def print_sweep(saved: Results, out: Console | None = None) -> None:
    out = out or console()
    s = sweep_of(saved)
    c, e = saved.config, saved.environment
    headers, data = rows(saved)
    t = Table(title=escape(f"speedladder sweep · {s.axis} · {c.preset} on {e.device_name} · "
                           f"torch {e.torch}"), title_justify="left")
    for h in headers:
        t.add_column(escape(h), justify="left" if h == headers[1] else "right", no_wrap=True)
    for row in data:
        t.add_row(*(escape(v) for v in row))
    out.print(t)
    for line in lines(saved):
        out.print(escape(line), soft_wrap=True)


def figure(saved: Results):
    """Each rung's × over eager against the axis, its windows' range as error bars, crossovers shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = sweep_of(saved)
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for k, name in enumerate(s.others):
        pts = [(p.value, rec) for p in s.points if (rec := p.rungs.get(name)) is not None and rec.x]
        if not pts:
            continue
        colour = LINE_COLOURS[k % len(LINE_COLOURS)]
        xs, recs = [v for v, _ in pts], [r for _, r in pts]
        ys = [r.x or 0.0 for r in recs]
        ax.errorbar(xs, ys, yerr=[[y - (r.x_lo or y) for y, r in zip(ys, recs)],
                                  [(r.x_hi or y) - y for y, r in zip(ys, recs)]],
                    color=colour, marker="", capsize=3, linewidth=1.5, label=name)
        ax.scatter(xs, ys, c=[COLOURS.get(r.verdict or "", "#cccccc") for r in recs], edgecolors=colour, s=60,
                   zorder=3)
        summary = s.summary.get(name)
        for turn in summary.crossovers if summary is not None else []:
            ax.axvspan(turn.after, turn.before, color=colour, alpha=0.08)
            ax.text((turn.after * turn.before) ** 0.5, ax.get_ylim()[1], f"{name}: {turn.start}→{turn.to}",
                    ha="center", va="top", fontsize=8, color=colour)
    ax.axhline(1.0, color="#444444", linewidth=0.8, linestyle=":")
    values = s.values
    if values and min(values) > 0 and max(values) / min(values) >= 4:
        ax.set_xscale("log", base=2)
    ax.set_xticks(values, [str(v) for v in values])
    ax.set_xlabel(AXIS_WORDS.get(s.axis, s.axis))
    ax.set_ylabel("× eager tokens/s (same point)")
    c, e = saved.config, saved.environment
    ax.set_title(f"sweep · {c.preset} · {e.device_name}  (marker colour: verdict)", fontsize=10)
    from matplotlib.patches import Patch

    handles, _ = ax.get_legend_handles_labels()
    handles += [Patch(color=COLOURS[k], label=k) for k in ("win", "noise", "loss")]
    ax.legend(handles=handles, fontsize=8, frameon=False)
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    return fig


def plot(saved: Results, path: Path) -> Path:
    """sweep.png from the saved file."""
    import matplotlib.pyplot as plt

    fig = figure(saved)
    try:
        fig.savefig(path, dpi=120)
    finally:
        plt.close(fig)
    return path


def html(saved: Results) -> str:
    """report.html of a sweep: the curve, the table, the crossovers, the run's header."""
    s = sweep_of(saved)
    headers, data = rows(saved)
    c, e = saved.config, saved.environment
    head = kv([("command", " ".join(saved.command)), ("status", saved.status), ("axis", s.axis),
               ("values", ", ".join(map(str, s.values))), ("rungs", ", ".join(s.rungs)),
               ("device", f"{e.device_name} ({e.device})"), ("torch", e.torch),
               ("date", saved.created), ("git commit", e.git_commit)])
    title = f"speedladder sweep · {s.axis} · {c.preset} on {e.device_name}"
    body = [f"<h1>{esc(title)}</h1>", head,
            section("curve", "× over eager", svg(figure(saved), "sweep")),
            section("points", "Points", table(headers, data, left=(headers[1],)) + notes(lines(saved)))]
    return page(title, body)
