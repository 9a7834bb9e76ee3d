"""A race's ruler: the target, the val set and the eval cadence its times are measured against.

Two races' times to the target compare only when the ruler is the same: the same target val loss, on the same
val windows, evaluated at the same token intervals (the crossing is interpolated between evaluations, so the
cadence is part of the measurement). `--target-from RUN_DIR` takes a saved race's target so that a new race is
measured on its ruler; `compare` and `check` say when two races' rulers differ.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from speedladder.config.settings import RaceConfig
from speedladder.errors import UsageError
from speedladder.records import storage
from speedladder.records.race_section import ruler_differences as differences
from speedladder.step.workload import Workload


def val_hash(x: torch.Tensor, y: torch.Tensor) -> str:
    """The val set's identity: sha256 of its windows' token ids (inputs and targets), first 16 hex digits."""
    h = hashlib.sha256()
    for t in (x, y):
        h.update(t.detach().to("cpu", torch.int64).contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def target_from(folder: str) -> tuple[float, dict[str, Any]]:
    """The target of a saved race, and its section (to check the new race's ruler against): a usage error when the
    folder is not a race, or names no target."""
    path = Path(folder)
    if not (path / storage.FILENAME).exists() and not (path.is_file() and path.suffix == ".json"):
        raise UsageError(f"--target-from {folder}: no {storage.FILENAME} there, so no race to take the target from")
    saved = storage.load(path)
    race = saved.race
    if race is None or race.target_loss is None:
        what = "is not a race" if race is None else "is a race that set no target (it stopped first)"
        raise UsageError(f"--target-from {folder} {what}: give a `speedladder race` folder, or --target-loss")
    from speedladder.records import to_dict

    return float(race.target_loss), to_dict(race)


def fixed(race: RaceConfig) -> tuple[RaceConfig, str | None, Callable[[Workload], None]]:
    """--target-from RUN_DIR: that race's target as --target-loss (so config.toml repeats it), where it came from,
    and the check, once the workload is known, that this race's val set and eval cadence are that race's."""
    if not race.target_from:
        return race, None, lambda w: None
    target, saved = target_from(race.target_from)
    note = f"the target of {race.target_from} ({saved.get('target_from') or 'given there'})"

    def same(work: Workload) -> None:
        x, y = work.val_set(work.cfg.seq_len)
        here = {"target_loss": target, "val_hash": val_hash(x, y), "val_sequences": len(x),
                "val_seq_len": work.cfg.seq_len, "eval_tokens": race.eval_every * work.base_spec.tokens_per_step}
        differ = differences(saved, here)
        if differ:
            raise UsageError(f"--target-from {race.target_from}: that race was measured on another ruler ("
                             + "; ".join(differ) + "): give the same data, --val-sequences, --seq-len, --batch-size "
                             "and --eval-every-base-steps, or calibrate a target of this race's own")

    return dataclasses.replace(race, target_loss=target, target_from=None), note, same
