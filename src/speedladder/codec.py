"""The one codec: dataclasses (configs and results records) to and from plain data, then TOML or JSON.

A config field is declared once, with `option(...)`: its type (the annotation), its default, its help and how
its flag is spelled. The command line (cli/gen.py), config files (`--config FILE.toml`, the `config.toml` every
run writes), results.json (records/) and the Python API all go through `to_data` / `from_data` here, under one
rule set:
- a value must be of its annotated type (a whole number for int, a list for a tuple or list, a table for a
  nested dataclass, a known value for an Enum); a wrong one is a usage error that names where it was;
- an unknown key is named as an error (`unknown="error"`: a file or flag of the user's) or skipped
  (`unknown="skip"`: a saved file written by another version); a dataclass with an `extra` field (a results
  record) keeps what it does not declare there, and `to_data` writes it back, so nothing read is lost;
- a missing key takes the field's default, and the dataclass's own checks run as it is made;
- an empty table for a field that may hold None and is otherwise a dataclass reads as None, not as a dataclass
  of defaults (results.json once saved a failed rung's spec as {});
- JSON has no NaN or infinity (`json=True`: a non-finite number is written as null); TOML has both;
- a dataclass whose plain form is not its fields (the resolved config, flat in results.json) says so with a
  `to_plain` method and a `from_plain` classmethod, which the codec calls.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import sys
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from enum import Enum
from pathlib import Path
from typing import Any, Literal, TypeVar

from speedladder.errors import UsageError

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, as the tomli backport (a dependency there)
    import tomli as tomllib

T = TypeVar("T")
MISSING = dataclasses.MISSING
EXTRA = "extra"  # a record's field for the keys it does not declare: kept, and written back
Unknown = Literal["error", "skip"]


class Group(str, Enum):
    """The flag groups: a field's option(group=...), and what each command takes (cli/*.py's Command.groups).
    An Enum rather than strings, so a misspelt group is an error where it is written, not a flag dropped."""

    MODEL = "model"
    RUNG_FILES = "rung-files"
    LEARNING = "learning"
    RECIPE = "recipe"
    VAL_SET = "val-set"
    BATCH = "batch"
    RUNGS = "rungs"
    STACK = "stack"
    TIMING = "timing"
    WARMUP = "warmup"
    MAX_WARMUP = "max-warmup"
    CLIMB = "climb"
    GATES = "gates"
    MUON = "muon"
    MEMORY = "memory"
    EXPLAIN = "explain"
    PROFILE = "profile"
    PROFILE_CMD = "profile-cmd"
    OUTPUT = "output"
    QUIET = "quiet"
    WIDE = "wide"
    TUNE = "tune"
    RACE = "race"
    RACE_RULE = "race-rule"
    RACE_TARGET = "race-target"
    JUDGE = "judge"
    TRAIN = "train"
    SWEEP = "sweep"
    CHECK = "check"
    COMPARE = "compare"
    PARALLEL = "parallel"
    PREDICT = "predict"
    DDP = "ddp"
    TORCHRUN = "torchrun"


def option(default: Any = MISSING, *, factory: Callable[[], Any] | Any = MISSING, help: str, flag: str | None = None,
           metavar: str | None = None, choices: Callable[[], tuple[str, ...]] | tuple[str, ...] | None = None,
           parse: Callable[[str], Any] | None = None, shown: str | None = None, group: Group | None = None,
           append: bool = False, negate: bool = False, cli: bool = True, also: tuple[str, ...] = (),
           was: str | None = None) -> Any:
    """A config field: its default (or factory) and what the command line needs to offer it.

    help: one sentence, without its default (the generator adds "Default: ..."); shown: the default as said when
    it is not a plain value ("the preset's"); flag: the spelling when it is not --the-field-name; group: the flag
    group commands choose by; parse: text -> value for a flag of a type the generator does not know; append: a
    repeatable flag; negate: a bool field set off by its flag (--no-profile); cli: False for a field no flag sets.
    A spelling means one thing in every command that takes it. also: an earlier spelling kept, because no other
    flag has it; was: an earlier spelling that another command's flag now owns, named when it is given here
    (`run --steps`: "a timed window's steps are --window-steps").
    """
    if group is not None and not isinstance(group, Group):
        raise TypeError(f"a flag's group is a Group, not {group!r}: {help}")
    meta = {"help": help, "flag": flag, "metavar": metavar, "choices": choices, "parse": parse, "shown": shown,
            "group": group, "append": append, "negate": negate, "cli": cli, "also": also, "was": was}
    if factory is not MISSING:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


# -- checks and flag parsers every config shares ------------------------------------------------

def positive(name: str, value: float | None) -> None:
    """A value that must be a positive finite number (None: not given, nothing to check)."""
    if value is not None and not (math.isfinite(value) and value > 0):  # NaN compares false: said, not run
        raise UsageError(f"{name} must be positive, got {value}")


def at_least(name: str, value: float | None, least: float) -> None:
    if value is not None and not (math.isfinite(value) and value >= least):
        raise UsageError(f"{name} must be {'zero or more' if least == 0 else f'at least {least:g}'}, got {value}")


def rung_list(text: str) -> tuple[str, ...]:
    return tuple(r.strip() for r in text.split(",") if r.strip())


def rungs_option(default: Any, *, help: str, group: Group, shown: str | None = None, flag: str | None = None,
                 metavar: str = "A,B,C", also: tuple[str, ...] = (), was: str | None = None) -> Any:
    """A field that names rungs, comma-separated, as every command spells one: declared here once. Each spelling
    has one meaning: --rungs a ladder (each rung built on the best configuration so far: run, profile's
    predictions, race), --compose one configuration (the rungs applied in order, no gate between: train, profile,
    predict, ddp), --beside rungs measured on a ladder's top, --sweep-rungs each rung on eager alone."""
    return option(default, help=help, shown=shown, flag=flag, metavar=metavar, parse=rung_list, group=group,
                  also=also, was=was)


