"""A race's charts and its report.html section, drawn from its saved section alone: the two waterfalls (tokens/s
beside × faster to the target), the val-loss curves of every run, and the section's table and notes."""

from __future__ import annotations

import math
from pathlib import Path

from speedladder.records import RaceEntry, RaceSection, Results
from speedladder.report.common import model_label
from speedladder.report.htmlkit import missing, notes, svg, table
from speedladder.report.race_table import BOUND_MARK, RACE_COLOURS, TOKENS_COLOUR, race_lines, race_rows, verdict_cell


def _bars(ax, entries: list[RaceEntry], level_of, base_of, colour_of, spread_of, tag: str) -> float:
    top = 1.0
    for i, e in enumerate(entries):
        level = level_of(e)
        if level is None:
            ax.text(i, 0.05, verdict_cell(e), rotation=90, ha="center", va="bottom", color="#555555", fontsize=9)
            continue
        start = base_of(e) or 0.0
        lo, hi = sorted((start, level))
        ax.bar(i, hi - lo, bottom=lo, width=0.6, color=colour_of(e), gid=f"{tag}-{e.name}")
        spread = spread_of(e)
        if spread is not None:
            ax.errorbar(i, level, yerr=[[level - spread[0]], [spread[1] - level]], color="black", capsize=3,
                        linewidth=1)
        mark = BOUND_MARK.get(e.speedup_cum_bound or "", "") if tag == "time" else ""
        ax.text(i, max(hi, spread[1] if spread else hi) * 1.02, f"{mark}{level:.2f}×", ha="center", va="bottom",
                fontsize=9)
        top = max(top, hi, spread[1] if spread else hi)
    ax.axhline(1.0, color="#444444", linewidth=0.6, linestyle=":")
    ax.set_xticks(range(len(entries)), [e.name for e in entries])
    ax.set_xlim(-0.6, len(entries) - 0.4)
    ax.set_ylim(0, top * 1.3)
    ax.spines[["top", "right"]].set_visible(False)
    return top


def race_figure(results: Results, section: RaceSection | None = None):
    """The race's waterfall: tokens/s (× the baseline's, from the race's own training) beside × faster to the
    target, the second coloured by verdict with the spread of each configuration's per-seed ratios."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    s = section or results.race
    assert s is not None
    entries = s.entries
    by_name = {e.name: e for e in entries}

    def base(e: RaceEntry, attr: str) -> float | None:
        b = by_name.get(e.built_on or "")
        return getattr(b, attr) if b is not None and getattr(b, attr) is not None else (0.0 if b is None else None)

    def time_spread(e: RaceEntry) -> tuple[float, float] | None:
        """The base's × cum times the smallest and largest per-seed ratio (where both runs of a seed reached)."""
        b = by_name.get(e.built_on or "")
        t = e.paired
        if t is None or b is None or b.speedup_cum is None or e.speedup_cum is None or e.speedup_bound:
            return None  # a bound has no spread of exact ratios around it
        exact = [lo for lo, hi in zip(t.low, t.high) if lo is not None and lo == hi]
        if len(exact) < 2:
            return None
        return b.speedup_cum * math.exp(-max(exact)), b.speedup_cum * math.exp(-min(exact))

    fig, (tx, rx) = plt.subplots(1, 2, figsize=(max(10.0, 2.4 * len(entries) + 3), 4.8))
    _bars(tx, entries, lambda e: e.tokens_per_s_cum if e.ok else None, lambda e: base(e, "tokens_per_s_cum"),
          lambda e: TOKENS_COLOUR, lambda e: None, "tokens")
    tx.set_ylabel("× baseline tokens/s (during the race)")
    tx.set_title("tokens/s: how fast a step runs", fontsize=10)
    _bars(rx, entries, lambda e: e.speedup_cum if e.ok else None, lambda e: base(e, "speedup_cum"),
          lambda e: RACE_COLOURS.get(e.verdict or "", "#cccccc"), time_spread, "time")
    rx.set_ylabel("× faster to the target val loss")
    target = "—" if s.target_loss is None else f"{s.target_loss:.3f}"
    rx.set_title(f"time to val loss {target}: how fast it gets good ({len(s.seeds)} seeds)", fontsize=10)
    rx.legend(handles=[Patch(color=c, label=k) for k, c in RACE_COLOURS.items()], loc="upper left",
              bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    c, env = results.config, results.environment
    fig.suptitle(f"{model_label(c, results.model)} · B={c.batch_size} T={c.seq_len} · {env.device_name}",
                 fontsize=10)
    fig.tight_layout()
    return fig


def race_plot(results: Results, path: Path, section: RaceSection | None = None) -> Path:
    import matplotlib.pyplot as plt

    fig = race_figure(results, section)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def curves_figure(results: Results, section: RaceSection | None = None):
    """Val loss against the training clock and against tokens, every run of every configuration in its own stage,
    the target dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = section or results.race
    assert s is not None
    fig, (ax, kx) = plt.subplots(1, 2, figsize=(12, 4.2))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, e in enumerate(x for x in s.entries if x.own_runs):
        colour = colours[i % len(colours)]
        for j, r in enumerate(e.own_runs):
            vals = [float("nan") if v is None else v for v in r.curve_val]
            label = e.name if j == 0 else None
            ax.plot(r.curve_seconds, vals, color=colour, linewidth=1, alpha=0.85, label=label)
            kx.plot(r.curve_tokens, vals, color=colour, linewidth=1, alpha=0.85, label=label)
    for a in (ax, kx):
        if s.target_loss is not None:
            a.axhline(s.target_loss, color="black", linestyle="--", linewidth=1, label="target")
        a.spines[["top", "right"]].set_visible(False)
    ax.set(xlabel="training clock, s (evaluations, compile and warm-up excluded)", ylabel="val loss",
           title="val loss against time")
    kx.set(xlabel="tokens trained", ylabel="val loss", title="val loss against tokens")
    ax.legend(fontsize=8, frameon=False)
    fig.tight_layout()
    return fig


def race_html(results: Results, section: RaceSection | None = None) -> str:
    """report.html's race section: the table with its p-values, the val-loss curves, the notes."""
    s = section or results.race
    if s is None:
        return missing("no race in this run: `speedladder race` trains each configuration to a target val loss over "
                       "seeds and judges it by the time to get there, with a p-value.")
    rows = race_rows(s)
    headers = list(rows[0]) if rows else ["config"]
    attrs, classes = [], []
    for e, row in zip(s.entries, rows):
        colour = RACE_COLOURS.get(e.verdict or "") if e.ok else None
        attrs.append({headers.index("verdict"): ("verdict", f"background:{colour}")} if colour else {})
        classes.append(" ".join(c for c in ("fastest" if e.name == s.fastest else "", "" if e.ok else "not-run")
                                if c))
    parts = [table(headers, [list(r.values()) for r in rows], left=("config", "verdict"), row_classes=classes,
                   cell_attrs=attrs)]
    if any(e.runs for e in s.entries):
        parts.append(svg(curves_figure(results, s), "race-curves"))
    parts.append(notes(race_lines(results, s)))
    return "\n".join(parts)
