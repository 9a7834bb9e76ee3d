"""What every command ends with, drawn from its saved file alone: the printed view its kind has, the plot beside
results.json (waterfall.png, sweep.png or scaling.png) and report.html. `show` is the one place that picks them."""

from __future__ import annotations

from pathlib import Path

from speedladder.profile import step_profile
from speedladder.records import Results, RunKind, storage
from speedladder.report import html, scaling, sweep_curve
from speedladder.report.profile_notes import print_profile
from speedladder.report.race_charts import race_plot
from speedladder.report.race_table import print_race
from speedladder.report.text import print_report
from speedladder.report.tune_outcome import print_tune
from speedladder.report.waterfall import WATERFALL, waterfall


def draw(saved: Results, run_dir: Path) -> Path:
    """waterfall.png: a ladder's, or a race's (tokens/s beside × faster to the target)."""
    path = Path(run_dir) / WATERFALL
    return race_plot(saved, path) if saved.run_kind is RunKind.RACE else waterfall(saved, path)


def files(saved: Results, run_dir: Path) -> dict[str, Path]:
    """The files a result of this kind has beside it, drawn from it: its plot and report.html, by name (a
    profile has none: its trace is the profiler's own)."""
    run_dir = Path(run_dir)
    kind = saved.run_kind
    if kind is RunKind.PROFILE:
        return {}
    if kind is RunKind.SWEEP:
        page = run_dir / html.FILENAME
        page.write_text(sweep_curve.html(saved), encoding="utf-8")
        return {"plot": sweep_curve.plot(saved, run_dir / sweep_curve.SWEEP_PLOT), "report": page}
    if kind in (RunKind.PREDICT, RunKind.DDP):
        return {"plot": scaling.plot(saved, run_dir / scaling.SCALING_PLOT), "report": html.write(saved, run_dir)}
    return {"waterfall": draw(saved, run_dir), "report": html.write(saved, run_dir)}


def print_view(saved: Results, wide: bool = False, folder: str = "RUN_DIR") -> None:
    """The printed view of a saved result, by its kind: a profile, a race, a sweep, predict/ddp, a ladder (a tune's
    with its candidates and winner; wide: every column of its rung table, in a terminal; folder: what its
    conclusion's commands name)."""
    kind = saved.run_kind
    if kind is RunKind.PROFILE:
        print_profile(saved)
    elif kind is RunKind.RACE:
        print_race(saved)
    elif kind is RunKind.SWEEP:
        sweep_curve.print_sweep(saved)
    elif kind in (RunKind.PREDICT, RunKind.DDP):
        scaling.print_parallel(saved)
    else:
        print_report(saved, wide=wide, folder=folder)
        print_tune(saved)  # nothing unless it is a tune's


def show(saved: Results, run_dir: Path, quiet: bool = False, source: Path | None = None,
         wide: bool = False) -> dict[str, Path]:
    """Draw a saved result's files and, unless quiet, print its view and name its files: how every command ends
    (run, tune, race, sweep, predict, ddp, profile and report alike), so the table, the plot and the page agree.
    source: the file it was read from, when not the folder's own results.json (or profile.json); wide: every
    column of a rung table, in a terminal (--wide)."""
    run_dir = Path(run_dir)
    written = files(saved, run_dir)
    kind = saved.run_kind
    if not quiet:
        print_view(saved, wide, str(source or run_dir))
        if kind is RunKind.PROFILE:
            named = {"profile": source or run_dir / step_profile.FILENAME}
            if (run_dir / step_profile.TRACE).exists():
                named["trace"] = run_dir / step_profile.TRACE
        else:
            named = {"results": source or run_dir / storage.FILENAME, **written}
        print("\n".join(f"{name}: {path}" for name, path in named.items()))
    return written

