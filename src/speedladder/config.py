"""Configuration dataclasses: the one place where defaults live.

The command line maps its flags onto these; `--help` shows these defaults.
`resolve` turns a RunConfig (with "use the preset's" left as None) into a
Resolved one in which every value is concrete; that is what results.json keeps.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import torch

from speedladder.errors import UsageError
from speedladder.ladders import FULL_LADDER, LADDERS, RACE_LADDER, SOURCE_LADDER, LadderDef
from speedladder.model import GPTConfig
from speedladder.presets import CUDA_DEFAULT_PRESET, FALLBACK_PRESET, PRESETS, Preset

# presets.py's and ladders.py's, read through here too
__all__ = ["CUDA_DEFAULT_PRESET", "FALLBACK_PRESET", "FULL_LADDER", "LADDERS", "PRESETS", "RACE_LADDER",
           "SOURCE_LADDER", "LadderDef", "Preset"]

# nanoGPT's convention: the last tenth of a corpus (or of a token file with no --val-data) is held out for
# validation, and no training batch is drawn from it.
VAL_FRACTION = 0.1

# How the batch rung scales the learning rate with the batch (x K): kept, by sqrt(K), or by K (the linear rule).
BATCH_LR_SCALES: tuple[str, ...] = ("none", "sqrt", "linear")

@dataclass(frozen=True)
class MuonConfig:
    """The muon rung's optimizer for hidden matrices (the published defaults); AdamW keeps RunConfig.lr."""

    lr: float = 0.02
    momentum: float = 0.95
    nesterov: bool = True
    ns_steps: int = 5  # Newton-Schulz iterations


PRECISIONS: tuple[str, ...] = ("fp32", "tf32", "bf16", "fp8")  # the arithmetic of a step's matmuls



@dataclass(frozen=True)
class TimingConfig:
    """How each rung is timed (docs/measurement.md, rules 2-4)."""

    steps: int | None = None  # steps per timed window; None: the preset's
    windows: int = 5  # timed windows per rung (and per base re-timed beside it); every window's time is kept
    warmup: int | None = None  # compile-free steps before timing; None: the preset's
    max_warmup: int = 50  # give up waiting for compilation to settle after this many steps


@dataclass(frozen=True)
class GateConfig:
    """Correctness gates (docs/measurement.md, rules 7 and 9)."""

    loss_steps: int = 20  # K: steps over the same first K batches compared with eager fp32
    loss_band: float = 0.02  # a rung's loss may differ from eager fp32's by this fraction at any of those steps
    learns_steps: int = 300  # length of the final learns-check; 0 skips it
    # The learns-check passes if the fastest configuration's final loss is at most this fraction above eager
    # fp32's over the same batches and steps (and below the corpus's unigram entropy). bf16 and fp32 ended within
    # 0.1% of each other after 300 steps here; a model with attention zeroed ended 10% above (d2l-cpu).
    learns_band: float = 0.03
    # A rung that changes the update rule (muon) has no loss band; it is compared with AdamW over this many
    # batches by the tokens each needs to reach AdamW's final loss.
    target_steps: int = 200


@dataclass(frozen=True)
class TuneConfig:
    """`speedladder tune`: the full ladder, then its surviving rungs together, within a time budget."""

    budget_minutes: float = 10.0  # for the whole search; a rung or candidate that would not fit is not started
    max_candidates: int = 4  # the survivors together, then each survivor left out in turn (smallest gain first)
    finalists: int = 2  # the fastest passing configurations measured again beside eager before a winner is named


@dataclass(frozen=True)
class TrainConfig:
    """`speedladder train`: train one configuration, log as the source text does, then sample."""

    steps: int = 300
    log_every: int = 10
    eval_every: int = 50  # val loss every N steps (and after the last); the best checkpoint is kept apart
    sample_tokens: int = 200  # generated after the prompt
    prompt_tokens: int = 16  # the corpus's first tokens start the sample
    temperature: float = 0.8
    top_k: int = 20  # sample among the k likeliest tokens; 0: all
    out: str = "runs"  # the checkpoint goes to runs/<timestamp>/checkpoint.pt


@dataclass(frozen=True)
class RaceConfig:
    """`speedladder race`: each configuration trained to a target val loss, over seeds, judged by the time to it."""

    seeds: int = 3  # runs per configuration, seeds seed, seed+1, ...: each changes the initial weights and batches
    target_loss: float | None = None  # None: calibrated, eager fp32's val loss after calibrate_steps steps
    calibrate_steps: int = 300  # the calibration's length, on a seed of its own (not one of the race's)
    eval_every: int = 10  # val loss every this many base steps' worth of tokens; the clock stops meanwhile
    # A run that has not reached the target after this many seconds of training stops ("did not reach");
    # None: cap_factor times the calibration's training time.
    time_cap_s: float | None = None
    cap_factor: float = 3.0
    # win or loss only at p below this, one-sided each way (Welch's t-test on the times; modded-nanogpt's rule).
    alpha: float = 0.01
    # Power: a note says when the seeds and their spread cannot detect a change this large at alpha.
    detect: float = 0.10
    combos: tuple[tuple[str, ...], ...] = ()  # given: each a set of rungs composed on eager, judged against it


