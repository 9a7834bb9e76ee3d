"""The command line: parse, build, run, always leave a readable result behind.

Every default shown by --help is read from the config dataclasses.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from speedladder import __version__, check, compare, parallel_cli
from speedladder.config import (
    FULL_LADDER,
    LADDERS,
    SETUPS,
    SOURCE_LADDER,
    GateConfig,
    ProfileConfig,
    RunConfig,
    TimingConfig,
    TrainConfig,
    TuneConfig,
    default,
)
from speedladder.errors import UsageError
from speedladder.model import PRESETS


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def _rungs(text: str) -> tuple[str, ...]:
    return tuple(r.strip() for r in text.split(",") if r.strip())


def _presets_help() -> str:
    return ", ".join(f"{name} (B={s.batch_size}, T={s.seq_len}, {s.corpus})" for name, s in SETUPS.items())


def add_workload_flags(p: argparse.ArgumentParser) -> None:
    """Model, data, device and timing flags, shared by the commands that train."""
    add_model_flags(p)
    add_timing_flags(p)


def add_model_flags(p: argparse.ArgumentParser) -> None:
    """Model, data, device, learning rate and seed: what any command that trains needs."""
    p.add_argument("--preset", choices=list(PRESETS), metavar="NAME",
                   help=f"model and workload: {_presets_help()}. Default: d2l-512 on CUDA, "
                        "d2l-cpu (scaled down to finish in minutes) elsewhere")
    p.add_argument("--data", metavar="NAME|PATH",
                   help="embedded corpus (timemachine, tinyshakespeare) or a UTF-8 text file. "
                        "Default: the preset's corpus")
    p.add_argument("--tokenizer", choices=["char", "gpt2"],
                   help="char: d2l's 28 symbols; gpt2: GPT-2 BPE from the shipped ranks. Default: the preset's")
    p.add_argument("--batch-size", type=int, metavar="B", help="sequences per step. Default: the preset's")
    p.add_argument("--seq-len", type=int, metavar="T", help="tokens per sequence. Default: the preset's")
    p.add_argument("--device", default=default(RunConfig, "device"),
                   help="auto (CUDA, else MPS, else CPU), cpu, cuda, cuda:N or mps. Default: %(default)s")
    p.add_argument("--lr", type=float, default=default(RunConfig, "lr"),
                   help="AdamW learning rate. Default: %(default)s")
    p.add_argument("--seed", type=int, default=default(RunConfig, "seed"),
                   help="seed of the initial weights and the batches. Default: %(default)s")


def add_timing_flags(p: argparse.ArgumentParser) -> None:
    """How each rung is timed."""
    p.add_argument("--steps", type=int, metavar="N", help="steps per timed window. Default: the preset's")
    p.add_argument("--windows", type=int, default=default(TimingConfig, "windows"), metavar="W",
                   help="timed windows per rung, at least 3. Default: %(default)s")
    p.add_argument("--warmup", type=int, metavar="N",
                   help="compile-free warm-up steps before timing. Default: the preset's")
    p.add_argument("--max-warmup", type=int, default=default(TimingConfig, "max_warmup"), metavar="N",
                   help="stop waiting for compilation to settle after this many steps. Default: %(default)s")


def add_rung_flags(p: argparse.ArgumentParser) -> None:
    """Which techniques, shared by the commands that build a step from rungs."""
    p.add_argument("--ladder", choices=list(LADDERS), default=default(RunConfig, "ladder"),
                   help="source: the source text's R0-R4; full: " + ",".join(LADDERS["full"].rungs)
                        + " with " + ",".join(LADDERS["full"].beside) + " measured beside its top. "
                        "Default: %(default)s")
    p.add_argument("--rungs", type=_rungs, metavar="A,B,C",
                   help="rungs in order, each building on the last that passed; wins over --ladder (and drops "
                        f"its beside rungs). Default: {','.join(SOURCE_LADDER)}, i.e. the --ladder's rungs")
    p.add_argument("--batch-multiplier", type=int, metavar="K",
                   help="the batch rung multiplies the batch by K. Default: the preset's")


def add_output_flags(p: argparse.ArgumentParser) -> None:
    """Where the run folder goes, and whether progress is shown: shared by the commands that write one."""
    p.add_argument("--out", default=default(RunConfig, "out"), metavar="DIR",
                   help="parent folder of the run folder DIR/<timestamp>/. Default: %(default)s")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def add_profile_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile-steps", type=int, default=default(ProfileConfig, "steps"), metavar="N",
                   help="steps profiled, each synchronized at its end. Default: %(default)s")


def build_parser() -> Parser:
    parser = Parser(prog="speedladder",
                    description="Measure transformer training honestly, then climb a ladder of speed "
                                "techniques one measured, verified rung at a time.")
    parser.add_argument("--version", action="version", version=f"speedladder {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    run = sub.add_parser("run", help="climb the ladder and write runs/<timestamp>/",
                         description="Climb the ladder: time every rung in windows, check it still computes "
                                     "the same function and still learns, print the table, write results.json "
                                     "and waterfall.png.")
    add_workload_flags(run)
    add_rung_flags(run)
    run.add_argument("--peak-tflops", type=float, metavar="X",
                     help="peak TFLOP/s for MFU, e.g. a measured bf16 ceiling. Default: the vendor table "
                          "for known GPUs, none (MFU n/a) elsewhere")
    gates = GateConfig()
    run.add_argument("--loss-steps", type=int, default=gates.loss_steps, metavar="K",
                     help="steps over the same first K batches compared with eager fp32. Default: %(default)s")
    run.add_argument("--loss-band", type=float, default=gates.loss_band, metavar="F",
                     help="largest allowed relative loss difference from eager fp32. Default: %(default)s")
    run.add_argument("--learns-steps", type=int, default=gates.learns_steps, metavar="N",
                     help="steps of the final learns-check; 0 skips it. Default: %(default)s")
    run.add_argument("--learns-min-drop", type=float, default=gates.learns_min_drop, metavar="F",
                     help="the learns-check's loss must fall by this fraction. Default: %(default)s")
    run.add_argument("--target-steps", type=int, default=gates.target_steps, metavar="N",
                     help="a rung that changes the optimizer (muon) is compared with AdamW by the tokens each needs "
                          "to reach AdamW's loss over N batches. Default: %(default)s")
    run.add_argument("--no-profile", action="store_true",
                     help="skip the baseline profile and the predictions made from it")
    add_profile_flags(run)
    add_output_flags(run)

    prof = sub.add_parser("profile", help="profile the baseline, name its regime, predict every rung",
                          description="Profile a few steps of the baseline in a child process: the top operators, "
                                      "one step broken into categories that add to 100%%, the regime (compute-, "
                                      "memory- or overhead-bound) with its evidence, and a predicted speed-up "
                                      "with its reason for every rung of the ladder. Writes profile.json and a "
                                      "Chrome/Perfetto trace.json to DIR/<timestamp>/.")
    add_workload_flags(prof)
    add_rung_flags(prof)
    add_profile_flags(prof)
    prof.add_argument("--profile-rungs", type=_rungs, default=(), metavar="A,B,C",
                      help="profile the spec these rungs make instead of the baseline (predictions then start "
                           "from it). Default: the baseline")
    add_output_flags(prof)

    tune = sub.add_parser("tune", help="find the fastest configuration that passes every gate, within a budget",
                          description="Climb the full ladder, drop each rung whose verdict is loss or noise (or "
                                      "that failed a gate or could not run), measure the survivors together (and, "
                                      "budget permitting, each left out in turn) with the same windows and gates, "
                                      "and name the fastest that passes every gate and the learns-check, with the "
                                      "commands that reproduce it. Writes DIR/<timestamp>/results.json.")
    add_workload_flags(tune)
    tune.add_argument("--batch-multiplier", type=int, metavar="K",
                      help="the batch rung multiplies the batch by K. Default: the preset's")
    tune.add_argument("--budget-minutes", type=float, default=default(TuneConfig, "budget_minutes"), metavar="M",
                      help="time for the whole search; work that would not fit is not started (the final "
                           "learns-check always runs). Default: %(default)s")
    tune.add_argument("--max-candidates", type=int, default=default(TuneConfig, "max_candidates"), metavar="N",
                      help="combinations to measure at most. Default: %(default)s")
    tune.add_argument("--peak-tflops", type=float, metavar="X",
                      help="peak TFLOP/s for MFU. Default: the vendor table for known GPUs, none elsewhere")
    add_output_flags(tune)

    train = sub.add_parser("train", help="train one configuration, log its loss, sample text, save a checkpoint",
                           description="Train a configuration for --steps steps, logging loss, step time and "
                                       "tokens/s every --log-every steps, then print a sample of generated text "
                                       "and save RUN/<timestamp>/checkpoint.pt (load it with "
                                       "torch.load(path, weights_only=True)).")
    add_model_flags(train)
    train.add_argument("--run", metavar="RUN_DIR",
                       help="train the winner of that folder's results.json (tune's winner, else the run's "
                            "fastest rung), on its workload. Default: none")
    train.add_argument("--rungs", type=_rungs, metavar="A,B,C",
                       help="train the spec these rungs compose to, applied in order without gates. Default: the "
                            "top of the full ladder here, i.e. every rung of " + ",".join(FULL_LADDER)
                            + " whose requirement this machine meets, composed (not measured: use --run for a "
                              "measured winner)")
    train.add_argument("--batch-multiplier", type=int, metavar="K",
                       help="the batch rung multiplies the batch by K. Default: the preset's")
    train.add_argument("--steps", type=int, default=default(TrainConfig, "steps"), metavar="N",
                       help="training steps. Default: %(default)s")
    train.add_argument("--log-every", type=int, default=default(TrainConfig, "log_every"), metavar="N",
                       help="log loss, step time and tokens/s every N steps. Default: %(default)s")
    train.add_argument("--sample-tokens", type=int, default=default(TrainConfig, "sample_tokens"), metavar="N",
                       help="tokens generated after the corpus's first tokens; 0: no sample. Default: %(default)s")
    train.add_argument("--out", default=default(TrainConfig, "out"), metavar="DIR",
                       help="the checkpoint goes to DIR/<timestamp>/checkpoint.pt. Default: %(default)s")

    report = sub.add_parser("report", help="print the table and redraw waterfall.png from a run folder",
                            description="Read RUN_DIR/results.json, print its table and redraw its waterfall.png "
                                        "(scaling.png for predict/ddp); for a profile folder, print the profile.")
    report.add_argument("run_dir", metavar="RUN_DIR",
                        help="a run, tune, predict, ddp or profile folder (or its results.json / profile.json)")
    parallel_cli.add_commands(sub)  # predict, ddp
    compare.add_commands(sub)
    check.add_commands(sub)
    return parser


def run_config(args: argparse.Namespace) -> RunConfig:
    """The flags as a RunConfig; a flag a command does not have keeps the dataclass default."""
    gates = GateConfig()
    return RunConfig(
        preset=args.preset, data=args.data, tokenizer=args.tokenizer, batch_size=args.batch_size,
        seq_len=args.seq_len, batch_multiplier=args.batch_multiplier, ladder=getattr(args, "ladder", "source"),
        rungs=getattr(args, "rungs", None), device=args.device,
        lr=args.lr, seed=args.seed, out=args.out, peak_tflops=getattr(args, "peak_tflops", None),
        timing=TimingConfig(steps=args.steps, windows=args.windows, warmup=args.warmup,
                            max_warmup=args.max_warmup),
        gates=GateConfig(loss_steps=getattr(args, "loss_steps", gates.loss_steps),
                         loss_band=getattr(args, "loss_band", gates.loss_band),
                         learns_steps=getattr(args, "learns_steps", gates.learns_steps),
                         learns_min_drop=getattr(args, "learns_min_drop", gates.learns_min_drop),
                         target_steps=getattr(args, "target_steps", gates.target_steps)),
        profile=ProfileConfig(enabled=not getattr(args, "no_profile", False),
                              steps=getattr(args, "profile_steps", default(ProfileConfig, "steps"))),
    )


def finish(run_dir: Path) -> None:
    """Print the table and draw the waterfall from the saved file, so all three agree."""
    from speedladder import html_report, report, results

    saved = results.load(run_dir)
    report.print_report(saved)
    png = report.waterfall(saved, run_dir / report.WATERFALL)
    print(f"results: {run_dir / results.FILENAME}\nwaterfall: {png}\nreport: {html_report.write(saved, run_dir)}")


def start(args: argparse.Namespace, cfg: RunConfig):
    """Progress, the prepared workload and a new run folder: how every command that measures begins."""
    from speedladder import results
    from speedladder.ladder import prepare
    from speedladder.progress import Progress

    progress = Progress(quiet=args.quiet)
    work = prepare(cfg)
    if work.cfg.preset_note:
        progress(work.cfg.preset_note)
    return progress, work, results.new_run_dir(work.cfg.out)


def cmd_run(args: argparse.Namespace) -> int:
    from speedladder.ladder import Ladder

    progress, work, run_dir = start(args, run_config(args))
    progress(f"{work.cfg.preset}: {work.params:,} parameters on {work.device}; "
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
    from speedladder import predict, profile, report, results
    from speedladder.rungs import RUNGS

    unknown = [r for r in args.profile_rungs if r not in RUNGS]
    if unknown:
        raise UsageError(f"unknown rung {unknown[0]!r} in --profile-rungs (choose from {', '.join(RUNGS)})")
    progress, work, run_dir = start(args, run_config(args))
    progress(f"profiling {work.cfg.profile.steps} steps of {work.cfg.preset} on {work.device} in a child process",
             "profile")
    b = profile.run_in_child(work.cfg.to_run_config(), args.profile_rungs, run_dir / profile.TRACE,
                             work.cfg.profile.timeout_s)
    base = profile.spec_of(b)
    # Predictions start from the profiled spec: its own rungs (and the eager baseline under them) are behind it.
    rungs = [r for r in work.cfg.rungs if r not in args.profile_rungs and not (args.profile_rungs and r == "eager")]
    preds = predict.chain(b, rungs, base, work.env)
    # A rung measured beside the top (the full ladder's ckpt) is predicted on the whole ladder under it.
    preds += [predict.chain(b, [*rungs, name], base, work.env)[-1] for name in work.cfg.beside]
    saved = {"schema": results.SCHEMA, "kind": "profile", "created": results.now(),
             "command": results.command_line(), "config": work.cfg.to_dict(),
             "environment": results.environment(work.device), "model": {"preset": work.cfg.preset,
                                                                        "params": work.params},
             "profile": b, "predictions": [p.to_dict() for p in preds]}
    results.save(saved, run_dir, profile.FILENAME)
    report.print_profile(saved)
    print(f"profile: {run_dir / profile.FILENAME}\ntrace: {run_dir / profile.TRACE}")
    return 0


def cmd_tune(args: argparse.Namespace) -> int:
    from speedladder import html_report, report, results, tune
    from speedladder.ladder import Ladder

    if args.budget_minutes <= 0:
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
        res["tune"] = {"budget_minutes": args.budget_minutes, "survivors": list(tune.survivors(res)),
                       "dropped": tune.dropped(res)}
        say(f"survivors: {', '.join(res['tune']['survivors']) or 'none'}; dropped: "
            + ("; ".join(f"{k} ({v})" for k, v in res["tune"]["dropped"].items()) or "none"))
        res["tune"]["candidates"] = tune.measure_candidates(ladder, budget, args.max_candidates, say)
        ladder.save()

    interrupted = False
    try:
        ladder.run(after_climb=combine)
    except KeyboardInterrupt:
        interrupted = True
    ladder.results.setdefault("tune", {}).update(tune.summarize(ladder.results, str(run_dir), work.cfg))
    ladder.results["tune"]["seconds"] = budget.seconds - budget.left()
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
    from speedladder import train

    return train.main(args)


def cmd_report(args: argparse.Namespace) -> int:
    from speedladder import html_report, profile, report, results

    given = Path(args.run_dir)
    if given.is_dir() and not (given / results.FILENAME).exists() and (given / profile.FILENAME).exists():
        given = given / profile.FILENAME  # a `speedladder profile` folder
    saved = results.load(given)
    if saved.get("kind") == "profile":
        report.print_profile(saved)
        return 0
    run_dir = given if given.is_dir() else given.parent
    if saved.get("parallel"):  # written by predict or ddp
        from speedladder import parallel_report

        parallel_report.print_parallel(saved)
        print(f"plot: {parallel_report.plot(saved, run_dir / parallel_report.SCALING_PLOT)}")
        print(f"report: {html_report.write(saved, run_dir)}")
        return 0
    report.print_report(saved)
    report.print_tune(saved)  # nothing unless the folder is a tune's
    print(f"waterfall: {report.waterfall(saved, run_dir / report.WATERFALL)}")
    print(f"report: {html_report.write(saved, run_dir)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return {"run": cmd_run, "profile": cmd_profile, "tune": cmd_tune, "train": cmd_train, "report": cmd_report,
                "predict": parallel_cli.cmd_predict, "ddp": parallel_cli.cmd_ddp, "compare": compare.cmd_compare,
                "check": check.cmd_check}[args.command](args)
    except UsageError as e:
        print(f"speedladder: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("speedladder: interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        from speedladder.parallel import JobFailed

        if isinstance(e, JobFailed):  # a torchrun job that failed: its first failing rank's line
            return parallel_cli.job_failed(e)
        raise
