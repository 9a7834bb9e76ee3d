"""The commands that climb, profile, tune, train and report: which flag groups each takes, and their thin bodies."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from speedladder import processor, report
from speedladder.cli.gen import Command
from speedladder.codec import Group
from speedladder.config import settings
from speedladder.config.run import RunConfig
from speedladder.config.settings import Settings
from speedladder.errors import UsageError
from speedladder.ladder.climb import Ladder
from speedladder.profile import step_profile
from speedladder.profile.predict import chain
from speedladder.progress import Progress, show_on_stderr
from speedladder.racing import Race, versus
from speedladder.records import ProfileSummary, Results, TuneSection, from_dict, storage
from speedladder.rungs import BUILT_IN, RUNGS
from speedladder.step.workload import Workload, new_results, prepare
from speedladder.train import trainer
from speedladder.tune import search

# The flag groups of the commands that train: the model and data, and the batch rung. Each command takes the groups
# whose flags can change what it does, and refuses the others (cli.main).
WORKLOAD = (Group.MODEL, Group.BATCH)
# How a climb times its rungs (run, tune; predict, ddp and sweep time with them too).
WINDOWS = (Group.TIMING, Group.WARMUP, Group.MAX_WARMUP)
CLIMB = (*WORKLOAD, Group.LEARNING, Group.RECIPE, *WINDOWS, Group.CLIMB, Group.GATES, Group.MUON, Group.MEMORY, Group.OUTPUT,
         Group.QUIET, Group.WIDE)


def finish(run_dir: Path, wide: bool = False) -> Results:
    """How every command that measures ends: its saved file read back, and its view and files drawn from it alone
    (report.show), so the table, the plot and the page agree. wide: every column of the rung table (--wide)."""
    saved = storage.load(run_dir)
    report.show(saved, run_dir, wide=wide)
    return saved


def start(s: Settings, cfg: RunConfig, refuse: Callable[[Workload], object] | None = None,
          ) -> tuple[Progress, Workload, Path]:
    """Progress, the prepared workload and a new run folder: how every command that measures begins. `refuse`
    checks the workload (raising UsageError) before any folder is made."""
    progress = show_on_stderr(s.quiet)
    work = prepare(cfg)
    if refuse is not None:
        refuse(work)
    if work.cfg.preset_note:
        progress(work.cfg.preset_note)
    return progress, work, storage.new_run_dir(work.cfg.run.out)


def header(work: Workload, run_dir: Path) -> str:
    """The first line of a measuring command: the model, its size, where it runs, the data and the folder."""
    return (f"{work.model.name if work.cfg.model is None else work.cfg.run.preset}: {work.params:,} parameters on "
            f"{work.device}{processor_note(work.device)} ({work.model.convention_line}); {work.data_line}; "
            f"writing {run_dir}")


def processor_note(device: torch.device) -> str:
    """A CPU's vector ISA and whether bf16 is native on it, for the header: what its verdicts rest on."""
    if device.type != "cpu":
        return ""
    p = processor.cpu()
    native = {True: "bf16 native", False: "bf16 not native", None: "bf16 unknown"}[p.bf16_native]
    return f" ({p.capability}, {native}: {p.why})"


def failed_run(saved: Results, model_kind: str) -> int:
    """A run whose baseline could not run failed, whatever came after: one line, and exit 2 when the cause is the
    user's (their model or data: it raised, or it does not fit), 1 when it is ours (our GPT on our data)."""
    failed = saved.failed_baseline
    if failed is None:
        broken = next((r for r in saved.rungs if r.source != BUILT_IN and r.status == "error"), None)
        if broken is not None:  # a rung of the user's that raised: the ladder went on, the command says so
            print(f"speedladder: error: rung {broken.name} ({broken.source}): {broken.detail}", file=sys.stderr)
            return 2
        return 0
    print(f"speedladder: error: {saved.error}", file=sys.stderr)
    return 2 if model_kind in ("user", "hf") or failed.status == "oom" else 1


def cmd_run(s: Settings, _: argparse.Namespace) -> int:
    progress, work, run_dir = start(s, s.run)
    progress(header(work, run_dir))
    ladder = Ladder(work, run_dir, progress, settings=s)
    try:
        ladder.run()
    except KeyboardInterrupt:
        finish(run_dir, s.wide)
        print("interrupted: the rungs measured before the stop are kept", file=sys.stderr)
        return 130
    finish(run_dir, s.wide)
    return failed_run(ladder.results, work.model.kind)


