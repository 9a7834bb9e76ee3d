"""`speedladder judge CANDIDATE`: keep, revert or undecided, as one JSON object on stdout (judge/)."""

from __future__ import annotations

import argparse

from speedladder.cli.gen import Command
from speedladder.codec import Group
from speedladder.config.settings import Settings
from speedladder.judge import report
from speedladder.judge.referee import Referee
from speedladder.progress import show_on_stderr


def cmd_judge(s: Settings, ns: argparse.Namespace) -> int:
    judgement = Referee(s, ns.candidate, show_on_stderr(s.quiet)).decide()
    print(report.to_json(judgement), flush=True)
    return report.EXIT[judgement.decision]


def _inputs(p: argparse.ArgumentParser) -> None:
    p.add_argument("candidate", metavar="CANDIDATE",
                   help="a rung file (.py: its rungs composed on the base), a config.toml or winner.toml, or a run "
                        "folder (its winner)")


COMMANDS = (
    Command("judge", "keep or revert one candidate: gated, raced against its base over seeds, one JSON object out",
            "Gate the candidate in a worker process of its own (its code never runs in this one), then race it against "
            "the base to a target val loss, seed by seed, the two runs of a seed taking turns, the clock, the data "
            "and the evaluation all here. After each seed from the third a sequential rule reads the paired test on "
            "log times: keep when faster by more than --keep-floor at p < --false-keep over the looks, revert when "
            "slower or short of --min-gain, else another seed; undecided when the seeds or --budget-s end first. Prints one JSON object "
            "on stdout (the schema ships as speedladder/judge/schema.json; docs/judge.md), progress on stderr. Exit "
            "status: 0 keep, 1 revert, 3 undecided, 2 bad input (nothing judged).",
            (Group.MODEL, Group.LEARNING, Group.RECIPE, Group.VAL_SET, Group.BATCH, Group.WARMUP, Group.MAX_WARMUP,
             Group.MUON, Group.GATES, Group.RACE_TARGET, Group.JUDGE, Group.OUTPUT, Group.QUIET), cmd_judge,
            inputs=_inputs, loads_rungs=False),
)
