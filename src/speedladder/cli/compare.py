"""`speedladder compare RUN_A RUN_B ...`: runs side by side, rung by rung (report/compare.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from speedladder.cli.flags import command
from speedladder.errors import UsageError
from speedladder.report.compare import html, load, print_comparison


def add_commands(sub) -> None:
    p = command(sub, "compare")
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="two or more run folders (or results.json files); "
                                                               "the first is the reference")
    p.add_argument("--html", metavar="FILE", help="also write the comparison as a self-contained HTML page. "
                                                   "Default: none")


def cmd_compare(args: argparse.Namespace) -> int:
    if len(args.runs) < 2:
        raise UsageError("compare needs at least two runs")
    comp = load(args.runs)
    print_comparison(comp)
    if args.html:
        path = Path(args.html)
        try:
            path.write_text(html(comp, args.runs), encoding="utf-8")
        except OSError as e:
            raise UsageError(f"cannot write {path}: {e.strerror}") from None
        print(f"html: {path}")
    return 0
