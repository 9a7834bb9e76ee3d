"""The files every climb leaves beside its results.json, drawn from that file alone: waterfall.png, report.html."""

from __future__ import annotations

from pathlib import Path

from speedladder import results
from speedladder.records import Results
from speedladder.report import html
from speedladder.report.waterfall import WATERFALL, waterfall


def write_outputs(run_dir: Path) -> tuple[Results, Path, Path]:
    """The saved results, and the waterfall and the HTML report drawn from them (the CLI and the API alike)."""
    saved = results.load(run_dir)
    return saved, waterfall(saved, run_dir / WATERFALL), html.write(saved, run_dir)