def cmd_profile(s: Settings, _: argparse.Namespace) -> int:
    profile_rungs = s.run.profile.rungs
    unknown = [r for r in profile_rungs if r not in RUNGS]
    if unknown:
        raise UsageError(f"unknown rung {unknown[0]!r} in --compose (choose from {', '.join(RUNGS)})")
    progress, work, run_dir = start(s, s.run)
    run = work.cfg.run
    settings.write(run_dir / settings.CONFIG_FILE, dataclasses.replace(s, run=run), "speedladder profile",
                   ("run", "quiet"))
    progress(f"profiling {run.profile.steps} steps of {run.preset} on {work.device} in a child process", "profile")
    b = step_profile.run_in_child(run, profile_rungs, run_dir / step_profile.TRACE, run.profile.timeout_s)
    summary = from_dict(ProfileSummary, b)
    base = step_profile.spec_of(b)
    # Predictions start from the profiled spec: its own rungs (and the eager baseline under them) are behind it.
    rungs = [r for r in run.rungs or () if r not in profile_rungs and not (profile_rungs and r == "eager")]
    preds = chain(summary, rungs, base, work.env)
    # A rung measured beside the top (the full ladder's ckpt) is predicted on the whole ladder under it.
    preds += [chain(summary, [*rungs, name], base, work.env)[-1] for name in run.beside or ()]
    saved = new_results(work, kind="profile")
    saved.profile, saved.predictions, saved.status = summary, [p.record() for p in preds], "complete"
    storage.save(saved, run_dir, step_profile.FILENAME)
    report.show(saved, run_dir)
    return 0


def cmd_tune(s: Settings, _: argparse.Namespace) -> int:
    t = s.tune
    progress, work, run_dir = start(s, s.run.with_ladder("full"))
    progress(f"tune: the full ladder, then its survivors together, within {t.budget_minutes:g} min; "
             f"writing {run_dir}")
    ladder = Ladder(work, run_dir, progress, settings=s, sections=("run", "tune", "quiet"))
    budget = search.Budget(t.budget_minutes * 60, ladder.results, reserve=1)
    ladder.budget = budget.reason
    say = progress.scoped("tune")

    def combine() -> None:
        res = ladder.results
        res.tune = section = TuneSection(budget_minutes=t.budget_minutes, survivors=list(search.survivors(res)),
                                         dropped=search.dropped(res))
        say(f"survivors: {', '.join(section.survivors or []) or 'none'}; dropped: "
            + ("; ".join(f"{k} ({v})" for k, v in section.dropped.items()) or "none"))
        section.candidates = search.measure_candidates(ladder, budget, t.max_candidates, say)
        section.finalists = search.measure_finalists(ladder, budget, t.finalists, say)
        ladder.finalists = section.finalists or None  # none passed again: the learns-check tries them all
        ladder.save()

    interrupted = False
    try:
        ladder.run(after_climb=combine)
    except KeyboardInterrupt:
        interrupted = True
    section = ladder.results.tune = ladder.results.tune or TuneSection(budget_minutes=t.budget_minutes)
    search.summarize(section, ladder.results, run_dir)
    search.tokens_judge(section, ladder.results)
    section.judge, section.judged_by = "tokens", "tokens/s in timed windows (--judge tokens)"
    if t.judge == "time" and not interrupted and section.winner:
        try:
            race_finalists(s, ladder, section, budget, run_dir, progress)
        except KeyboardInterrupt:
            interrupted = True
    section.seconds = budget.seconds - budget.left()
    ladder.save()
    if section.winner:
        settings.write(run_dir / settings.WINNER_FILE,
                       search.winner_settings(s, work.cfg.run, tuple(section.winner_rungs), section.winner_batch_lr_scale),
                       winner_header(section, run_dir), ("run", "train", "tune"))
    saved = finish(run_dir, s.wide)
    if interrupted:
        print("interrupted: what was measured before the stop is kept", file=sys.stderr)
        return 130
    return failed_run(saved, work.model.kind)


def race_finalists(s: Settings, ladder: Ladder, section: TuneSection, budget: search.Budget, run_dir: Path,
                   progress: Progress) -> None:
    """tune's finalists raced beside eager to a target val loss over seeds, within what is left of the budget; the
    winner then named by the time to the target (tune.judge_by_time). When the race does not fit, the tokens/s
    judge's winner stands, and the section says why."""
    work, res, say = ladder.work, ladder.results, progress.scoped("tune")
    configs = search.race_configs(res, s.tune.race_finalists, work.env, work.base_spec)
    if not configs:
        section.judged_by = "tokens/s: no configuration passed every gate, so there was nothing to race"
        return

    raced = work.raced(s.race)  # a schedule's length is the race's budget (the ladder and its checks are done)

    def need() -> float | None:
        return search.race_seconds(configs, res, raced.calibrate_steps, raced.seeds, raced.cap_factor)

    while len(configs) > 1 and (need() or 0.0) > budget.left():
        configs.pop()
    est = need()
    if est is None or est > budget.left():
        section.judged_by = (f"tokens/s: the race would take about {est or 0:.0f} s and the tune budget has "
                             f"{max(budget.left(), 0):.0f} s left (--budget-minutes)")
        say(f"not racing the finalists: {section.judged_by}")
        return
    say(f"racing {len(configs)} finalist(s) beside eager to a target val loss over {s.race.seeds} seeds (about "
        f"{est:.0f} s): {', '.join(c.name for c in configs)}")
    race = Race(work, run_dir, raced, progress, role="finalist", results_=res)
    section.race = race.section
    race.prepare_configs([(c.name, c.rungs, c.spec) for c in configs], "finalist")
    race.run()
    tokens = section.tokens_judge.winner if section.tokens_judge else None

    def against_tokens(chosen: str) -> float | None:
        a, b = race.section.entry(chosen), race.section.entry(tokens or "")
        return versus(a, b, race.section.alpha).p_less if a is not None and b is not None and a is not b else None

    search.judge_by_time(section, race.section, configs, res, against_tokens)
    section.commands = search.commands(run_dir)


