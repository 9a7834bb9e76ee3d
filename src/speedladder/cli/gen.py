"""The command line, generated from the config dataclasses (settings.Settings).

Each config field is one flag: its spelling, type, choices, help and default all come from the field
(codec.option). A command takes the flag groups it names. Only the flags given on the command line are kept,
and they override `--config FILE.toml`, which overrides the dataclass defaults; `--run RUN_DIR` (train, race)
puts that run's saved configuration under both, and `train --resume RUN_DIR` that folder's config.toml. What
comes out is one Settings, checked as it is made.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from speedladder import codec
from speedladder.codec import Group, int_list, rung_list
from speedladder.config import settings
from speedladder.config.settings import Settings
from speedladder.records import storage

DEST = "@"  # the namespace keys of config fields start with this: "@run.timing.steps"
RUN_SOURCES = ("train", "race")  # commands whose --run RUN_DIR brings that run's workload


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit status 2, and a flag is spelt in full: an abbreviation
    could name one flag in one command and another elsewhere (--eval-every, --eval-every-base-steps)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


@dataclass(frozen=True)
class Command:
    name: str
    help: str  # one line, in `speedladder --help`
    description: str  # the paragraph of `speedladder NAME --help`
    groups: tuple[Group, ...]  # the flag groups (a field's option(group=...)) this command takes
    run: Callable[[Settings, argparse.Namespace], int]
    inputs: Callable[[argparse.ArgumentParser], None] | None = None  # arguments that are not configuration
    # Whether the rung files a config file names are imported in this process before the command runs: judge's
    # are imported by its workers alone.
    loads_rungs: bool = True


def leaves(cls: type = Settings, path: str = "") -> Iterator[tuple[str, dataclasses.Field, Any]]:
    """Every field a flag can set: (its dotted path, the field, its type), nested configs walked."""
    types = codec.hints(cls)
    for f in dataclasses.fields(cls):
        tp = types[f.name]
        here = f"{path}.{f.name}" if path else f.name
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            yield from leaves(tp, here)
        elif f.metadata.get("cli", True):
            yield here, f, tp


def shown_default(f: dataclasses.Field) -> str:
    """The default as --help says it: the field's own words where it has them, else its value."""
    if f.metadata.get("shown"):
        return f.metadata["shown"]
    value = codec.default_of(f)
    if isinstance(value, (tuple, list)):
        return ",".join(map(str, value)) or "none"
    return "none" if value is None else str(value)


def _text_type(tp: Any) -> Callable[[str], Any] | None:
    """How a flag's text becomes the field's type, for the types the generator knows."""
    base, _ = codec._optional(tp)
    if typing.get_origin(base) is tuple:
        (item, *_rest) = typing.get_args(base) or (str,)
        return int_list if item is int else rung_list
    return {int: int, float: float, str: None}.get(base)


def add_flag(p: argparse.ArgumentParser, path: str, f: dataclasses.Field, tp: Any) -> None:
    m = f.metadata
    flag = m.get("flag") or "--" + f.name.replace("_", "-")
    kw: dict[str, Any] = {"dest": DEST + path, "default": argparse.SUPPRESS}
    base, _ = codec._optional(tp)
    if base is bool:
        if m.get("negate"):
            kw.update(action="store_const", const=False, help=m["help"])
        elif codec.default_of(f) is False:
            kw.update(action="store_const", const=True, help=m["help"])
        else:
            kw.update(action=argparse.BooleanOptionalAction, help=f"{m['help']}. Default: on")
        kw["help"] = kw["help"].replace("%", "%%")  # argparse %-formats help; no default is spliced in that way
        p.add_argument(flag, *m.get("also", ()), **kw)
        return
    choices = m.get("choices")
    kw["help"] = f"{m['help']}. Default: {shown_default(f)}".replace("%", "%%")
    if m.get("append"):  # one item per use of the flag: the item's own text, no comma list
        kw["action"] = "append"
    convert = m.get("parse") or (None if m.get("append") else _text_type(tp))
    if convert is not None:
        kw["type"] = convert
    if choices:
        kw["choices"] = list(choices() if callable(choices) else choices)
    if m.get("metavar") or not choices:
        kw["metavar"] = m.get("metavar") or f.name.upper()
    p.add_argument(flag, *m.get("also", ()), **kw)


