"""`speedladder race`: each configuration trained to a target val loss over seeds, judged by the time (racing/)."""

from __future__ import annotations

import argparse
import dataclasses
import sys

from speedladder.cli.cmd_run import finish, header, start
from speedladder.cli.gen import Command
from speedladder.codec import Group
from speedladder.config.run import LADDERS, RACE_LADDER, RunConfig
from speedladder.config.settings import RaceConfig, Settings
from speedladder.errors import UsageError
from speedladder.racing import Race, target
from speedladder.records import storage
from speedladder.records.race_section import RaceRole
from speedladder.rungs import BUILT_IN, RUNGS
from speedladder.step.workload import Workload


def plan(s: Settings) -> tuple[RunConfig, RaceConfig, RaceRole]:
    """The run configuration (its rungs those the race names) and the race's own, resolved: a ladder in `rungs`,
    or the configurations in `combos` (a run's winner among them), and the configurations' role."""
    race = s.race
    role: RaceRole
    if race.run:
        won = storage.load(race.run).winner()  # its saved workload is under the flags already (cli/gen.py)
        if won is None:
            raise UsageError(f"{race.run} names no configuration that passed every gate")
        if not won[1]:  # its fastest is eager: raced beside eager, it would race eager against itself
            raise UsageError(f"{race.run}'s fastest configuration is eager: nothing there paid, so there is nothing "
                             "to race against eager (speedladder race races the default ladder)")
        race, role = dataclasses.replace(race, run=None, combos=(won[1],)), "winner"
    elif race.combos:
        unknown = [n for c in race.combos for n in c if n not in RUNGS]
        if unknown:
            raise UsageError(f"unknown rung {unknown[0]!r} in --combos (choose from {', '.join(RUNGS)})")
        role = "combo"
    else:
        if race.ladder is not None and race.ladder not in LADDERS:
            raise UsageError(f"unknown ladder {race.ladder!r} (choose from {', '.join(LADDERS)})")
        if race.ladder is not None and race.rungs is not None:
            raise UsageError("give --ladder or --rungs, not both")
        ladder = LADDERS[race.ladder].rungs if race.ladder else RACE_LADDER
        race, role = dataclasses.replace(race, rungs=tuple(race.rungs or ladder), ladder=None), "rung"
    names = race.rungs or ("eager", *dict.fromkeys(n for c in race.combos for n in c if n != "eager"))
    return s.run.with_rungs(tuple(names)), race, role


def cmd_race(s: Settings, _: argparse.Namespace) -> int:
    cfg, race_cfg, role = plan(s)
    race_cfg, note, same_ruler = target.fixed(race_cfg)

    def refuse(work: Workload) -> None:  # refused before any folder is made
        nonlocal race_cfg
        work.val_set(work.cfg.seq_len)  # a val split too small for one batch
        same_ruler(work)
        race_cfg = work.raced(race_cfg)

    progress, work, run_dir = start(s, cfg, refuse=refuse)
    progress(header(work, run_dir))
    race = Race(work, run_dir, race_cfg, progress, role=role, settings=dataclasses.replace(s, race=race_cfg),
                target_note=note)
    try:
        if role == "rung":
            race.prepare_ladder(work.cfg.run.rungs or ())
        else:
            race.prepare_combos(race_cfg.combos, role)
        race.run()
    except KeyboardInterrupt:
        finish(run_dir)
        print("interrupted: the runs finished before the stop are kept", file=sys.stderr)
        return 130
    finish(run_dir)
    broken = next((e for e in race.section.entries if e.status == "error" and e.rungs
                   and e.rungs[-1] in RUNGS and RUNGS[e.rungs[-1]].source != BUILT_IN), None)
    if broken is not None:  # a rung of the user's that raised: the race went on, the command says so
        print(f"speedladder: error: rung {broken.name} ({RUNGS[broken.rungs[-1]].source}): {broken.detail}",
              file=sys.stderr)
        return 2
    first = race.section.entries[0] if race.section.entries else None
    if first is not None and first.status in ("error", "oom", "failed"):  # every verdict is against it
        print(f"speedladder: error: the baseline {first.name} did not race: {first.status}: {first.detail}",
              file=sys.stderr)
        return 2 if work.model.kind in ("user", "hf") or first.status != "error" else 1
    return 0


COMMANDS = (
    Command("race", "train each configuration to a target val loss over seeds; judge it by the time, with a p-value",
            "Train every configuration (a cumulative ladder of rungs, given combinations, or a run's winner) from the "
            "same initial weights and batch order, seed by seed, until its val loss on held-out data reaches the "
            "target; the clock runs over training steps only. A ladder races in stages, each rung beside the best "
            "configuration so far, in an order that alternates from seed to seed; a rung that loses is not built "
            "upon. Judge each against its base by a t-test paired by seed on log times, one-sided each way, a run "
            "that did not reach counted as at least its clock (win or loss at p < 0.01, else noise). Writes "
            "DIR/<timestamp>/results.json, config.toml, waterfall.png (tokens/s beside × faster to the target) and "
            "report.html.",
            (Group.MODEL, Group.RUNG_FILES, Group.LEARNING, Group.RECIPE, Group.VAL_SET, Group.BATCH, Group.WARMUP,
             Group.MAX_WARMUP, Group.MUON, Group.RACE, Group.RACE_RULE, Group.RACE_TARGET, Group.OUTPUT, Group.QUIET), cmd_race),
)