def peak_list(text: str) -> dict[str, float]:
    """'bf16=989,fp32=67' -> {"bf16": 989.0, "fp32": 67.0}: one peak per precision, never one for all."""
    out = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        name, sep, value = part.partition("=")
        if not sep:
            raise argparse.ArgumentTypeError(
                f"give the peak per precision, e.g. bf16=989,fp32=67, not {part!r} (one number for every "
                "precision would overstate the MFU of the others)")
        try:
            out[name.strip()] = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number of TFLOP/s: {value!r}") from None
    return out



def int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"positive integers wanted, got {text!r}")
    return values


@functools.cache
def hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def default_of(f: dataclasses.Field[Any]) -> Any:
    return f.default_factory() if f.default_factory is not MISSING else f.default


def _args(tp: Any) -> tuple[Any, ...]:
    return typing.get_args(tp)


def _optional(tp: Any) -> tuple[Any, bool]:
    """(the type without None, whether None is allowed)."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        rest = [a for a in _args(tp) if a is not type(None)]
        return (rest[0] if len(rest) == 1 else Any), len(rest) < len(_args(tp))
    return tp, False


def to_data(obj: Any, *, json: bool = False) -> Any:
    """A dataclass (or anything holding them) as plain data: dicts, lists, numbers, strings, None.
    json: a non-finite float becomes None (JSON has no NaN or infinity)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        if hasattr(obj, "to_plain"):
            return to_data(obj.to_plain(), json=json)
        out = {f.name: to_data(getattr(obj, f.name), json=json) for f in dataclasses.fields(obj) if f.name != EXTRA}
        out.update(to_data(getattr(obj, EXTRA, None) or {}, json=json))
        return out
    if isinstance(obj, Mapping):
        return {str(k): to_data(v, json=json) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_data(v, json=json) for v in obj]
    if isinstance(obj, Enum):
        return obj.value
    if json and isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def _value(tp: Any, value: Any, where: str, unknown: Unknown) -> Any:
    """One value as its annotated type, or a usage error that names where it was."""
    base, nullable = _optional(tp)
    if value is None:
        if nullable or base is Any:
            return None
        raise UsageError(f"{where}: a value is required")
    origin = typing.get_origin(base)
    if dataclasses.is_dataclass(base) and isinstance(base, type):
        if not isinstance(value, Mapping):
            raise UsageError(f"{where}: expected a table of {base.__name__} fields, got {value!r}")
        if nullable and not value:  # an empty table where None may stand is None (a saved file's "spec": {})
            return None
        return from_data(base, value, where, unknown)
    if isinstance(base, type) and issubclass(base, Enum):
        try:
            return base(value)
        except ValueError:
            known = ", ".join(str(m.value) for m in base)
            raise UsageError(f"{where}: unknown value {value!r} (known: {known})") from None
    if origin in (tuple, list, Sequence):  # a Sequence (a record's read-only list) is read as a list
        if not isinstance(value, (list, tuple)):
            raise UsageError(f"{where}: expected a list, got {value!r}")
        items = _args(base)
        item = items[0] if items else Any
        out = [_value(item, v, f"{where}[{i}]", unknown) for i, v in enumerate(value)]
        return tuple(out) if origin is tuple else out
    if origin is dict:
        _, val_t = _args(base) or (str, Any)
        if not isinstance(value, Mapping):
            raise UsageError(f"{where}: expected a table, got {value!r}")
        return {str(k): _value(val_t, v, f"{where}.{k}", unknown) for k, v in value.items()}
    if base is bool:
        if not isinstance(value, bool):
            raise UsageError(f"{where}: expected true or false, got {value!r}")
        return value
    if base is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise UsageError(f"{where}: expected a whole number, got {value!r}")
        return value
    if base is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise UsageError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if base is str:
        if not isinstance(value, str):
            raise UsageError(f"{where}: expected a string, got {value!r}")
        return value
    return value  # Any, or a union of several kinds: taken as given