def add_command(sub: Any, command: Command) -> argparse.ArgumentParser:
    p = sub.add_parser(command.name, help=command.help, description=command.description)
    if command.inputs is not None:
        command.inputs(p)
    for path, f, tp in leaves():
        if f.metadata.get("group") in command.groups:
            add_flag(p, path, f, tp)
    p.add_argument("--config", metavar="FILE.toml",
                   help="read the configuration from a TOML file (a run's config.toml, tune's winner.toml, or your "
                        "own); flags given here override it. Default: none")
    p.set_defaults(_command=command)
    return p


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """Each command's own parser, by name."""
    sub = next(a for a in parser._actions if a.dest == "command")
    assert isinstance(sub.choices, dict)
    return sub.choices


def refusal(parser: argparse.ArgumentParser, command: str, extra: list[str]) -> str:
    """The one line for what `command` does not take: a flag of other commands is named with them (and with this
    command's own spelling where the flag was once its own: `run --steps`), anything else in argparse's words."""
    flag = next((a.split("=", 1)[0] for a in extra if a.startswith("--")), None)
    parsers = subcommands(parser)
    owners = [name for name, p in parsers.items() if flag in p._option_string_actions]
    if flag is None or not owners:
        return f"unrecognized arguments: {' '.join(extra)}"
    fields = {DEST + path: f for path, f, _ in leaves()}
    own = next((a.option_strings[0] for a in parsers[command]._actions
                if a.dest in fields and fields[a.dest].metadata.get("was") == flag), None)
    whose = f"it is {owners[0]}'s" if len(owners) == 1 else f"a flag of {', '.join(owners)}"
    return f"{flag} does not apply to {command} ({whose})" + (f"; {command}'s is {own}" if own else "")


def given(ns: argparse.Namespace) -> dict[str, Any]:
    """The config values given as flags, nested by their paths."""
    return codec.nest({k[len(DEST):]: v for k, v in vars(ns).items() if k.startswith(DEST)})


def _saved_run(folder: str) -> dict[str, Any]:
    """A run folder's resolved workload, as the base of a train or race of its winner: its device, output and
    rungs left to this command."""
    saved = storage.load(folder)
    run = saved.config.run
    if saved.tune is not None and saved.tune.winner_batch_lr_scale:  # the rule the race chose the winner under
        run = dataclasses.replace(run, batch_lr_scale=saved.tune.winner_batch_lr_scale)
    data = codec.to_data(run)
    for key in ("device", "out", "rungs", "ladder", "beside"):
        data.pop(key, None)
    return data


def to_settings(ns: argparse.Namespace) -> Settings:
    """The defaults, under `--run RUN_DIR`'s saved workload, under the config.toml of the folder `train --resume`
    continues, under `--config FILE`, under the flags given."""
    data = settings.read(ns.config) if getattr(ns, "config", None) else {}
    data = codec.merge(data, given(ns))
    command = ns._command.name
    resume = (data.get("train") or {}).get("resume") if command == "train" else None
    if resume and (Path(resume) / settings.CONFIG_FILE).is_file():
        # The configuration of the run it continues; how this command prints (quiet) is its own.
        saved = settings.read(Path(resume) / settings.CONFIG_FILE)
        data = codec.merge({k: v for k, v in saved.items() if k != "quiet"}, data)
    source = (data.get(command) or {}).get("run") if command in RUN_SOURCES else None
    if source:
        data = codec.merge({"run": _saved_run(source)}, data)
    return codec.from_data(Settings, data)