@dataclass(frozen=True)
class ProfileConfig:
    """The profile taken before the ladder (measure -> classify -> predict)."""

    enabled: bool = True  # `run` profiles the baseline first; --no-profile skips it
    # Profiled steps, each synchronized at its end, after the warm-up. Enough for a median and quartiles per category:
    # one disturbed step must not move the breakdown (docs/profile.md).
    steps: int = 15
    timeout_s: float = 900.0  # the profiling process is given up on after this long
    explain_miss: float = 0.25  # a rung missing its prediction by more gets profiled beside its base; 0: none


@dataclass(frozen=True)
class MemoryConfig:
    """The memory meters beside each rung's timing (memory.py; docs/memory-sweep.md)."""

    process_peak: bool = True  # off a GPU: the step's resident peak, every rung in turn in one child process
    steps: int = 2  # steps measured in that child, after warm-up
    warmup: int = 2  # steps before them: optimizer state allocated, compilation done
    timeout_s: float = 600.0  # the child is given up on after this long


@dataclass(frozen=True)
class RunConfig:
    """What the user asked for. None means "the preset's" (see PRESETS)."""

    preset: str | None = None  # None: d2l-512 on CUDA, d2l-cpu elsewhere
    data: str | None = None  # an embedded corpus name, a UTF-8 text file, or a FILE.bin of token ids
    val_data: str | None = None  # the held-out split's own file (nanoGPT's val.bin); None: data's last tenth
    val_sequences: int = 64  # the fixed val set: this many windows of T tokens, evenly spaced over the split
    tokenizer: str | None = None  # "char" or "gpt2"; a .bin's ids are used as they are ("ids")
    # The model, when not the preset's GPT (docs/models.md): FILE.py:NAME or package.module:NAME ...
    model_source: str | None = None
    hf: str | None = None  # ... or a Hugging Face causal LM built from a config: "gpt2", "llama", PATH/config.json
    hf_set: tuple[str, ...] = ()  # KEY=VALUE overrides of that config, e.g. "n_layer=2"
    vocab_size: int | None = None  # None: the tokenizer's (text) or the model's (a .bin); above 65,535 a .bin is uint32
    batch_size: int | None = None
    seq_len: int | None = None
    batch_multiplier: int | None = None
    batch_lr_scale: str = "none"  # the batch rung's learning rate: "none", "sqrt" or "linear" in its multiplier
    ladder: str | None = "source"  # a name in LADDERS; None once resolved from rungs given one by one: "source" (R0-R4) or "full" (the ladder beyond)
    rungs: tuple[str, ...] | None = None  # None: the ladder's; given, they replace it (and its beside rungs)
    beside: tuple[str, ...] | None = None  # rungs measured on the ladder's top, not built upon; None: the ladder's
    device: str = "auto"  # "auto": CUDA, else MPS, else CPU
    lr: float = 1e-3  # AdamW, as in the sources
    seed: int = 0
    out: str = "runs"  # each run writes runs/<timestamp>/
    # MFU's peak TFLOP/s per matmul precision ("bf16", "fp32", "tf32", "fp8"), replacing the datasheet table
    # (e.g. a measured ceiling); a precision not given has no MFU. None: the table's, for known GPUs.
    peak_tflops: dict[str, float] | None = None
    muon: MuonConfig = field(default_factory=MuonConfig)
    timing: TimingConfig = field(default_factory=TimingConfig)
    gates: GateConfig = field(default_factory=GateConfig)
    profile: ProfileConfig = field(default_factory=ProfileConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    model_changes: dict[str, int] | None = None  # fields of the preset's GPTConfig changed (a sweep's width, ...)


@dataclass(frozen=True)
class Resolved:
    """What a run actually does: the RunConfig with every "the preset's" filled in, and the model it builds."""

    run: RunConfig  # every None of the user's RunConfig replaced by a concrete value; rungs always listed
    model: GPTConfig | None  # the preset's GPT; None when the model is the user's or Hugging Face's
    preset_note: str | None  # why this preset was chosen, when the user did not choose it

    # The batch shape every measuring module reads, named once here rather than spelled out at each use.
    @property
    def batch_size(self) -> int:
        return self.run.batch_size  # type: ignore[return-value]

    @property
    def seq_len(self) -> int:
        return self.run.seq_len  # type: ignore[return-value]

    def to_dict(self) -> dict:
        """The flat "config" of results.json (its field names are the schema's, kept since schema 1)."""
        r = self.run
        t = r.timing
        return {"preset": r.preset, "preset_note": self.preset_note,
                "model": dataclasses.asdict(self.model) if self.model else None, "model_source": r.model_source,
                "val_data": r.val_data, "val_sequences": r.val_sequences, "batch_lr_scale": r.batch_lr_scale,
                "hf": r.hf, "hf_set": list(r.hf_set), "vocab_size": r.vocab_size, "data": r.data, "tokenizer": r.tokenizer, "batch_size": r.batch_size, "seq_len": r.seq_len,
                "batch_multiplier": r.batch_multiplier, "ladder": r.ladder, "rungs": list(r.rungs or ()),
                "beside": list(r.beside or ()), "device": r.device, "lr": r.lr, "seed": r.seed, "out": r.out,
                "peak_tflops": r.peak_tflops, "steps": t.steps, "windows": t.windows, "warmup": t.warmup,
                "max_warmup": t.max_warmup, "gates": dataclasses.asdict(r.gates),
                "profile": dataclasses.asdict(r.profile), "muon": dataclasses.asdict(r.muon),
                "memory": dataclasses.asdict(r.memory), "model_changes": r.model_changes}

    def with_vocab(self, vocab_size: int) -> Resolved:
        if self.model is None:
            return self
        return dataclasses.replace(self, model=dataclasses.replace(self.model, vocab_size=vocab_size))


def run_config_from_dict(d: dict, device: str | None = None) -> RunConfig:
    """A RunConfig back from a saved one: dataclasses.asdict of a RunConfig, or results.json's flat "config"."""
    d = dict(d)
    if "timing" not in d:  # the flat form of Resolved.to_dict
        d["timing"] = {k: d.pop(k) for k in ("steps", "windows", "warmup", "max_warmup") if k in d}
    fields = RunConfig.__dataclass_fields__
    out = {k: v for k, v in d.items() if k in fields}
    out["timing"] = TimingConfig(**d["timing"])
    out["gates"] = GateConfig(**{k: v for k, v in d.get("gates", {}).items() if k in GateConfig.__dataclass_fields__})
    out["profile"] = ProfileConfig(**{k: v for k, v in d.get("profile", {}).items()
                                      if k in ProfileConfig.__dataclass_fields__})
    out["muon"] = MuonConfig(**d.get("muon", {}))
    if isinstance(out.get("peak_tflops"), (int, float)):  # schema 1 kept one number for every precision
        out["peak_tflops"] = dict.fromkeys(PRECISIONS, float(out["peak_tflops"]))
    out["memory"] = MemoryConfig(**d.get("memory", {}))
    for name in ("rungs", "beside", "hf_set"):  # tuples in the dataclass, lists in JSON, None for "the ladder's"
        if out.get(name) is not None:
            out[name] = tuple(out[name])
    if out.get("ladder") is None:
        out.pop("ladder", None)
    if device is not None:
        out["device"] = device
    return RunConfig(**out)


def default(cls: type, name: str):
    """The default of a dataclass field: lets the CLI show it without repeating it."""
    f = cls.__dataclass_fields__[name]
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def pick_device(requested: str) -> torch.device:
    if requested == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        dev = torch.device(requested)
    except RuntimeError:
        raise UsageError(f"unknown device {requested!r} (use auto, cpu, cuda, cuda:N or mps)") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise UsageError(f"device {requested} asked for, but no CUDA device is available")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise UsageError(f"device {requested} asked for, but only {torch.cuda.device_count()} CUDA device(s) exist")
    elif dev.type == "mps" and not torch.backends.mps.is_available():
        raise UsageError("device mps asked for, but MPS is not available")
    elif dev.type not in ("cpu", "cuda", "mps"):
        raise UsageError(f"unsupported device type {dev.type!r} (use cpu, cuda or mps)")
    return dev


def _positive(name: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):  # NaN compares false with everything: say so, not run
        raise UsageError(f"{name} must be positive, got {value}")


def _check_values(cfg: RunConfig, batch_size: int, seq_len: int, mult: int, steps: int, warmup: int) -> None:
    t = cfg.timing
    for name, value in (("batch size", batch_size), ("sequence length", seq_len),
                        ("batch multiplier", mult), ("steps per window", steps),
                        ("learning rate", cfg.lr), ("loss-band steps", cfg.gates.loss_steps),
                        ("loss band", cfg.gates.loss_band), ("max warm-up", t.max_warmup),
                        ("target steps", cfg.gates.target_steps)):
        _positive(name, value)
    for name, value in (("warm-up steps", warmup), ("learns-check steps", cfg.gates.learns_steps),
                        ("learns-check band", cfg.gates.learns_band)):
        if not (math.isfinite(value) and value >= 0):
            raise UsageError(f"{name} must be zero or more, got {value}")
    if cfg.profile.steps < 1:
        raise UsageError(f"at least one profiled step is needed, got {cfg.profile.steps}")
    if cfg.val_sequences < 1:
        raise UsageError(f"the val set needs at least one sequence, got {cfg.val_sequences}")
    if cfg.batch_lr_scale not in BATCH_LR_SCALES:
        raise UsageError(f"unknown batch learning-rate rule {cfg.batch_lr_scale!r} "
                         f"(choose from {', '.join(BATCH_LR_SCALES)})")
    if t.windows < 3:
        raise UsageError(f"at least 3 timed windows are needed for a verdict, got {t.windows}")
    for precision, value in (cfg.peak_tflops or {}).items():
        if precision not in PRECISIONS:
            raise UsageError(f"unknown precision {precision!r} in the peak TFLOP/s (use {', '.join(PRECISIONS)})")
        _positive(f"peak TFLOP/s for {precision}", value)


def check_race(race: RaceConfig) -> None:
    """The race's values, each refused in one line (a usage error) before anything is measured."""
    if race.target_loss is not None and not (math.isfinite(race.target_loss) and race.target_loss > 0):
        raise UsageError(f"the target loss must be a positive finite number, got {race.target_loss}")
    if race.seeds < 2:
        raise UsageError(f"a verdict needs at least 2 seeds per configuration (3 by default), got {race.seeds}")
    for name, value in (("calibration steps", race.calibrate_steps), ("eval every", race.eval_every)):
        if value < 1:
            raise UsageError(f"{name} must be at least 1, got {value}")
    for name, value in (("cap factor", race.cap_factor), ("detectable change", race.detect),
                        *((("time cap", race.time_cap_s),) if race.time_cap_s is not None else ())):
        _positive(name, value)
    if not 0 < race.alpha < 0.5:
        raise UsageError(f"the significance level must be between 0 and 0.5, got {race.alpha}")


def _rungs(cfg: RunConfig, known_rungs: tuple[str, ...]) -> tuple[str | None, tuple[str, ...], tuple[str, ...]]:
    """The ladder's name (None when the rungs were given one by one), its rungs and the rungs measured beside."""
    if cfg.ladder is not None and cfg.ladder not in LADDERS:
        raise UsageError(f"unknown ladder {cfg.ladder!r} (choose from {', '.join(LADDERS)})")
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
    return ((cfg.ladder or "source") if ladder else None), rungs, beside


TOKEN_FILE_SUFFIX = ".bin"  # nanoGPT's prepared token files: ids back to back, uint16 (uint32 above 65,535)
TOKEN_FILE_TOKENIZER = "ids"  # a token file's ids are used as they are


def is_token_file(data: str) -> bool:
    return data.endswith(TOKEN_FILE_SUFFIX)


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
        model = dataclasses.replace(setup.model, **(cfg.model_changes or {}))
    except (TypeError, ValueError) as e:
        raise UsageError(f"model changes {cfg.model_changes}: {e}") from None
    t = cfg.timing
    batch_size = cfg.batch_size if cfg.batch_size is not None else setup.batch_size
    seq_len = cfg.seq_len if cfg.seq_len is not None else setup.seq_len
    mult = cfg.batch_multiplier if cfg.batch_multiplier is not None else setup.batch_multiplier
    steps = t.steps if t.steps is not None else setup.steps_per_window
    warmup = t.warmup if t.warmup is not None else setup.warmup_steps
    _check_values(cfg, batch_size, seq_len, mult, steps, warmup)
    if ours and seq_len > model.block_size:
        raise UsageError(f"sequence length {seq_len} exceeds preset {preset}'s context of {model.block_size}")
    ladder, rungs, beside = _rungs(cfg, known_rungs)
    data = cfg.data if cfg.data is not None else setup.corpus
    tokenizer = cfg.tokenizer or (TOKEN_FILE_TOKENIZER if is_token_file(data) else setup.tokenizer)
    run = dataclasses.replace(
        cfg, preset=preset, data=data, tokenizer=tokenizer,
        batch_size=batch_size, seq_len=seq_len, batch_multiplier=mult, ladder=ladder, rungs=rungs, beside=beside,
        device=str(device), timing=dataclasses.replace(t, steps=steps, warmup=warmup))
    return Resolved(run=run, model=model if ours else None, preset_note=note)

