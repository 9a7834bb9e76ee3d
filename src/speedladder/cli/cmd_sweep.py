"""`speedladder sweep`: one axis of the model or the workload varied, each rung's × over eager along it (sweep.py)."""

from __future__ import annotations

import argparse
import sys

from speedladder.cli.cmd_run import finish
from speedladder.cli.gen import Command
from speedladder.codec import Group
from speedladder.config.settings import Settings
from speedladder.progress import show_on_stderr
from speedladder.records import storage
from speedladder.sweep.axis import run_sweep


def cmd_sweep(s: Settings, _: argparse.Namespace) -> int:
    cfg = s.sweep
    axis, values = cfg.axis()
    run = s.run.with_ladder(None)
    progress = show_on_stderr(s.quiet)
    run_dir = storage.new_run_dir(run.out)
    progress(f"sweep of {axis} over {','.join(map(str, values))}: {','.join(cfg.rungs)}, within "
             f"{cfg.budget_minutes:g} min; writing {run_dir}")
    interrupted = False
    try:
        run_sweep(run, axis, values, cfg, run_dir, progress)
    except KeyboardInterrupt:
        interrupted = True
    finish(run_dir)  # what was measured is printed and plotted either way
    if interrupted:
        print("interrupted: the points measured before the stop are kept", file=sys.stderr)
        return 130
    return 0


COMMANDS = (
    Command("sweep", "vary the width, layers, sequence length or batch and find where a rung pays",
            "At each value of one axis, measure eager and each rung beside it with the run's windows and gates; print "
            "and plot each rung's × over eager with its spread, and name the crossover where a rung turns from loss "
            "to win (or back), or say that there is none in range. Writes DIR/<timestamp>/results.json, sweep.png, "
            "report.html and one ladder folder per point.",
            (Group.MODEL, Group.RUNG_FILES, Group.LEARNING, Group.RECIPE, Group.BATCH, Group.TIMING, Group.WARMUP, Group.MAX_WARMUP,
             Group.MEMORY, Group.SWEEP, Group.OUTPUT, Group.QUIET), cmd_sweep),
)
