"""The commands that climb, profile, tune, train and report: their flags and their thin bodies."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from speedladder import report, results, train, tune
from speedladder.cli.flags import (
    add_batch_multiplier,
    add_climb_flags,
    add_memory_flags,
    add_model_flags,
    add_output_flags,
    add_profile_flags,
    add_rung_flags,
    add_workload_flags,
    command,
    run_config,
    rung_list,
)
from speedladder.config import FULL_LADDER, ProfileConfig, RunConfig, TrainConfig, TuneConfig, default
from speedladder.errors import UsageError
from speedladder.ladder import Ladder
from speedladder.profile import child
from speedladder.profile.predict import chain
from speedladder.progress import Progress, show_on_stderr
from speedladder.records import ProfileSummary, from_dict
from speedladder.report import html as html_report
from speedladder.report import parallel as parallel_report
from speedladder.report import race as race_report
from speedladder.report import sweep as sweep_report
from speedladder.report.outputs import draw, write_outputs
from speedladder.rungs import RUNGS
from speedladder.workload import Workload, new_results, prepare


def add_run(sub) -> None:
    """speedladder run: climb the ladder."""
    run = command(sub, "run", add_workload_flags, add_rung_flags, add_climb_flags)
    run.add_argument("--explain-miss", type=float, default=default(ProfileConfig, "explain_miss"), metavar="F",
                     help="a rung whose measured x misses its prediction by more than this fraction has its step "
                          "and its base's profiled side by side; 0: none. Default: %(default)s")
    add_profile_flags(run)
    add_memory_flags(run)
    add_output_flags(run)


def add_profile(sub) -> None:
    """speedladder profile: the baseline (or a spec) profiled, classified, predicted."""
    prof = command(sub, "profile", add_workload_flags, add_rung_flags, add_profile_flags)
    prof.add_argument("--profile-rungs", type=rung_list, default=(), metavar="A,B,C",
                      help="profile the spec these rungs make instead of the baseline (predictions then start "
                           "from it). Default: the baseline")
    add_output_flags(prof)


def add_tune(sub) -> None:
    """speedladder tune: the fastest configuration that passes every gate."""
    tune = command(sub, "tune", add_workload_flags, add_batch_multiplier, add_climb_flags, add_memory_flags)
    tune.add_argument("--budget-minutes", type=float, default=default(TuneConfig, "budget_minutes"), metavar="M",
                      help="time for the whole search; work that would not fit is not started (the final "
                           "learns-check always runs). Default: %(default)s")
    tune.add_argument("--max-candidates", type=int, default=default(TuneConfig, "max_candidates"), metavar="N",
                      help="combinations to measure at most: the survivors together, then each left out in "
                           "turn. Default: %(default)s")
    add_output_flags(tune)


def add_train(sub) -> None:
    """speedladder train: train one configuration, sample, save a checkpoint."""
    train = command(sub, "train", add_model_flags)
    train.add_argument("--run", metavar="RUN_DIR",
                       help="train the winner of that folder's results.json (tune's winner, else the run's "
                            "fastest rung), on its workload. Default: none")
    train.add_argument("--rungs", type=rung_list, metavar="A,B,C",
                       help="train the spec these rungs compose to, applied in order without gates. Default: the "
                            "top of the full ladder here, i.e. every rung of " + ",".join(FULL_LADDER)
                            + " whose requirement this machine meets, composed (not measured: use --run for a "
                              "measured winner)")
    add_batch_multiplier(train)
    train.add_argument("--steps", type=int, default=default(TrainConfig, "steps"), metavar="N",
                       help="training steps. Default: %(default)s")
    train.add_argument("--log-every", type=int, default=default(TrainConfig, "log_every"), metavar="N",
                       help="log loss, step time and tokens/s every N steps. Default: %(default)s")
    train.add_argument("--eval-every", type=int, default=default(TrainConfig, "eval_every"), metavar="N",
                       help="val loss on the held-out split every N steps and after the last, the clock stopped "
                            "meanwhile; the weights at the best one are saved as best.pt; 0: none. Default: "
                            "%(default)s")
    train.add_argument("--sample-tokens", type=int, default=default(TrainConfig, "sample_tokens"), metavar="N",
                       help="tokens generated after the corpus's first tokens; 0: no sample. Default: %(default)s")
    train.add_argument("--out", default=default(TrainConfig, "out"), metavar="DIR",
                       help="the checkpoint goes to DIR/<timestamp>/checkpoint.pt. Default: %(default)s")
    train.add_argument("--quiet", action="store_true",
                       help="no log line per --log-every steps; the final loss, sample and checkpoint are printed")


def add_report(sub) -> None:
    """speedladder report: print and redraw from a saved folder."""
    report = sub.add_parser("report", help="print the table and redraw waterfall.png from a run folder",
                            description="Read RUN_DIR/results.json, print its table and redraw its waterfall.png "
                                        "(scaling.png for predict/ddp); for a profile folder, print the profile.")
    report.add_argument("run_dir", metavar="RUN_DIR",
                        help="a run, tune, predict, ddp or profile folder (or its results.json / profile.json)")


def finish(run_dir: Path) -> None:
    """Print the table and draw the waterfall from the saved file, so all three agree."""
    saved, png, page = write_outputs(run_dir)
    report.print_report(saved)
    print(f"results: {run_dir / results.FILENAME}\nwaterfall: {png}\nreport: {page}")


def start(args: argparse.Namespace, cfg: RunConfig) -> tuple[Progress, Workload, Path]:
    """Progress, the prepared workload and a new run folder: how every command that measures begins."""
    progress = show_on_stderr(args.quiet)
    work = prepare(cfg)
    if work.cfg.preset_note:
        progress(work.cfg.preset_note)
    return progress, work, results.new_run_dir(work.cfg.run.out)


def cmd_run(args: argparse.Namespace) -> int:
    if not args.explain_miss >= 0:
        raise UsageError(f"--explain-miss must be zero or more, got {args.explain_miss}")
    progress, work, run_dir = start(args, run_config(args))
    progress(f"{work.model.name if work.cfg.model is None else work.cfg.run.preset}: {work.params:,} parameters on "
             f"{work.device} ({work.model.convention_line}); "
             f"{work.corpus.n_tokens:,} tokens of {work.corpus.source}; writing {run_dir}")
    ladder = Ladder(work, run_dir, progress)
    try:
        ladder.run()
    except KeyboardInterrupt:
        finish(run_dir)
        print("interrupted: the rungs measured before the stop are kept", file=sys.stderr)
        return 130
    finish(run_dir)
    return 0


def cmd_profile(args: argparse.Namespace) -> int:
    unknown = [r for r in args.profile_rungs if r not in RUNGS]
    if unknown:
        raise UsageError(f"unknown rung {unknown[0]!r} in --profile-rungs (choose from {', '.join(RUNGS)})")
    progress, work, run_dir = start(args, run_config(args))
    run = work.cfg.run
    progress(f"profiling {run.profile.steps} steps of {run.preset} on {work.device} in a child process", "profile")
    b = child.run_in_child(run, args.profile_rungs, run_dir / child.TRACE, run.profile.timeout_s)
    summary = from_dict(ProfileSummary, b)
    base = child.spec_of(b)
    # Predictions start from the profiled spec: its own rungs (and the eager baseline under them) are behind it.
    rungs = [r for r in run.rungs or () if r not in args.profile_rungs and not (args.profile_rungs and r == "eager")]
    preds = chain(summary, rungs, base, work.env)
    # A rung measured beside the top (the full ladder's ckpt) is predicted on the whole ladder under it.
    preds += [chain(summary, [*rungs, name], base, work.env)[-1] for name in run.beside or ()]
    saved = new_results(work, kind="profile")
    saved.profile, saved.predictions, saved.status = summary, [p.to_dict() for p in preds], "complete"
    results.save(saved, run_dir, child.FILENAME)
    report.print_profile(saved)
    print(f"profile: {run_dir / child.FILENAME}\ntrace: {run_dir / child.TRACE}")
    return 0


def cmd_tune(args: argparse.Namespace) -> int:
    if not args.budget_minutes > 0:
        raise UsageError(f"the budget must be positive, got {args.budget_minutes} minutes")
    if args.max_candidates < 0:
        raise UsageError(f"the number of candidates must be zero or more, got {args.max_candidates}")
    progress, work, run_dir = start(args, dataclasses.replace(run_config(args), ladder="full", rungs=None))
    progress(f"tune: the full ladder, then its survivors together, within {args.budget_minutes:g} min; "
             f"writing {run_dir}")
    ladder = Ladder(work, run_dir, progress)
    budget = tune.Budget(args.budget_minutes * 60, ladder.results, reserve=1)
    ladder.budget = budget.reason
    say = progress.scoped("tune")

    def combine() -> None:
        res = ladder.results
        res.tune = {"budget_minutes": args.budget_minutes, "survivors": list(tune.survivors(res)),
                    "dropped": tune.dropped(res)}
        say(f"survivors: {', '.join(res.tune['survivors']) or 'none'}; dropped: "
            + ("; ".join(f"{k} ({v})" for k, v in res.tune["dropped"].items()) or "none"))
        res.tune["candidates"] = tune.measure_candidates(ladder, budget, args.max_candidates, say)
        res.tune["finalists"] = tune.measure_finalists(ladder, budget, default(TuneConfig, "finalists"), say)
        ladder.finalists = res.tune["finalists"] or None  # none passed again: the learns-check tries them all
        ladder.save()

    interrupted = False
    try:
        ladder.run(after_climb=combine)
    except KeyboardInterrupt:
        interrupted = True
    ladder.results.tune = {**(ladder.results.tune or {}), **tune.summarize(ladder.results, str(run_dir), work.cfg),
                           "seconds": budget.seconds - budget.left()}
    ladder.save()
    saved = results.load(run_dir)
    report.print_report(saved)
    report.print_tune(saved)
    print(f"results: {run_dir / results.FILENAME}\nwaterfall: {report.waterfall(saved, run_dir / report.WATERFALL)}")
    print(f"report: {html_report.write(saved, run_dir)}")
    if interrupted:
        print("interrupted: what was measured before the stop is kept", file=sys.stderr)
        return 130
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    return train.main(args)


def cmd_report(args: argparse.Namespace) -> int:
    given = Path(args.run_dir)
    if given.is_dir() and not (given / results.FILENAME).exists() and (given / child.FILENAME).exists():
        given = given / child.FILENAME  # a `speedladder profile` folder
    saved = results.load(given)
    if saved.kind == "profile":
        report.print_profile(saved)
        return 0
    run_dir = given if given.is_dir() else given.parent
    if saved.race is not None:  # written by race
        race_report.print_race(saved)
        print(f"waterfall: {draw(saved, run_dir)}")
        print(f"report: {html_report.write(saved, run_dir)}")
        return 0
    if saved.sweep is not None:  # written by sweep
        sweep_report.print_sweep(saved)
        print(f"plot: {sweep_report.plot(saved, run_dir / sweep_report.SWEEP_PLOT)}")
        return 0
    if saved.parallel is not None:  # written by predict or ddp
        parallel_report.print_parallel(saved)
        print(f"plot: {parallel_report.plot(saved, run_dir / parallel_report.SCALING_PLOT)}")
        print(f"report: {html_report.write(saved, run_dir)}")
        return 0
    report.print_report(saved)
    report.print_tune(saved)  # nothing unless the folder is a tune's
    print(f"waterfall: {report.waterfall(saved, run_dir / report.WATERFALL)}")
    print(f"report: {html_report.write(saved, run_dir)}")
    return 0
