"""A run resolved: every "the preset's" of the user's RunConfig decided (the preset, the data, the batch shape,
the rungs), checked, and kept in a Resolved whose fields are never None. results.json's "config" is a Resolved,
saved flat and read back through the codec."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from speedladder.codec import Unknown, from_data, to_data
from speedladder.config.ladders import LADDERS, PRECISION_RUNGS, one_precision
from speedladder.config.run import PRECISIONS, TOKEN_FILE_TOKENIZER, RunConfig, is_token_file
from speedladder.errors import UsageError
from speedladder.models.gpt import GPTConfig
from speedladder.models.presets import CUDA_DEFAULT_PRESET, FALLBACK_PRESET, PRESETS

# What results.json's "config" holds beside the RunConfig's own fields: from the Resolved, not from the user.
RESOLVED_EXTRAS = ("preset_note", "model")
# results.json of schema 1 kept the timing fields at the top of its config; they are TimingConfig's now
# (and its peak_tflops was one number).
_SCHEMA1_TIMING = ("steps", "windows", "warmup", "max_warmup")


@dataclass(frozen=True)
class Resolved:
    """What a run actually does: each "the preset's" of the user's RunConfig decided, in fields that are never
    None, beside the RunConfig that repeats the run and the model it builds. Made by `resolve` (or `of`); saved
    flat, as results.json's "config": the RunConfig's fields, then preset_note and model."""

    run: RunConfig  # the user's RunConfig with each value below filled in: what config.toml repeats
    model: GPTConfig | None  # the preset's GPT; None when the model is the user's or Hugging Face's
    preset_note: str | None  # why this preset was chosen, when the user did not choose it
    preset: str
    data: str
    tokenizer: str
    batch_size: int
    seq_len: int
    batch_multiplier: int
    rungs: tuple[str, ...]  # always listed, whether they came from a ladder or one by one
    beside: tuple[str, ...]
    steps: int  # steps per timed window
    warmup: int  # compile-free warm-up steps before timing

    def __post_init__(self) -> None:
        # The concrete fields are the run's, never a second copy that could drift from it (a run replaced alone).
        if any(getattr(self, k) != v for k, v in self.decided(self.run).items()):
            raise ValueError("a Resolved's fields disagree with its run: make it with Resolved.of")

    @staticmethod
    def decided(run: RunConfig) -> dict[str, Any]:
        """The values `resolve` fills in, as the run holds them; a usage error names one it lacks (a saved config
        of a version that did not keep it)."""
        values = {"preset": run.preset, "data": run.data, "tokenizer": run.tokenizer, "batch_size": run.batch_size,
                  "seq_len": run.seq_len, "batch_multiplier": run.batch_multiplier, "rungs": run.rungs,
                  "beside": run.beside, "steps": run.timing.steps, "warmup": run.timing.warmup}
        missing = [k for k, v in values.items() if v is None]
        if missing:
            raise UsageError(f"the resolved config has no {missing[0]}")
        return values

    @classmethod
    def of(cls, run: RunConfig, model: GPTConfig | None, preset_note: str | None) -> Resolved:
        """The Resolved of a RunConfig in which every "the preset's" is filled in."""
        return cls(run=run, model=model, preset_note=preset_note, **cls.decided(run))

    def to_plain(self) -> dict[str, Any]:
        """results.json's "config": the resolved RunConfig's fields, and RESOLVED_EXTRAS."""
        return {**to_data(self.run), "preset_note": self.preset_note,
                "model": dataclasses.asdict(self.model) if self.model else None}

    @classmethod
    def from_plain(cls, data: Mapping[str, Any], where: str = "config", unknown: Unknown = "skip") -> Resolved:
        """A saved "config" read back, whatever version wrote it."""
        run = {k: v for k, v in data.items() if k not in RESOLVED_EXTRAS}
        if "timing" not in run and any(k in run for k in _SCHEMA1_TIMING):
            run["timing"] = {k: run.pop(k) for k in _SCHEMA1_TIMING if k in run}
        peak = run.get("peak_tflops")
        if isinstance(peak, (int, float)) and not isinstance(peak, bool):  # schema 1: one peak for every precision
            run["peak_tflops"] = dict.fromkeys(PRECISIONS, float(peak))
        model = data.get("model")
        return cls.of(from_data(RunConfig, run, where, unknown),
                      from_data(GPTConfig, model, f"{where}.model", unknown) if model else None,
                      data.get("preset_note"))

    def with_run(self, run: RunConfig) -> Resolved:
        return Resolved.of(run, self.model, self.preset_note)

    def with_vocab(self, vocab_size: int) -> Resolved:
        if self.model is None:
            return self
        return dataclasses.replace(self, model=dataclasses.replace(self.model, vocab_size=vocab_size))


def _rungs(cfg: RunConfig, known_rungs: tuple[str, ...]) -> tuple[str | None, tuple[str, ...], tuple[str, ...]]:
    """The ladder's name (None when the rungs were given one by one), its rungs and the rungs measured beside."""
    ladder = LADDERS[cfg.ladder or "source"] if cfg.rungs is None else None
    rungs = ladder.rungs if ladder else tuple(cfg.rungs or ())
    if not rungs:
        raise UsageError("no rungs given")
    unknown = [r for r in rungs if r not in known_rungs]
    if known_rungs and unknown:
        raise UsageError(f"unknown rung {unknown[0]!r} (choose from {', '.join(known_rungs)})")
    if len(set(rungs)) != len(rungs):
        raise UsageError(f"a rung is listed twice in {','.join(rungs)}")
    if "eager" in rungs and rungs[0] != "eager":
        raise UsageError("eager is the baseline: it can only be the first rung")
    beside = tuple(cfg.beside) if cfg.beside is not None else (ladder.beside if ladder else ())
    unknown = [r for r in beside if r not in known_rungs or r == "eager"]
    if known_rungs and unknown:
        raise UsageError(f"unknown rung {unknown[0]!r} to measure beside the ladder")
    if set(beside) & set(rungs):
        raise UsageError(f"a rung cannot be both climbed and measured beside: {min(set(beside) & set(rungs))}")
    # A rung measured beside the top builds on the ladder's precision; beside rungs alone (a sweep's) each stand alone.
    one_precision((*rungs, *(beside if set(rungs) & set(PRECISION_RUNGS) else ())))
    # A ladder's own rungs and beside rungs given one by one are that ladder: a resolved config read back (from a
    # config file, or by check) resolves to itself, name and all.
    named = cfg.ladder or "source"
    same = cfg.ladder is not None and (LADDERS[named].rungs, LADDERS[named].beside) == (rungs, beside)
    return (named if ladder or same else None), rungs, beside



