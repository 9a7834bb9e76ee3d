"""`speedladder gates RUN_DIR RUNG`: one rung's gates again, alone, on a saved run (verify/rerun.py)."""

from __future__ import annotations

import argparse

from speedladder.cli.gen import Command
from speedladder.codec import Group
from speedladder.config.settings import Settings
from speedladder.progress import show_on_stderr
from speedladder.report.gate_details import gate_lines
from speedladder.verify.rerun import regate


def cmd_gates(s: Settings, ns: argparse.Namespace) -> int:
    gate = regate(ns.run_dir, ns.rung, progress=show_on_stderr(s.quiet))
    print("\n".join(gate_lines(ns.rung, gate, ns.run_dir)))
    return 0 if gate.passed else 1


def _inputs(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run folder (or its results.json)")
    p.add_argument("rung", metavar="RUNG", help="the rung whose gates to run again, as the table names it")


COMMANDS = (
    Command("gates", "run one rung's gates again, alone, on a saved run, and explain a failure",
            "Rebuild the saved run's workload from its configuration (model, data, seed, rung files by hash), gate "
            "the rungs below RUNG again in order, then RUNG's gates: equivalence and the differential check against "
            "fp64 on a probe off every kink, the loss band, causality; a failure names the module where the "
            "divergence starts and whether a second probe fails too. Nothing is timed or written. Exit 0 when the "
            "gate passes, 1 when it fails.", (Group.QUIET,), cmd_gates, _inputs),
)
