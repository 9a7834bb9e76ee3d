"""`speedladder compare RUN_A RUN_B ...`: runs side by side, rung by rung (report/compare.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from speedladder.cli.gen import Command
from speedladder.codec import Group
from speedladder.config.settings import Settings
from speedladder.errors import UsageError
from speedladder.report.compare import html, load, print_comparison


def cmd_compare(s: Settings, ns: argparse.Namespace) -> int:
    if len(ns.runs) < 2:
        raise UsageError("compare needs at least two runs")
    comp = load(ns.runs, s.compare.drift_limit)
    print_comparison(comp)
    if s.compare.html:
        path = Path(s.compare.html)
        try:
            path.write_text(html(comp, ns.runs), encoding="utf-8")
        except OSError as e:
            raise UsageError(f"cannot write {path}: {e.strerror}") from None
        print(f"html: {path}")
    return 0


def _inputs(p: argparse.ArgumentParser) -> None:
    p.add_argument("runs", nargs="+", metavar="RUN_DIR",
                   help="two or more run folders (or results.json files); the first is the reference")


COMMANDS = (
    Command("compare", "compare runs side by side, rung by rung",
            "Align the runs' rungs by name and show, for each later run against the first: tokens/s, the ratio of the "
            "medians, whether the change is outside both runs' window spreads (their min–max ranges do not overlap), "
            "gate changes, and configuration or environment differences; races' configurations by their times to "
            "the target.", (Group.COMPARE,), cmd_compare, _inputs),
)