def resolve(cfg: RunConfig, device: torch.device, known_rungs: tuple[str, ...] = ()) -> Resolved:
    """Fill every "the preset's" with a value and check the result.

    The model keeps its preset's vocabulary (`with_vocab` sets the data's). With a model of the user's or
    Hugging Face's, the preset gives the workload only (data, batch shape, timing); Resolved.model is None.
    """
    note = None
    preset = cfg.preset
    ours = cfg.model_source is None and cfg.hf is None
    if preset is None:
        preset = CUDA_DEFAULT_PRESET if device.type == "cuda" else FALLBACK_PRESET
        if device.type != "cuda":
            m, s = PRESETS[preset].model, PRESETS[preset]
            note = (f"no CUDA device: using the scaled-down preset {preset} (width {m.n_embd}, "
                    f"{m.n_layer} blocks) so the ladder ends within minutes; "
                    f"--preset {CUDA_DEFAULT_PRESET} gives the reference setup") if ours else (
                    f"no CUDA device: using the workload of the scaled-down preset {preset} (B={s.batch_size}, "
                    f"T={s.seq_len}, {s.corpus}) so the ladder ends within minutes")
    if preset not in PRESETS:
        raise UsageError(f"unknown preset {preset!r} (choose from {', '.join(PRESETS)})")
    setup = PRESETS[preset]
    try:  # a sweep's changes to the preset's model; an unknown field or a shape GPTConfig refuses is a usage error
        changes: dict[str, Any] = dict(cfg.model_changes or {})
        model = dataclasses.replace(setup.model, **changes)
    except (TypeError, ValueError) as e:
        raise UsageError(f"model changes {cfg.model_changes}: {e}") from None
    t = cfg.timing
    batch_size = cfg.batch_size if cfg.batch_size is not None else setup.batch_size
    seq_len = cfg.seq_len if cfg.seq_len is not None else setup.seq_len
    mult = cfg.batch_multiplier if cfg.batch_multiplier is not None else setup.batch_multiplier
    steps = t.steps if t.steps is not None else setup.steps_per_window
    warmup = t.warmup if t.warmup is not None else setup.warmup_steps
    if ours and seq_len > model.block_size:
        raise UsageError(f"sequence length {seq_len} exceeds preset {preset}'s context of {model.block_size}")
    ladder, rungs, beside = _rungs(cfg, known_rungs)
    n = cfg.recipe.accum_steps
    if n is not None and mult % n:
        raise UsageError(f"--accum-steps {n} does not divide the batch rung's multiplier {mult}: the accum rung "
                         f"reaches the batch rung's batch in whole micro-batches")
    data = cfg.data if cfg.data is not None else setup.corpus
    tokenizer = cfg.tokenizer or (TOKEN_FILE_TOKENIZER if is_token_file(data) else setup.tokenizer)
    run = dataclasses.replace(
        cfg, preset=preset, data=data, tokenizer=tokenizer,
        batch_size=batch_size, seq_len=seq_len, batch_multiplier=mult, ladder=ladder, rungs=rungs, beside=beside,
        device=str(device), timing=dataclasses.replace(t, steps=steps, warmup=warmup))
    return Resolved.of(run, model if ours else None, note)

