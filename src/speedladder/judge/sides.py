"""What the candidate and the base are, read from the arguments without running any of their code.

A side is a configuration on the judge's workload: its rungs (composed on eager fp32), its rung files, its learning
rate, recipe, Muon settings and batch rule. It is given as

- a rung file (`.py`): the rungs it declares, composed on the base's (a candidate) or on eager fp32 (a base);
- a config file (`.toml`: a run's config.toml, tune's winner.toml, your own): its `[train]` rungs, else its `[run]`
  rungs, with its learning settings; its workload must be the judge's;
- a run folder: its winner (a tune's, a race's fastest, else the fastest rung that passed every gate), with the
  learning settings it ran with; its workload must be the judge's.

The workload (model, data, batch shape) is the judge's own (its flags and --config): a file made for another one is
refused in one line, with the field that differs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from speedladder import codec
from speedladder.config import settings
from speedladder.config.run import RunConfig
from speedladder.errors import UsageError
from speedladder.records import storage
from speedladder.rungs import files as rung_files
from speedladder.step.workload import source_of

# What a side brings: how the model is trained. Everything else of a side's run is the judge's workload.
CONFIGURATION = ("rungs", "rung_files", "rung_hashes", "lr", "batch_lr_scale", "recipe", "muon")
# What must agree between a side's file and the judge's workload.
WORKLOAD = ("preset", "data", "val_data", "tokenizer", "model_source", "hf", "hf_set", "vocab_size", "batch_size",
            "seq_len", "batch_multiplier", "model_changes", "val_sequences")


@dataclass(frozen=True)
class Side:
    """One side of a judgement: its name, what was given, and its run (the judge's workload, its configuration)."""

    name: str
    source: str  # the path given, or "eager fp32"
    kind: str  # "eager", "rung-file", "config" or "run"
    run: RunConfig
    declared_from: tuple[str, ...] = ()  # rung files whose rungs follow run.rungs, in order (read by its worker)


def workload(run: RunConfig) -> RunConfig:
    """The judge's own run: its workload, eager fp32, no rung of anyone's."""
    return dataclasses.replace(run.with_rungs(("eager",)), rung_files=(), rung_hashes=None)


def eager(run: RunConfig) -> Side:
    return Side("eager", "eager fp32", "eager", workload(run))


def _differences(mine: RunConfig, theirs: RunConfig) -> list[str]:
    a, b = codec.to_data(mine), codec.to_data(theirs)
    a["model_source"], b["model_source"] = source_of(mine), source_of(theirs)
    return [f"{k} {b[k]!r} there, {a[k]!r} here" for k in WORKLOAD if a.get(k) != b.get(k)]


def _configured(what: str, path: str, run: RunConfig, theirs: RunConfig, rungs: tuple[str, ...], name: str,
                kind: str) -> Side:
    """A side from a saved configuration: its configuration fields on the judge's workload, which must be its own."""
    differ = _differences(run, theirs)
    if differ:
        raise UsageError(f"{what} {path} was made for another workload ({'; '.join(differ[:3])}): judge on its "
                         f"workload with --config {path}, or give the judge's flags")
    for entry in theirs.rung_files:
        rung_files.where_of(entry)  # a missing file is one line here, before any worker starts
    fields = {k: getattr(theirs, k) for k in CONFIGURATION}
    side_run = dataclasses.replace(workload(run), **fields).with_rungs(rungs or ("eager",))
    return Side(name, path, kind, side_run)


def _from_toml(what: str, path: Path, run: RunConfig) -> Side:
    data = settings.read(path)
    s = codec.from_data(settings.Settings, data)
    rungs = s.train.rungs or s.run.rungs or ()
    name = "+".join(n for n in rungs if n != "eager") or path.stem
    return _configured(what, str(path), run, s.run, tuple(rungs), name, "config")


def _from_run(what: str, path: Path, run: RunConfig) -> Side:
    if not (path / storage.FILENAME).is_file():
        raise UsageError(f"{what} {path}: a folder without {storage.FILENAME}, so no saved run")
    saved = storage.load(path)
    won = saved.winner()
    if won is None:
        raise UsageError(f"{what} {path} names no configuration that passed every gate")
    theirs = saved.config.run
    if saved.tune is not None and saved.tune.winner_batch_lr_scale:
        theirs = dataclasses.replace(theirs, batch_lr_scale=saved.tune.winner_batch_lr_scale)
    return _configured(what, str(path), run, theirs, won[1], won[0], "run")


def read(what: str, given: str, run: RunConfig, base: Side | None = None) -> Side:
    """A side from its argument. A rung file is composed on `base` (a candidate's) or on eager fp32."""
    path = Path(given).expanduser()
    if not path.exists():
        raise UsageError(f"{what} {given}: no such file or folder")
    if path.is_dir():
        return _from_run(what, path, run)
    if path.suffix == ".toml":
        return _from_toml(what, path, run)
    if path.suffix == ".py":
        under = base or eager(run)
        entry = str(path.resolve())
        found = rung_files.hashes((entry,))
        side_run = dataclasses.replace(under.run, rung_files=(*under.run.rung_files, entry),
                                       rung_hashes={**(under.run.rung_hashes or {}), **found})
        return Side(path.stem, str(path), "rung-file", side_run, declared_from=(*under.declared_from, entry))
    raise UsageError(f"{what} {given}: give a rung file (.py), a config file (.toml: config.toml, winner.toml) or "
                     "a run folder")
