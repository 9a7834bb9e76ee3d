"""The waterfall: one bar per rung from the level it built on to its own cumulative ×, coloured by verdict.

Each bar is labelled with its × prev and its × cum, nothing else (memory has a chart of its own, in report.html's
memory section); the legend sits outside the bars; the winner is marked. A rung judged by the race (an optimizer or
architecture rung) is drawn by its time to the target where a race in the same file measured it, and otherwise as
an outline at the level it was measured on, marked "judged by the race": its tokens/s is not what it is for.
"""

from __future__ import annotations

from pathlib import Path

from speedladder.ladder.builds_on import judged_by_race
from speedladder.records import Results, Role, RungResult
from speedladder.report import conclusion
from speedladder.report.common import STATUS_LABEL, model_label, not_built_upon

WATERFALL = "waterfall.png"
# A rung stopped short (one window, as predicted far below its base) claims nothing: pale red, an edge of red.
COLOURS = {"baseline": "#8c8c8c", "win": "#1f6fb4", "loss": "#d62728", "noise": "#9bb7d4", "short": "#f2b8b8"}
PREDICTED = "#ff7f0e"
RACE_COLOUR = "#6a3d9a"  # a rung judged by the race: its outline, or its bar by time to the target
WINNER = "★"
MIN_BAR = 0.015  # of the highest bar's reach: a 1% gain is still a bar, not a hairline (its label gives the number)


def waterfall(results: Results, path: Path) -> Path:
    """Draw the waterfall of saved results into a PNG file."""
    import matplotlib.pyplot as plt

    fig = waterfall_figure(results)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def _predicted_level(r: RungResult, by_name: dict[str, RungResult]) -> float | None:
    """Where the bar would end if the prediction were right: the level it built on times the predicted ×."""
    pred = r.predicted.speedup if r.predicted else None
    base = by_name.get(r.built_on or "")
    if pred is None or base is None or base.speedup_cum is None:
        return None
    return base.speedup_cum * pred


def raced(results: Results, r: RungResult) -> float | None:
    """A race-judged rung's × prev in time to the target, where a race in this file (tune's) measured it."""
    section = results.race or (results.tune.race if results.tune else None)
    entry = section.entry(r.name) if section is not None else None
    return entry.speedup_prev if entry is not None and entry.speedup_prev else None


def label_text(r: RungResult) -> str:
    """A bar's label: its × prev and its × cum (a baseline: its × cum alone)."""
    if r.speedup_prev is None:
        return f"{r.speedup_cum:.2f}× cum" if r.speedup_cum is not None else ""
    return f"{r.speedup_prev:.2f}× prev\n{r.speedup_cum:.2f}× cum"


def _bar(ax, i: int, r: RungResult, results: Results, by_name: dict[str, RungResult], top: float) -> float:
    """One measured rung: its bar, the spread of its windows, its label, its predicted mark, its fp32 control.
    Returns the height its label reaches."""
    assert r.tokens_per_s is not None and r.speedup_cum is not None
    base = by_name.get(r.built_on or "")
    start = base.speedup_cum if base is not None and base.speedup_cum is not None else 0.0
    if judged_by_race(r) and r.built_on:
        return _race_bar(ax, i, r, results, start, top)
    level = r.speedup_cum
    failed = r.gate is not None and not r.gate.passed  # not gated (stopped short): no gate to fail
    lo, hi = sorted((start, level))
    if hi - lo < MIN_BAR * top:  # too small to see: drawn from its base, in its direction, at the least height
        lo, hi = (start, start + MIN_BAR * top) if level >= start else (start - MIN_BAR * top, start)
    ax.bar(i, hi - lo, bottom=lo, width=0.6, color=COLOURS.get(r.verdict or "", "#cccccc"),
           hatch="///" if failed else None, edgecolor="black" if failed else "none", linewidth=0.8, gid=r.name)
    t = r.tokens_per_s  # the whisker: the rung's own windows, as fractions of its median, at its level
    ax.errorbar(i, level, yerr=[[level * (1 - t.min / t.median)], [level * (t.max / t.median - 1)]],
                color="black", capsize=3, linewidth=1)
    pred_level = _predicted_level(r, by_name)
    # Above the bar, its fastest window and its predicted mark, so the label hides none of them.
    at = max(hi, level * t.max / t.median, pred_level or 0.0) + 0.03 * top
    ax.text(i, at, label_text(r), ha="center", va="bottom", fontsize=9, gid=f"label-{r.name}")
    if pred_level is not None:
        ax.plot([i - 0.3, i + 0.3], [pred_level] * 2, color=PREDICTED, linewidth=2.5, solid_capstyle="butt",
                gid=f"predicted-{r.name}")
    control = next((c for c in results.rungs if c.role == Role.CONTROL and c.rung == r.name), None)
    if control is not None and control.ok and control.speedup_cum is not None:
        ax.hlines(control.speedup_cum, i - 0.4, i + 0.4, colors="black", linestyles="dashed", linewidth=1)
        ax.text(i + 0.42, control.speedup_cum, "fp32\ncontrol", fontsize=7, va="center")
    return at + 0.12 * top


