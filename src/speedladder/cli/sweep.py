"""`speedladder sweep`: one axis of the model or the workload varied, each rung's × over eager along it (sweep.py)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from speedladder import results
from speedladder.cli.flags import (
    add_memory_flags,
    add_model_flags,
    add_output_flags,
    add_timing_flags,
    run_config,
    rung_list,
)
from speedladder.config import default
from speedladder.errors import UsageError
from speedladder.progress import show_on_stderr
from speedladder.report import sweep as sweep_report
from speedladder.sweep import SweepConfig, run_sweep

# The axis flags: (flag, the axis it sets, what it varies).
AXIS_FLAGS = (("--widths", "width", "model widths (n_embd); heads scaled to keep the preset's head size, MLP ratio kept"),
              ("--layers", "layers", "numbers of blocks"),
              ("--seq-lens", "seq_len", "sequence lengths T (the position table grows to the longest)"),
              ("--batch-sizes", "batch_size", "batch sizes B"))


def int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"positive integers wanted, got {text!r}")
    return values


def add_commands(sub) -> None:
    p = sub.add_parser("sweep", help="vary the width, layers, sequence length or batch and find where a rung pays",
                       description="At each value of one axis, measure eager and each rung beside it with the run's "
                                   "windows and gates; print and plot each rung's × over eager with its spread, and "
                                   "name the crossover where a rung turns from loss to win (or back), or say that "
                                   "there is none in range. Writes DIR/<timestamp>/results.json, sweep.png, "
                                   "report.html and one ladder folder per point.")
    axes = p.add_mutually_exclusive_group(required=True)
    for flag, _, what in AXIS_FLAGS:
        axes.add_argument(flag, type=int_list, metavar="N,N,...", help=f"{what}. Default: none (one axis is required)")
    for add in (add_model_flags, add_timing_flags, add_memory_flags, add_output_flags):
        add(p)
    p.add_argument("--rungs", type=rung_list, default=default(SweepConfig, "rungs"), metavar="A,B,C",
                   help="rungs measured beside eager at every point (each on eager alone). Default: "
                        + ",".join(default(SweepConfig, "rungs")))
    p.add_argument("--batch-multiplier", type=int, metavar="K",
                   help="the batch rung multiplies the batch by K. Default: the preset's")
    p.add_argument("--budget-minutes", type=float, default=default(SweepConfig, "budget_minutes"), metavar="M",
                   help="a point whose estimated time does not fit in what is left is not started. "
                        "Default: %(default)s")


def _axis(args: argparse.Namespace) -> tuple[str, list[int]]:
    for flag, axis, _ in AXIS_FLAGS:
        values = getattr(args, flag.lstrip("-").replace("-", "_"))
        if values is not None:
            if len(set(values)) != len(values):
                raise UsageError(f"{flag} lists a value twice: {','.join(map(str, values))}")
            return axis, sorted(values)
    raise UsageError("one of " + ", ".join(f for f, _, _ in AXIS_FLAGS) + " is required")


def finish(run_dir: Path) -> None:
    """Print, plot and write the page from the saved file, so all three agree."""
    saved = results.load(run_dir)
    sweep_report.print_sweep(saved)
    png = sweep_report.plot(saved, run_dir / sweep_report.SWEEP_PLOT)
    page = run_dir / "report.html"
    page.write_text(sweep_report.html(saved), encoding="utf-8")
    print(f"results: {run_dir / results.FILENAME}\nplot: {png}\nreport: {page}")


def cmd_sweep(args: argparse.Namespace) -> int:
    axis, values = _axis(args)
    if not args.budget_minutes > 0:
        raise UsageError(f"the budget must be positive, got {args.budget_minutes} minutes")
    cfg = SweepConfig(rungs=args.rungs, budget_minutes=args.budget_minutes)
    run = dataclasses.replace(run_config(args), rungs=None)
    progress = show_on_stderr(args.quiet)
    run_dir = results.new_run_dir(run.out)
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
