"""A sweep's curve, table and crossovers: printed, plotted and written as HTML from its saved results.json alone."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from speedladder.records import Results
from speedladder.report.common import console
from speedladder.report.htmlkit import esc, kv, notes, page, section, svg, table
from speedladder.report.memory import short_bytes
from speedladder.report.waterfall import COLOURS

SWEEP_PLOT = "sweep.png"
AXIS_WORDS = {"width": "width (n_embd; heads keep their size)", "layers": "layers", "seq_len": "sequence length T",
              "batch_size": "batch size B"}
LINE_COLOURS = ("#1f6fb4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2")


def cell(rec: dict | None) -> str:
    """One rung at one point: × over eager, the range its windows allow, the verdict; or why there is none."""
    if not rec:
        return "—"
    if rec.get("x") is None:
        return rec["status"] if rec["status"] != "ok" else ("failed gate" if not rec.get("passed") else "—")
    return f"{rec['x']:.2f}× ({rec['x_lo']:.2f}–{rec['x_hi']:.2f}) {rec['verdict']}"


def rows(saved: Results) -> tuple[list[str], list[list[str]]]:
    s = saved.sweep or {}
    others = [r for r in s.get("rungs", []) if r != "eager"]
    headers = [s.get("axis", "point"), "model · batch", "eager tokens/s", "eager saved act", *others]
    out = []
    for p in s.get("points", []):
        e = p["rungs"].get("eager") or {}
        t = e.get("tokens_per_s")
        m = p["model"]
        shape = f"w{m['n_embd']} L{m['n_layer']}" if "n_embd" in m else m.get("name", "")
        out.append([str(p["value"]), f"{shape} B{p['batch_size']} T{p['seq_len']}",
                    f"{t['median']:,.0f}" if t else e.get("status", "—"), short_bytes(e.get("saved_activation_bytes")),
                    *(cell(p["rungs"].get(r)) for r in others)])
    for sk in s.get("skipped", []):
        out.append([str(sk["value"]), "—", sk["detail"], "—", *("—" for _ in others)])
    return headers, out


def lines(saved: Results) -> list[str]:
    s = saved.sweep or {}
    out = [v["line"] + "." for v in (s.get("summary") or {}).values()]
    out.append("× over eager: the medians' ratio; in brackets the slowest rung window over eager's fastest, and the "
               "fastest over the slowest; the verdict is the ladder's (win or loss only when the windows do not "
               "overlap).")
    if s.get("seconds") is not None:
        out.append(f"{len(s.get('points', []))} of {len(s.get('values', []))} points measured in {s['seconds']:.0f} s "
                   f"(budget {s.get('budget_minutes')} min).")
    return out


def print_sweep(saved: Results, out: Console | None = None) -> None:
    out = out or console()
    s = saved.sweep or {}
    c, e = saved.config, saved.environment
    headers, data = rows(saved)
    t = Table(title=escape(f"speedladder sweep · {s.get('axis')} · {c.preset} on {e['device_name']} · "
                           f"torch {e['torch']}"), title_justify="left")
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

    s = saved.sweep or {}
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    others = [r for r in s.get("rungs", []) if r != "eager"]
    for k, name in enumerate(others):
        pts = [(p["value"], p["rungs"][name]) for p in s.get("points", []) if (p["rungs"].get(name) or {}).get("x")]
        if not pts:
            continue
        colour = LINE_COLOURS[k % len(LINE_COLOURS)]
        xs, recs = [v for v, _ in pts], [r for _, r in pts]
        ys = [r["x"] for r in recs]
        ax.errorbar(xs, ys, yerr=[[y - r["x_lo"] for y, r in zip(ys, recs)], [r["x_hi"] - y for y, r in zip(ys, recs)]],
                    color=colour, marker="", capsize=3, linewidth=1.5, label=name)
        ax.scatter(xs, ys, c=[COLOURS.get(r["verdict"], "#cccccc") for r in recs], edgecolors=colour, s=60, zorder=3)
        for c in (s.get("summary") or {}).get(name, {}).get("crossovers", []):
            ax.axvspan(c["after"], c["before"], color=colour, alpha=0.08)
            ax.text((c["after"] * c["before"]) ** 0.5, ax.get_ylim()[1], f"{name}: {c['from']}→{c['to']}",
                    ha="center", va="top", fontsize=8, color=colour)
    ax.axhline(1.0, color="#444444", linewidth=0.8, linestyle=":")
    values = s.get("values") or []
    if values and min(values) > 0 and max(values) / min(values) >= 4:
        ax.set_xscale("log", base=2)
    ax.set_xticks(values, [str(v) for v in values])
    ax.set_xlabel(AXIS_WORDS.get(s.get("axis", ""), s.get("axis", "")))
    ax.set_ylabel("× eager tokens/s (same point)")
    c, e = saved.config, saved.environment
    ax.set_title(f"sweep · {c.preset} · {e['device_name']}  (marker colour: verdict)", fontsize=10)
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
    s = saved.sweep or {}
    headers, data = rows(saved)
    c, e = saved.config, saved.environment
    head = kv([("command", " ".join(saved.command)), ("status", saved.status), ("axis", s.get("axis")),
               ("values", ", ".join(map(str, s.get("values", [])))), ("rungs", ", ".join(s.get("rungs", []))),
               ("device", f"{e.get('device_name')} ({e.get('device')})"), ("torch", e.get("torch")),
               ("date", saved.created), ("git commit", e.get("git_commit"))])
    title = f"speedladder sweep · {s.get('axis')} · {c.preset} on {e.get('device_name')}"
    body = [f"<h1>{esc(title)}</h1>", head,
            section("curve", "× over eager", svg(figure(saved), "sweep")),
            section("points", "Points", table(headers, data, left=(headers[1],)) + notes(lines(saved)))]
    return page(title, body)