def _race_bar(ax, i: int, r: RungResult, results: Results, start: float, top: float) -> float:
    """A rung judged by the race: by its time to the target where raced here, else an outline at its base's level
    with its tokens/s and its tokens to AdamW's loss in words."""
    x = raced(results, r)
    if x is not None:
        level = start * x
        lo, hi = sorted((start, level))
        ax.bar(i, max(hi - lo, MIN_BAR * top), bottom=lo, width=0.6, color=RACE_COLOUR, gid=r.name)
        text = f"{x:.2f}× prev\nto the target"
    else:
        hi = start
        ax.bar(i, MIN_BAR * top, bottom=start, width=0.6, facecolor="white", edgecolor=RACE_COLOUR, linewidth=1.5,
               gid=r.name)
        t = r.gate.tokens_to_target if r.gate else None
        fewer = f"\n{t.token_ratio:.2f}× fewer tokens" if t is not None and t.token_ratio else ""
        text = f"judged by\nthe race\n{r.speedup_prev or 0.0:.2f}× tokens/s{fewer}"
    at = hi + 0.03 * top
    ax.text(i, at, text, ha="center", va="bottom", fontsize=8, color=RACE_COLOUR, gid=f"label-{r.name}")
    return at + 0.2 * top


def tick(r: RungResult) -> str:
    """A bar's name, and why the rungs above do not build on it in the table's word (a rung that did not run says
    so on its bar)."""
    why = not_built_upon(r)
    if r.role == Role.BESIDE:
        return f"{r.name}\n(beside)" + (f"\n(not built upon:\n{why})" if r.ok and why != "beside" else "")
    return r.name + (f"\n(not built upon:\n{why})" if r.ok and why else "")


def winner(results: Results) -> tuple[str, str] | None:
    """The configuration the conclusion names (a rung of it won) and what it is called: the winner, or an
    interrupted run's best so far; None where nothing paid."""
    c = conclusion.of(results)
    if c is None or c.nothing_paid or c.best is None:
        return None
    return c.best, "best so far" if c.interrupted else "winner"


def waterfall_figure(results: Results):
    """The figure itself (for tests and for reports that embed it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.artist import Artist
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    rungs = [r for r in results.rungs if r.role in (Role.RUNG, Role.BESIDE)]
    by_name = {r.name: r for r in results.rungs}
    top = max([(r.speedup_cum or 0.0) * r.tokens_per_s.max / r.tokens_per_s.median
               for r in results.rungs if r.ok and r.tokens_per_s is not None and not judged_by_race(r)]
              + [_predicted_level(r, by_name) or 0.0 for r in rungs if r.ok] + [1.0])
    # An interrupted run's rungs never reached: named on the axis, where they would have stood.
    left = [n for n in conclusion.planned(results) if results.rung(n) is None] if results.status == "interrupted" else []
    fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * (len(rungs) + len(left)) + 2), 4.8))
    reach = top
    for i, r in enumerate(rungs):
        if r.ok and r.tokens_per_s is not None:
            reach = max(reach, _bar(ax, i, r, results, by_name, top))
        else:
            ax.text(i, 0.05 * top, STATUS_LABEL.get(r.status, r.status), rotation=90, ha="center", va="bottom",
                    color="#555555", fontsize=9)
    for i in range(len(rungs), len(rungs) + len(left)):
        ax.text(i, 0.05 * top, "not reached", rotation=90, ha="center", va="bottom", color="#555555", fontsize=9)
    won = winner(results)
    if won is not None and won[0] in [r.name for r in rungs]:
        i = [r.name for r in rungs].index(won[0])
        ax.annotate(f"{WINNER} {won[1]}", (i, 0), xytext=(0, -3), textcoords="offset points", ha="center", va="top",
                    fontsize=9, fontweight="bold", color="#1a1a1a", annotation_clip=False, gid="winner",
                    xycoords=("data", "axes fraction"))
    ax.axhline(1.0, color="#444444", linewidth=0.6, linestyle=":")
    ax.set_xticks(range(len(rungs) + len(left)), [tick(r) for r in rungs] + left)
    if won is not None:
        ax.tick_params(axis="x", pad=16)  # room for the winner's mark under its bar
    ax.set_xlim(-0.6, len(rungs) + len(left) - 0.4)
    ax.set_ylim(0, max(top * 1.3, reach))
    ax.set_ylabel("cumulative speed-up (× baseline tokens/s)")
    c, e = results.config, results.environment
    ax.set_title(f"{model_label(c, results.model)} · B={c.batch_size} T={c.seq_len} · {e.device_name}", fontsize=10)
    shown = ("baseline", "win", "noise", "loss") + (("short",) if any(r.verdict == "short" for r in rungs) else ())
    handles: list[Artist] = [Patch(color=COLOURS[k], label=k) for k in shown]
    handles.append(Patch(facecolor="white", edgecolor="black", hatch="///", label="failed a gate"))
    if any(judged_by_race(r) and r.ok for r in rungs):
        handles.append(Patch(facecolor="white", edgecolor=RACE_COLOUR, linewidth=1.5, label="judged by the race"))
    if any(r.predicted and r.predicted.speedup for r in rungs):
        handles.append(Line2D([], [], color=PREDICTED, linewidth=2.5, label="predicted"))
    # Outside the bars: to the right of the axes, where no bar or label is drawn.
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    return fig
