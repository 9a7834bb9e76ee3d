"""The Python API: climb the ladder on your model and your data from a script or a notebook.

    import speedladder
    results = speedladder.climb(MyModel, data="train.bin", batch_size=8, seq_len=256)
    print(results.fastest)

`speedladder.apply(model, "runs/<tune>/winner.toml")` puts a winner on your own model and optimizer (winner.py).

`climb` does what `speedladder run` does, through the same workload and ladder, and
leaves the same files: results.json (after every rung), waterfall.png and
report.html in out/<timestamp>/.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from torch import nn

from speedladder import report
from speedladder.codec import from_data
from speedladder.codec import to_data as codec_data
from speedladder.config.run import RACE_LADDER, RunConfig, default
from speedladder.config.settings import RaceConfig
from speedladder.ladder.climb import Ladder
from speedladder.models.user import LIVE, portable
from speedladder.progress import show_on_stderr
from speedladder.racing import Race, target
from speedladder.records import Results, storage
from speedladder.step.workload import prepare
from speedladder.train.winner import apply

__all__ = ["apply", "climb", "race"]


def _model(model: nn.Module | Callable[[], nn.Module] | str | None) -> tuple[str | None, Any]:
    """The --model spec and the object to build from: a spec string, or an object no other process can import."""
    if model is None or isinstance(model, str):
        return model, None
    spec = portable(model)  # an importable class or function: the profiling process can build it too
    if spec is not None:
        return spec, None
    return f"{LIVE} {getattr(model, '__qualname__', type(model).__name__)}", model


def _run_config(model_source: str | None, data: str | None, batch_size: int | None, seq_len: int | None,
                rungs: tuple[str, ...] | None, out: str, device: str, options: dict[str, Any]) -> RunConfig:
    """A RunConfig from the API's keywords, through the codec: nested configs as dicts of their fields."""
    unknown = sorted(set(options) - set(RunConfig.__dataclass_fields__))
    if unknown:  # as Python says it of any function: the API's keywords are RunConfig's fields
        raise TypeError(f"got an unexpected keyword argument {unknown[0]!r}")
    given = {"model_source": model_source, "data": data, "batch_size": batch_size, "seq_len": seq_len,
             "rungs": rungs, "out": out, "device": device}
    return from_data(RunConfig, {**codec_data(options), **{k: v for k, v in given.items() if v is not None}})


def climb(model: nn.Module | Callable[[], nn.Module] | str | None = None, *, data: str | None = None,
          batch_size: int | None = None, seq_len: int | None = None, rungs: tuple[str, ...] | list[str] | None = None,
          out: str = default(RunConfig, "out"), device: str = default(RunConfig, "device"), quiet: bool = False,
          **options: Any) -> Results:
    """Climb the ladder on a model and return the typed results; the files land in out/<timestamp>/.

    model: an nn.Module (copied for every rung, its weights the initial ones), a zero-argument factory (a class
    or a function; arguments named vocab_size, block_size or seq_len get the workload's), a "FILE.py:NAME"
    string as `--model` takes, or None for the preset's GPT. A model defined in __main__ or given as an object
    cannot be imported by the profiling process: it is then climbed without a profile (results.profile says why).
    data: an embedded corpus, a text file or a FILE.bin of token ids. rungs: None climbs the default ladder.
    options: any other RunConfig field (preset, tokenizer, hf, hf_set, vocab_size, ladder, lr, seed,
    peak_tflops, ...), with timing, gates and profile as keyword dicts of TimingConfig, GateConfig and
    ProfileConfig fields, e.g. timing={"steps": 5}, profile={"enabled": False}.
    """
    spec, obj = _model(model)
    run = _run_config(spec, data, batch_size, seq_len, tuple(rungs) if rungs is not None else None, out, device,
                      options)
    progress = show_on_stderr(quiet)
    work = prepare(run, obj)
    if work.cfg.preset_note:
        progress(work.cfg.preset_note)
    run_dir = storage.new_run_dir(work.cfg.run.out)
    progress(f"{work.model.name}: {work.params:,} parameters on {work.device} ({work.model.convention_line}); "
             f"writing {run_dir}")
    try:
        Ladder(work, run_dir, progress).run()
    finally:  # interrupted too: the rungs measured so far are drawn
        saved = storage.load(run_dir)
        report.show(saved, run_dir, quiet=quiet)
    return saved


def race(model: nn.Module | Callable[[], nn.Module] | str | None = None, *, data: str | None = None,
         batch_size: int | None = None, seq_len: int | None = None,
         rungs: tuple[str, ...] | list[str] | None = None, combos: list[list[str]] | None = None,
         seeds: int = default(RaceConfig, "seeds"), target_loss: float | None = None,
         out: str = default(RunConfig, "out"), device: str = default(RunConfig, "device"), quiet: bool = False,
         race_options: dict[str, Any] | None = None, **options: Any) -> Results:
    """Race configurations to a target val loss, as `speedladder race` does; the files land in out/<timestamp>/.

    rungs: a cumulative ladder (default eager, compile, bf16, batch, muon), raced in stages, each rung beside the
    best configuration so far and judged against it; or combos: lists of rungs composed on eager, raced in one
    stage beside eager. seeds and target_loss as the flags; race_options: any other RaceConfig field
    (calibrate_steps, eval_every, cap_factor, budget_steps, stack_all, target_from, alpha, ...). model, data and
    options as `climb` takes them; results.race holds every run, time, p-value and verdict.
    """
    spec, obj = _model(model)
    given = tuple(tuple(c) for c in combos) if combos else None
    names = (("eager", *dict.fromkeys(n for c in given for n in c if n != "eager")) if given
             else tuple(rungs) if rungs is not None else RACE_LADDER)
    run = dataclasses.replace(_run_config(spec, data, batch_size, seq_len, names, out, device, options),
                              beside=(), ladder=None)
    cfg = from_data(RaceConfig, {**codec_data(race_options or {}), "seeds": seeds, "target_loss": target_loss,
                                 "combos": given or (), "rungs": None if given else names})
    cfg, note, same_ruler = target.fixed(cfg)  # target_from: a saved race's target, on its ruler
    progress = show_on_stderr(quiet)
    work = prepare(run, obj)
    work.val_set(work.cfg.seq_len)
    same_ruler(work)
    cfg = work.raced(cfg)  # a schedule's length is the race's budget
    run_dir = storage.new_run_dir(work.cfg.run.out)
    progress(f"{work.model.name}: {work.params:,} parameters on {work.device}; {work.data_line}; writing {run_dir}")
    contest = Race(work, run_dir, cfg, progress, role="combo" if given else "rung",  # it writes config.toml
                   target_note=note)
    try:
        if given:
            contest.prepare_combos(given)
        else:
            contest.prepare_ladder(work.cfg.run.rungs or ())
        contest.run()
    finally:
        saved = storage.load(run_dir)
        report.show(saved, run_dir, quiet=quiet)
    return saved