def from_data(cls: type[T], data: Mapping[str, Any], where: str = "", unknown: Unknown = "error") -> T:
    """A dataclass from plain data: nested tables become nested dataclasses, lists tuples or lists as annotated;
    a missing key takes the field's default. An unknown key is an error or skipped (`unknown`), or kept in the
    class's `extra` field where it has one. The dataclass's own checks run as it is made."""
    from_plain = getattr(cls, "from_plain", None)
    if from_plain is not None:
        made: T = from_plain(data, where, unknown)
        return made
    return from_fields(cls, data, where, unknown)


def from_fields(cls: type[T], data: Mapping[str, Any], where: str = "", unknown: Unknown = "error") -> T:
    """from_data's rules for a dataclass made from its own fields: what a `from_plain` calls once it has put its
    data in that form."""
    assert dataclasses.is_dataclass(cls)
    names = {f.name: f for f in dataclasses.fields(cls)}
    others = [k for k in data if k not in names or k == EXTRA]
    if others and EXTRA not in names and unknown == "error":
        key = f"{where}.{others[0]}" if where else others[0]
        known = ", ".join(n for n in names if n != EXTRA)
        raise UsageError(f"unknown key {key!r} (known{' in ' + where if where else ''}: {known})")
    kwargs = {k: _value(hints(cls)[k], v, f"{where}.{k}" if where else k, unknown)
              for k, v in data.items() if k in names and k != EXTRA}
    if EXTRA in names:
        kwargs[EXTRA] = {k: data[k] for k in others}
    try:
        return cls(**kwargs)
    except TypeError as e:  # a required field missing
        raise UsageError(f"{where or cls.__name__}: {e}") from None


def merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """`over` on top of `base`, table by table (flags over a config file)."""
    out = dict(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), Mapping) else v
    return out


def nest(flat: Mapping[str, Any]) -> dict[str, Any]:
    """{"run.timing.steps": 5} -> {"run": {"timing": {"steps": 5}}}."""
    out: dict[str, Any] = {}
    for path, v in flat.items():
        *parents, leaf = path.split(".")
        node = out
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = v
    return out


# -- TOML ---------------------------------------------------------------------------------------------

def read_toml(path: str | Path) -> dict[str, Any]:
    """A TOML file as data; a missing or malformed file is one line."""
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"config file not found: {path}")
    try:
        return tomllib.loads(p.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise UsageError(f"config file {path} is not valid TOML: {e}") from None


def _toml_key(k: str) -> str:
    return k if k and all(c.isalnum() or c in "-_" for c in k) else json.dumps(k)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return ("inf" if v > 0 else "-inf") if math.isinf(v) else "nan" if math.isnan(v) else repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a TOML basic string: JSON's escapes are TOML's
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v if x is not None) + "]"
    if isinstance(v, Mapping):
        return "{ " + ", ".join(f"{_toml_key(k)} = {_toml_value(x)}" for k, x in v.items() if x is not None) + " }"
    raise TypeError(f"no TOML form for {v!r}")


def to_toml(obj: Any, header: str = "", only: tuple[str, ...] | None = None) -> str:
    """A config dataclass as TOML: its values first, then each nested config as a [dotted.table]; a dict-valued
    field (peak_tflops) is an inline table. None has no TOML form: such a key is left out, and reads back as its
    field's default, which is None for every field that may hold None.
    only: the top-level fields to write (the others keep their defaults when the file is read)."""
    lines = [f"# {line}" for line in header.splitlines()]

    def table(prefix: str, o: Any) -> None:
        nested = []
        if prefix:
            lines.append(f"\n[{prefix}]")
        for f in dataclasses.fields(o):
            if not prefix and only is not None and f.name not in only:
                continue
            v = getattr(o, f.name)
            if dataclasses.is_dataclass(v):
                nested.append((f.name, v))
            elif v is not None:
                lines.append(f"{_toml_key(f.name)} = {_toml_value(to_data(v))}")
        for name, v in nested:
            table(f"{prefix}.{_toml_key(name)}" if prefix else _toml_key(name), v)

    table("", obj)
    return "\n".join(lines).lstrip("\n") + "\n"
