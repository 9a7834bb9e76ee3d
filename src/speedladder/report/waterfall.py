"""The waterfall: one bar per rung from the level it built on to its own cumulative ×, coloured by verdict."""

from __future__ import annotations

from pathlib import Path

from speedladder.records import Results, Role, RungResult
from speedladder.report.common import STATUS_LABEL, model_label, not_built_upon
from speedladder.report.memory import bar_label

WATERFALL = "waterfall.png"
# A rung stopped short (one window, as predicted far below its base) claims nothing: pale red, an edge of red.
COLOURS = {"baseline": "#8c8c8c", "win": "#1f6fb4", "loss": "#d62728", "noise": "#9bb7d4", "short": "#f2b8b8"}
PREDICTED = "#ff7f0e"


def waterfall(results: Results, path: Path) -> Path:
    """Draw the waterfall of saved results into a PNG file."""
    import matplotlib.pyplot as plt

    fig = waterfall_figure(results)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _predicted_level(r: RungResult, by_name: dict[str, RungResult]) -> float | None:
    """Where the bar would end if the prediction were right: the level it built on times the predicted ×."""
    pred = r.predicted.speedup if r.predicted else None
    base = by_name.get(r.built_on or "")
    if pred is None or base is None or base.speedup_cum is None:
        return None
    return base.speedup_cum * pred


def _bar(ax, i: int, r: RungResult, results: Results, by_name: dict[str, RungResult], top: float) -> None:
    """One measured rung: its bar, the spread of its windows, its label, its predicted mark, its fp32 control."""
    assert r.tokens_per_s is not None and r.speedup_cum is not None
    level = r.speedup_cum
    base = by_name.get(r.built_on or "")
    start = base.speedup_cum if base is not None and base.speedup_cum is not None else 0.0
    failed = r.gate is not None and not r.gate.passed  # not gated (stopped short): no gate to fail
    lo, hi = sorted((start, level))
    ax.bar(i, hi - lo, bottom=lo, width=0.6, color=COLOURS.get(r.verdict or "", "#cccccc"),
           hatch="///" if failed else None, edgecolor="black" if failed else "none", linewidth=0.8, gid=r.name)
    t = r.tokens_per_s  # the whisker: the rung's own windows, as fractions of its median, at its level
    ax.errorbar(i, level, yerr=[[level * (1 - t.min / t.median)], [level * (t.max / t.median - 1)]],
                color="black", capsize=3, linewidth=1)
    text = f"{level:.2f}×"
    if r.base_drift is not None:  # its base ran at another speed beside it: the ratio holds, say so on the bar
        text += f"\ndrift {r.base_drift:+.0%}"
    if bar_label(r):  # saved activations and the measured peak (the CUDA allocator's, or a CPU's resident rise)
        text += f"\n{bar_label(r)}"
    pred_level = _predicted_level(r, by_name)
    # Above the bar, its fastest window and its predicted mark, so the label hides none of them.
    ax.text(i, max(hi, level * t.max / t.median, pred_level or 0.0) + 0.03 * top, text, ha="center",
            va="bottom", fontsize=9)
    if pred_level is not None:
        ax.plot([i - 0.3, i + 0.3], [pred_level] * 2, color=PREDICTED, linewidth=2.5, solid_capstyle="butt",
                gid=f"predicted-{r.name}")
    control = next((c for c in results.rungs if c.role == Role.CONTROL and c.rung == r.name), None)
    if control is not None and control.ok and control.speedup_cum is not None:
        ax.hlines(control.speedup_cum, i - 0.4, i + 0.4, colors="black", linestyles="dashed", linewidth=1)
        ax.text(i + 0.42, control.speedup_cum, "fp32\ncontrol", fontsize=7, va="center")


def tick(r: RungResult) -> str:
    """A bar's name, and why the rungs above do not build on it in the table's word (a rung that did not run says
    so on its bar)."""
    why = not_built_upon(r)
    if r.role == Role.BESIDE:
        return f"{r.name}\n(beside)" + (f"\n(not built upon:\n{why})" if r.ok and why != "beside" else "")
    return r.name + (f"\n(not built upon:\n{why})" if r.ok and why else "")


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
               for r in results.rungs if r.ok and r.tokens_per_s is not None]
              + [_predicted_level(r, by_name) or 0.0 for r in rungs if r.ok] + [1.0])
    fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * len(rungs) + 2), 4.8))
    for i, r in enumerate(rungs):
        if r.ok and r.tokens_per_s is not None:
            _bar(ax, i, r, results, by_name, top)
        else:
            ax.text(i, 0.05 * top, STATUS_LABEL.get(r.status, r.status), rotation=90, ha="center", va="bottom",
                    color="#555555", fontsize=9)
    ax.axhline(1.0, color="#444444", linewidth=0.6, linestyle=":")
    ax.set_xticks(range(len(rungs)), [tick(r) for r in rungs])
    ax.set_xlim(-0.6, len(rungs) - 0.2)
    ax.set_ylim(0, top * (1.45 if any(bar_label(r) for r in rungs) else 1.3))
    ax.set_ylabel("cumulative speed-up (× baseline tokens/s)")
    c, e = results.config, results.environment
    ax.set_title(f"{model_label(c, results.model)} · B={c.batch_size} T={c.seq_len} · {e.device_name}", fontsize=10)
    shown = ("baseline", "win", "noise", "loss") + (("short",) if any(r.verdict == "short" for r in rungs) else ())
    handles: list[Artist] = [Patch(color=COLOURS[k], label=k) for k in shown]
    handles.append(Patch(facecolor="white", edgecolor="black", hatch="///", label="failed a gate"))
    if any(r.predicted and r.predicted.speedup for r in rungs):
        handles.append(Line2D([], [], color=PREDICTED, linewidth=2.5, label="predicted"))
    ax.legend(handles=handles, loc="upper left", fontsize=8, frameon=False)
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    return fig
