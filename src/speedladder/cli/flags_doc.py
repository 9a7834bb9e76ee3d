"""Every command's flags as Markdown, generated from the config dataclasses (docs/examples/flags.md).

    python -m speedladder.cli.flags_doc > docs/examples/flags.md   (docs/examples/make.sh does it)

Each flag's config-file key is its field's path in settings.Settings: `--window-steps` is `[run.timing] steps`.
"""

from __future__ import annotations

import argparse

from speedladder.cli import ALL, build_parser
from speedladder.cli.gen import DEST


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("%%", "%")


def _row(action: argparse.Action) -> str:
    value = ""  # what each spelling takes: `--compose A,B,C` / `--profile-rungs A,B,C`
    if action.metavar and action.nargs != 0:
        value = f" {action.metavar}"
    elif action.choices and action.nargs != 0:
        value = " {" + ",".join(map(str, action.choices)) + "}"
    flag = " / ".join(f"`{o}{value}`" for o in action.option_strings)
    flag = flag.replace("|", "\\|")
    text = action.help or ""
    meaning, _, default = text.partition(". Default: ")
    key = action.dest[len(DEST):]
    table, _, name = key.rpartition(".")
    where = f"`[{table}] {name}`" if table else f"`{name}`"
    return f"| {flag} | {_cell(meaning)} | {_cell(default) if default else 'off'} | {where} |"


def markdown() -> str:
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert isinstance(sub.choices, dict)  # the subcommands' parsers, by name
    out = ["# Every flag", "",
           ("Generated from the configuration dataclasses (`src/speedladder/config/run.py` for the run, "
           "`src/speedladder/config/settings.py` for each command's own, `src/speedladder/config/parallel.py` for data "
           "parallelism) by `bash docs/examples/make.sh`; `speedladder COMMAND --help` prints the same. The last "
           "column is the key a config file (`--config FILE.toml`) sets it with ([usage.md](../usage.md#config-files))."),
           ""]
    for command in ALL:
        p = sub.choices[command.name]
        out += [f"## `speedladder {command.name}`", "", command.description, ""]
        inputs = [a for a in p._actions if not a.option_strings]
        if inputs:
            out += ["Arguments: " + ", ".join(f"`{a.metavar}` ({a.help})" for a in inputs) + ".", ""]
        rows = [_row(a) for a in p._actions if a.dest.startswith(DEST)]
        if rows:
            out += ["| flag | meaning | default | config key |", "| --- | --- | --- | --- |", *rows, ""]
        out += ["Also `--config FILE.toml`: the configuration from a file, which the flags given override.", ""]
    return "\n".join(out).rstrip() + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