def winner_header(section: TuneSection, run_dir: Path) -> str:
    """winner.toml's comment lines: both judges' answers, and which one chose."""
    lines = [f"tune's winner ({section.winner}) from {run_dir}, chosen by {section.judged_by}"]
    for j in (section.time_judge, section.tokens_judge):
        if j is None:
            continue
        figures = [f"{j.tokens_per_s_x:.2f}x eager's tokens/s" if j.tokens_per_s_x else "",
                   f"{j.time_x:.2f}x faster than eager to the target" if j.time_x else "",
                   f"p={j.p_vs_eager:.2g} against eager" if j.p_vs_eager is not None else "",
                   f"p={j.p_vs_other:.2g} against the tokens/s winner" if j.p_vs_other is not None else ""]
        lines.append(f"the {j.judge} judge: {j.winner} (eager + {' + '.join(j.rungs) or 'nothing'}"
                     + "".join(f"; {f}" for f in figures if f) + ")" + (f": {j.detail}" if j.detail else ""))
    return "\n".join(lines)


def cmd_train(s: Settings, _: argparse.Namespace) -> int:
    return trainer.main(s)


def cmd_report(s: Settings, ns: argparse.Namespace) -> int:
    given = Path(ns.run_dir)
    if given.is_dir() and not (given / storage.FILENAME).exists() and (given / step_profile.FILENAME).exists():
        given = given / step_profile.FILENAME  # a `speedladder profile` folder
    run_dir, source = (given, None) if given.is_dir() else (given.parent, given)
    report.show(storage.load(given), run_dir, source=source, wide=s.wide)  # the view the file's kind has
    return 0


def _report_inputs(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR",
                   help="a run, tune, race, predict, ddp or profile folder (or its results.json / profile.json)")


COMMANDS = (
    Command("run", "climb the ladder and write runs/<timestamp>/",
            "Climb the ladder: time every rung in windows beside the rung it built on, check it still computes the "
            "same function and still learns, print the table, write results.json, config.toml, waterfall.png and "
            "report.html.", (*CLIMB, Group.RUNG_FILES, Group.RUNGS, Group.STACK, Group.EXPLAIN, Group.PROFILE),
            cmd_run),
    Command("profile", "profile the baseline, name its regime, predict every rung",
            "Profile a few steps of the baseline in a child process: the top operators, one step broken into "
            "categories that add to 100%, the regime (compute-, memory- or overhead-bound) with its evidence, and a "
            "predicted speed-up with its reason for every rung of the ladder. Writes profile.json and a "
            "Chrome/Perfetto trace.json to DIR/<timestamp>/.",
            (*WORKLOAD, Group.RUNG_FILES, Group.RECIPE, Group.RUNGS, Group.WARMUP, Group.PROFILE, Group.PROFILE_CMD,
             Group.OUTPUT, Group.QUIET), cmd_profile),
    Command("tune", "find the fastest configuration that passes every gate, within a budget",
            "Climb the full ladder, drop each rung whose verdict is loss or noise (or that failed a gate or could not "
            "run), measure the survivors together (and, budget permitting, each left out in turn) with the same "
            "windows and gates, and name the fastest that passes every gate and the learns-check. Writes "
            "DIR/<timestamp>/results.json and winner.toml (`run --config` measures it, `train --config` trains it, "
            "speedladder.apply puts it in your own loop).",
            (*CLIMB, Group.VAL_SET, Group.TUNE, Group.RACE_RULE, Group.RACE_TARGET), cmd_tune),
    Command("train", "train one configuration, log its loss and val loss, sample text, save a checkpoint",
            "Train a configuration for --steps steps, logging loss, step time and tokens/s every --log-every steps "
            "and the val loss every --eval-every, then print a sample of generated text. DIR/<timestamp>/checkpoint.pt "
            "is saved every --save-every steps and after the last, best.pt beside it (load them with "
            "torch.load(path, weights_only=True)); --resume RUN_DIR continues a run from its checkpoint.",
            (*WORKLOAD, Group.RUNG_FILES, Group.LEARNING, Group.RECIPE, Group.VAL_SET, Group.MUON, Group.TRAIN,
             Group.OUTPUT, Group.QUIET), cmd_train),
    Command("report", "print the table and redraw waterfall.png from a run folder",
            "Read RUN_DIR/results.json, print its table and redraw its waterfall.png (scaling.png for predict/ddp); "
            "for a profile folder, print the profile.", (Group.WIDE,), cmd_report, _report_inputs),
)
