"""`speedladder race`: each configuration trained to a target val loss over seeds, judged by the time (racing/)."""

from __future__ import annotations

import argparse
import dataclasses
import sys

from speedladder import results, tune
from speedladder.cli.flags import (
    add_batch_multiplier,
    add_model_flags,
    add_output_flags,
    add_warmup_flags,
    run_config,
    rung_list,
)
from speedladder.config import RACE_LADDER, RaceConfig, RunConfig, check_race, run_config_from_dict
from speedladder.errors import UsageError
from speedladder.progress import show_on_stderr
from speedladder.racing import Race
from speedladder.report import race as race_report
from speedladder.report.outputs import write_outputs
from speedladder.rungs import RUNGS
from speedladder.workload import prepare

HELP = ("train each configuration to a target val loss over seeds; judge it by the time, with a p-value",
        ("Train every configuration (a cumulative ladder of rungs, given combinations, or a run's winner) from the same "
        "initial weights and batch order, seed by seed, until its val loss on held-out data reaches the target; the "
        "clock runs over training steps only. Judge each against the configuration it builds on by Welch's t-test "
        "on the times, one-sided each way (win or loss at p < 0.01, else noise). Writes DIR/<timestamp>/results.json, "
        "waterfall.png (tokens/s beside × faster to the target) and report.html."))


def combo_list(text: str) -> tuple[tuple[str, ...], ...]:
    """'compile+bf16,bf16+batch' -> (("compile", "bf16"), ("bf16", "batch"))."""
    combos = tuple(tuple(r.strip() for r in part.split("+") if r.strip()) for part in text.split(","))
    if not combos or any(not c for c in combos):
        raise argparse.ArgumentTypeError(f"give combinations as A+B,C+D, got {text!r}")
    return combos


def add_commands(sub) -> None:
    p = sub.add_parser("race", help=HELP[0], description=HELP[1])
    add_model_flags(p)
    add_warmup_flags(p)
    add_batch_multiplier(p)
    which = p.add_mutually_exclusive_group()
    which.add_argument("--rungs", type=rung_list, metavar="A,B,C",
                       help="a cumulative ladder, each configuration the one before plus one rung, judged against "
                            f"it. Default: {','.join(RACE_LADDER)}")
    which.add_argument("--combos", type=combo_list, metavar="A+B,C+D",
                       help="configurations of rungs composed on eager, each judged against eager. Default: none")
    which.add_argument("--run", metavar="RUN_DIR",
                       help="race that folder's winner (a tune's, else the run's fastest rung) against eager, on its "
                            "workload. Default: none")
    race = RaceConfig()
    p.add_argument("--target-loss", type=float, metavar="L",
                   help="the val loss to reach. Default: calibrated, eager fp32's val loss after --calibrate-steps "
                        "steps on a seed of its own")
    p.add_argument("--calibrate-steps", type=int, default=race.calibrate_steps, metavar="N",
                   help="the calibration's steps (and, with --target-loss, what the time cap is priced from). "
                        "Default: %(default)s")
    p.add_argument("--seeds", type=int, default=race.seeds, metavar="N",
                   help="runs per configuration, seeds --seed, --seed+1, ...; more raise the power. Default: "
                        "%(default)s")
    p.add_argument("--eval-every", type=int, default=race.eval_every, metavar="N",
                   help="val loss every N base steps' worth of tokens (the clock stops meanwhile). Default: "
                        "%(default)s")
    p.add_argument("--time-cap", type=float, metavar="S",
                   help="seconds of training after which a run that has not reached the target stops (did not "
                        f"reach). Default: {race.cap_factor:g}x eager fp32's --calibrate-steps steps")
    p.add_argument("--cap-factor", type=float, default=race.cap_factor, metavar="F",
                   help="the time cap as a multiple of eager fp32's --calibrate-steps steps. Default: %(default)s")
    p.add_argument("--alpha", type=float, default=race.alpha, metavar="P",
                   help="win or loss only at p below this, one-sided each way. Default: %(default)s")
    p.add_argument("--detect", type=float, default=race.detect, metavar="F",
                   help="a note says when the seeds cannot detect a change this large at --alpha. Default: "
                        "%(default)s")
    add_output_flags(p)


def _race_config(args: argparse.Namespace) -> RaceConfig:
    return RaceConfig(seeds=args.seeds, target_loss=args.target_loss, calibrate_steps=args.calibrate_steps,
                      eval_every=args.eval_every, time_cap_s=args.time_cap, cap_factor=args.cap_factor,
                      alpha=args.alpha, detect=args.detect, combos=args.combos or ())


def _winner(run_dir: str) -> tuple[dict, tuple[str, ...], str]:
    """A run folder's saved config, its winner's rungs (tune's, else the fastest rung's chain), and the winner's name."""
    saved = results.load(run_dir)
    if saved.tune and saved.tune.get("winner"):
        return saved.config, tuple(saved.tune["winner_rungs"]), saved.tune["winner"]
    best = saved.rung(saved.fastest) if saved.fastest else None
    if best is None:
        raise UsageError(f"{run_dir} names no configuration that passed every gate")
    return saved.config, tuple(n for n in tune.rungs_of(best, saved) if n != "eager"), best.name


def plan(args: argparse.Namespace) -> tuple[RunConfig, tuple[tuple[str, ...], ...] | None, str]:
    """The run configuration, the combinations (None: a ladder in cfg.rungs) and their role."""
    cfg = run_config(args)
    if args.run:
        saved, names, _ = _winner(args.run)
        cfg = dataclasses.replace(run_config_from_dict(saved, device=args.device), out=args.out, seed=args.seed,
                                  val_data=args.val_data, val_sequences=args.val_sequences,
                                  rungs=("eager", *names), beside=(), ladder=None)
        return cfg, (names,), "winner"
    if args.combos:
        unknown = [n for c in args.combos for n in c if n not in RUNGS]
        if unknown:
            raise UsageError(f"unknown rung {unknown[0]!r} in --combos (choose from {', '.join(RUNGS)})")
        names = tuple(dict.fromkeys(n for c in args.combos for n in c if n != "eager"))
        return dataclasses.replace(cfg, rungs=("eager", *names), beside=(), ladder=None), args.combos, "combo"
    return dataclasses.replace(cfg, rungs=tuple(args.rungs or RACE_LADDER), beside=(), ladder=None), None, "rung"


def cmd_race(args: argparse.Namespace) -> int:
    race_cfg = _race_config(args)
    check_race(race_cfg)
    cfg, combos, role = plan(args)
    progress = show_on_stderr(args.quiet)
    work = prepare(cfg)
    work.val_set(work.cfg.seq_len)  # a val split too small for one batch is refused before any folder is made
    if work.cfg.preset_note:
        progress(work.cfg.preset_note)
    run_dir = results.new_run_dir(work.cfg.run.out)
    progress(f"{work.model.name if work.cfg.model is None else work.cfg.run.preset}: {work.params:,} parameters on "
             f"{work.device}; {work.data_line}; writing {run_dir}")
    race = Race(work, run_dir, race_cfg, progress, role=role)
    try:
        if combos is None:
            race.prepare_ladder(work.cfg.run.rungs or ())
        else:
            race.prepare_combos(combos, role)
        race.run()
    except KeyboardInterrupt:
        finish(run_dir)
        print("interrupted: the runs finished before the stop are kept", file=sys.stderr)
        return 130
    finish(run_dir)
    return 0


def finish(run_dir) -> None:
    saved, png, page = write_outputs(run_dir)
    race_report.print_race(saved)
    print(f"results: {run_dir / results.FILENAME}\nwaterfall: {png}\nreport: {page}")

