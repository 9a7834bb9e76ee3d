"""The command line: parse (generated from the config dataclasses, cli/gen.py), build, run, always leave a readable
result behind."""

from __future__ import annotations

import sys

from speedladder.cli import cmd_check, cmd_compare, cmd_gates, cmd_judge, cmd_parallel, cmd_race, cmd_run, cmd_sweep
from speedladder.cli.gen import Command, Parser, add_command, refusal, to_settings
from speedladder.errors import UsageError
from speedladder.meta import __version__
from speedladder.parallel.launch import JobFailed
from speedladder.rungs.files import load as load_rungs

ALL: tuple[Command, ...] = (*cmd_run.COMMANDS[:3], *cmd_race.COMMANDS, *cmd_run.COMMANDS[3:], *cmd_parallel.COMMANDS,
                            *cmd_compare.COMMANDS, *cmd_check.COMMANDS, *cmd_gates.COMMANDS, *cmd_sweep.COMMANDS, *cmd_judge.COMMANDS)


def build_parser() -> Parser:
    parser = Parser(prog="speedladder",
                    description="Measure transformer training honestly, then climb a ladder of speed "
                                "techniques one measured, verified rung at a time.")
    parser.add_argument("--version", action="version", version=f"speedladder {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in ALL:
        add_command(sub, command)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    ns, extra = parser.parse_known_args(argv)
    if extra:  # a flag this command does not take: one line that names it, the command, and whose it is
        print(f"speedladder {ns._command.name}: error: {refusal(parser, ns._command.name, extra)}", file=sys.stderr)
        return 2
    try:
        s = to_settings(ns)
        if ns._command.loads_rungs:
            load_rungs(s.run.rung_files, s.run.rung_hashes)  # a user's rungs, before any name is checked
        return ns._command.run(s, ns)
    except UsageError as e:
        print(f"speedladder: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("speedladder: interrupted", file=sys.stderr)
        return 130
    except JobFailed as e:  # a torchrun job that failed: its first failing rank's line
        print(f"speedladder: error: {e}", file=sys.stderr)
        return 1
