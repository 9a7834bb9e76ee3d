"""The files every climb leaves beside its results.json, drawn from that file alone: waterfall.png, report.html."""

from __future__ import annotations

from pathlib import Path

from speedladder import results
from speedladder.records import Results
from speedladder.report import html
from speedladder.report.race_charts import race_plot
from speedladder.report.waterfall import WATERFALL, waterfall


def draw(saved: Results, run_dir: Path) -> Path:
    """waterfall.png: a ladder's, or a race's (tokens/s beside × faster to the target)."""
    path = Path(run_dir) / WATERFALL
    return race_plot(saved, path) if saved.race is not None else waterfall(saved, path)


def write_outputs(run_dir: Path) -> tuple[Results, Path, Path]:
    """The saved results, and the waterfall and the HTML report drawn from them (the CLI and the API alike)."""
    saved = results.load(run_dir)
    return saved, draw(saved, run_dir), html.write(saved, run_dir)
