"""The command line: parse, build, run, always leave a readable result behind.

Every default shown by --help is read from the config dataclasses (cli/flags.py).
"""

from __future__ import annotations

import sys

from speedladder import __version__
from speedladder.cli import check, commands, compare, parallel, race, sweep
from speedladder.cli.flags import Parser
from speedladder.errors import UsageError
from speedladder.parallel.launch import JobFailed

COMMANDS = {"run": commands.cmd_run, "profile": commands.cmd_profile, "tune": commands.cmd_tune,
            "train": commands.cmd_train, "report": commands.cmd_report, "predict": parallel.cmd_predict,
            "ddp": parallel.cmd_ddp, "compare": compare.cmd_compare, "check": check.cmd_check,
            "sweep": sweep.cmd_sweep, "race": race.cmd_race}


def build_parser() -> Parser:
    parser = Parser(prog="speedladder",
                    description="Measure transformer training honestly, then climb a ladder of speed "
                                "techniques one measured, verified rung at a time.")
    parser.add_argument("--version", action="version", version=f"speedladder {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add in (commands.add_run, commands.add_profile, commands.add_tune, commands.add_train, commands.add_report,
                race.add_commands, parallel.add_commands, compare.add_commands, check.add_commands,
                sweep.add_commands):
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except UsageError as e:
        print(f"speedladder: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("speedladder: interrupted", file=sys.stderr)
        return 130
    except JobFailed as e:  # a torchrun job that failed: its first failing rank's line
        print(f"speedladder: error: {e}", file=sys.stderr)
        return 1
