"""A run's configuration: the dataclasses where each field, its type, its default and its help live.

The command line is generated from them (cli/gen.py), config files and results.json's saved config are read
and written through one codec (codec.py), and each dataclass checks its own values when it is made, so a bad
value is one line (a UsageError, exit 2) wherever it came from. resolved.py turns a RunConfig (with "the
preset's" left as None) into a Resolved one in which every value is concrete; that is what results.json keeps.
The commands' own configurations (tune, train, race, sweep, check) are in commands.py.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from speedladder.codec import Group, at_least, option, peak_list, positive, rungs_option
from speedladder.config.ladders import FULL_LADDER, LADDERS, RACE_LADDER, SOURCE_LADDER, LadderDef, one_precision
from speedladder.config.recipe import RecipeConfig
from speedladder.errors import UsageError
from speedladder.models.presets import CUDA_DEFAULT_PRESET, FALLBACK_PRESET, PRESETS, Preset
from speedladder.processor import pick_device

# presets.py's and ladders.py's, read through here too
__all__ = ["CUDA_DEFAULT_PRESET", "FALLBACK_PRESET", "FULL_LADDER", "LADDERS", "PRESETS", "RACE_LADDER",
           "SOURCE_LADDER", "LadderDef", "Preset", "RecipeConfig", "pick_device"]

# nanoGPT's convention: the last tenth of a corpus (or of a token file with no --val-data) is held out for
# validation, and no training batch is drawn from it.
VAL_FRACTION = 0.1

# How the batch rung scales the learning rate with the batch (x K): kept, by sqrt(K), or by K (the linear rule).
BATCH_LR_SCALES: tuple[str, ...] = ("none", "sqrt", "linear")

PRECISIONS: tuple[str, ...] = ("fp32", "tf32", "bf16", "fp16", "fp8")  # the arithmetic of a step's matmuls
TOKENIZER_NAMES: tuple[str, ...] = ("char", "gpt2", "ids")


_PRESETS_HELP = ", ".join(f"{n} (B={s.batch_size}, T={s.seq_len}, {s.corpus})" for n, s in PRESETS.items())


@dataclass(frozen=True)
class MuonConfig:
    """The muon rung's optimizer for hidden matrices (the published defaults); AdamW keeps RunConfig.lr."""

    lr: float = option(0.02, help="Muon's learning rate for the hidden matrices", group=Group.MUON, flag="--muon-lr")
    momentum: float = option(0.95, help="Muon's momentum", group=Group.MUON, flag="--muon-momentum")
    nesterov: bool = option(True, help="Nesterov momentum in Muon", group=Group.MUON, flag="--muon-nesterov")
    ns_steps: int = option(5, help="Newton-Schulz iterations per update", group=Group.MUON, flag="--muon-ns-steps")

    def __post_init__(self) -> None:
        positive("Muon's learning rate", self.lr)
        at_least("Muon's momentum", self.momentum, 0)
        at_least("Newton-Schulz steps", self.ns_steps, 1)


@dataclass(frozen=True)
class TimingConfig:
    """How each rung is timed (docs/measurement.md, rules 2-4)."""

    steps: int | None = option(None, help="steps per timed window", shown="the preset's", metavar="N",
                               flag="--window-steps", was="--steps", group=Group.TIMING)
    windows: int = option(5, help="timed windows per rung (and per base re-timed beside it), at least 3; every "
                                  "window's time is kept", metavar="W", group=Group.TIMING)
    warmup: int | None = option(None, help="compile-free warm-up steps in a row before timing",
                                shown="the preset's", metavar="N", group=Group.WARMUP)
    max_warmup: int = option(50, help="stop waiting for compilation to settle after this many steps", metavar="N",
                             group=Group.MAX_WARMUP)
    # On CUDA a preset's steps can last milliseconds, and a window of 20 such is mostly its two edge syncs: there
    # the steps per window grow from a timed warm-up step until a window lasts this long (docs/measurement.md,
    # rule 4). 0 keeps --window-steps; a CPU or MPS keeps --window-steps always.
    min_window_s: float = option(0.5, help="on CUDA, steps per window grow from a timed step so that a window "
                                           "lasts at least this many seconds; 0 keeps --window-steps", metavar="S",
                                 group=Group.TIMING)

    def __post_init__(self) -> None:
        positive("steps per window", self.steps)
        at_least("warm-up steps", self.warmup, 0)
        positive("max warm-up", self.max_warmup)
        at_least("minimum window seconds", self.min_window_s, 0)
        if self.windows < 3:
            raise UsageError(f"at least 3 timed windows are needed for a verdict, got {self.windows}")


@dataclass(frozen=True)
class GateConfig:
    """Correctness gates (docs/measurement.md, rules 7 and 9)."""

    loss_steps: int = option(20, help="steps over the same first K batches compared with eager fp32", metavar="K",
                             group=Group.GATES)
    loss_band: float = option(0.02, help="largest allowed relative loss difference from eager fp32", metavar="F",
                              group=Group.GATES)
    learns_steps: int = option(300, help="steps of the final learns-check; 0 skips it", metavar="N", group=Group.GATES)
    # bf16 and fp32 ended within 0.1% of each other after 300 steps here; a model with attention zeroed ended 10%
    # above (d2l-cpu).
    learns_band: float = option(0.03, help="the learns-check passes if the final loss is at most this fraction "
                                           "above eager fp32's over the same batches (and below the corpus's "
                                           "unigram entropy)", metavar="F", group=Group.GATES)
    target_steps: int = option(200, help="a rung that changes the update rule (muon, a learning-rate rule) is "
                                         "compared with AdamW by the tokens each needs to reach AdamW's loss over "
                                         "N batches", metavar="N", group=Group.GATES)

    def __post_init__(self) -> None:
        for name, value in (("loss-band steps", self.loss_steps), ("loss band", self.loss_band),
                            ("target steps", self.target_steps)):
            positive(name, value)
        at_least("learns-check steps", self.learns_steps, 0)
        at_least("learns-check band", self.learns_band, 0)


@dataclass(frozen=True)
class ProfileConfig:
    """The profile taken before the ladder (measure -> classify -> predict)."""

    enabled: bool = option(True, help="skip the baseline profile and the predictions made from it",
                           flag="--no-profile", negate=True, group=Group.CLIMB)
    # Profiled steps, each synchronized at its end, after the warm-up. Enough for a median and quartiles per
    # category: one disturbed step must not move the breakdown (docs/profile.md).
    steps: int = option(15, help="steps profiled after the warm-up, each synchronized at its end; the breakdown "
                                 "is their median step, with the spread across them", metavar="N",
                        flag="--profile-steps", group=Group.PROFILE)
    timeout_s: float = option(900.0, help="the profiling process is given up on after this many seconds",
                              metavar="S", flag="--profile-timeout", group=Group.PROFILE)
    explain_miss: float = option(0.25, help="a rung whose measured x misses its prediction by more than this "
                                            "fraction, and a speed rung that lost, has its step and its base's "
                                            "profiled side by side; 0: none",
                                 metavar="F", flag="--explain-miss", group=Group.EXPLAIN)
    rungs: tuple[str, ...] = rungs_option((), help="`profile`: profile the configuration these rungs compose to, "
                                                   "applied in order without gates, instead of the baseline "
                                                   "(predictions then start from it)", shown="the baseline",
                                          flag="--compose", also=("--profile-rungs",), group=Group.PROFILE_CMD)

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise UsageError(f"at least one profiled step is needed, got {self.steps}")
        positive("the profile's timeout", self.timeout_s)
        if not self.explain_miss >= 0:
            raise UsageError(f"--explain-miss must be zero or more, got {self.explain_miss}")
        one_precision(self.rungs)


@dataclass(frozen=True)
class MemoryConfig:
    """The memory meters beside each rung's timing (memory.py; docs/memory-sweep.md)."""

    process_peak: bool = option(True, help="off CUDA, skip each rung's resident peak (one child process measures "
                                           "every rung in turn)", flag="--no-process-peak", negate=True,
                                group=Group.MEMORY)
    steps: int = option(2, help="steps measured in that child, after its warm-up", metavar="N",
                        flag="--memory-steps", group=Group.MEMORY)
    warmup: int = option(2, help="steps before them: optimizer state allocated, compilation done", metavar="N",
                         flag="--memory-warmup", group=Group.MEMORY)
    timeout_s: float = option(600.0, help="the memory child is given up on after this many seconds", metavar="S",
                              flag="--memory-timeout", group=Group.MEMORY)

    def __post_init__(self) -> None:
        positive("memory steps", self.steps)
        at_least("memory warm-up steps", self.warmup, 0)
        positive("the memory child's timeout", self.timeout_s)


@dataclass(frozen=True)
class RunConfig:
    """What the user asked for. None means "the preset's" (see PRESETS)."""

    preset: str | None = option(None, help=f"model and workload: {_PRESETS_HELP}", metavar="NAME",
                                choices=tuple(PRESETS), group=Group.MODEL,
                                shown="d2l-512 on CUDA, d2l-cpu (scaled down to finish in minutes) elsewhere")
    data: str | None = option(None, help="embedded corpus (timemachine, tinyshakespeare), a UTF-8 text file, or a "
                                         "FILE.bin of token ids (nanoGPT's: uint16, uint32 when --vocab-size > "
                                         "65535; memory-mapped, never loaded whole); training batches come from "
                                         "all but its val split", shown="the preset's corpus", metavar="NAME|PATH",
                              group=Group.MODEL)
    val_data: str | None = option(None, help="the held-out split's own file, of the same kind as --data "
                                             "(nanoGPT's prepare.py writes val.bin beside train.bin); no training "
                                             "batch is ever drawn from it",
                                  shown=f"the last {100 * VAL_FRACTION:.0f}% of --data", metavar="PATH",
                                  group=Group.MODEL)
    val_sequences: int = option(64, help="the fixed val set: N windows of T tokens evenly spaced over the val "
                                         "split, the same for every configuration and seed (race, tune's race, "
                                         "train)", metavar="N", group=Group.VAL_SET)
    tokenizer: str | None = option(None, help="char: d2l's 28 symbols; gpt2: GPT-2 BPE from the shipped ranks; "
                                              "ids: a .bin's ids as they are (gpt2 with a .bin decodes train's "
                                              "sample)", shown="the preset's (ids for a .bin)",
                                   choices=TOKENIZER_NAMES, group=Group.MODEL)
    model_source: str | None = option(None, help="your language model instead of the preset's GPT: FILE.py:NAME or "
                                                 "package.module:NAME, NAME an nn.Module class or a function "
                                                 "returning one (arguments vocab_size, block_size, seq_len get the "
                                                 "workload's); forward conventions and hooks: docs/models.md",
                                      shown="the preset's GPT", flag="--model", metavar="FILE.py:NAME",
                                      group=Group.MODEL)
    hf: str | None = option(None, help="a Hugging Face causal LM built from its config with random weights, "
                                       "offline: gpt2, llama or PATH/config.json (needs pip install "
                                       "speedladder[hf])", shown="none", metavar="gpt2|llama|CONFIG", group=Group.MODEL)
    hf_set: tuple[str, ...] = option((), help="override a value of the --hf config, e.g. n_layer=2 (GPT-2's names "
                                              "work for llama too); repeatable", shown="none", metavar="KEY=VALUE",
                                     append=True, group=Group.MODEL)
    vocab_size: int | None = option(None, help="the vocabulary (given to a model that takes vocab_size; a .bin "
                                               "holds uint32 ids above 65535)",
                                    shown="the tokenizer's for text, the model's for a .bin", metavar="V",
                                    group=Group.MODEL)
    batch_size: int | None = option(None, help="sequences per step", shown="the preset's", metavar="B",
                                    group=Group.MODEL)
    seq_len: int | None = option(None, help="tokens per sequence", shown="the preset's", metavar="T", group=Group.MODEL)
    batch_multiplier: int | None = option(None, help="the batch rung multiplies the batch by K",
                                          shown="the preset's", metavar="K", group=Group.BATCH)
    batch_lr_scale: str = option("none", help="the batch rung's learning rate: kept (none), times sqrt(K), or "
                                              "times K (linear); a rule other than none changes how the model "
                                              "learns, so the rung is judged by tokens to AdamW's loss rather than "
                                              "the loss band", choices=BATCH_LR_SCALES, group=Group.LEARNING)
    # None: "source" unless rungs are given one by one; once resolved, None means they were.
    ladder: str | None = option(None, help="source: the source text's R0-R4; full: "
                                           + ",".join(LADDERS["full"].rungs) + " with "
                                           + ",".join(LADDERS["full"].beside) + " measured beside its top; "
                                           "speedrun: " + ",".join(LADDERS["speedrun"].rungs)
                                           + " (the speedrun's model records last; best raced: speedladder race)",
                                shown="source", choices=tuple(LADDERS), group=Group.RUNGS)
    rungs: tuple[str, ...] | None = rungs_option(
        None, help="a ladder: rungs in order, each building on the best configuration so far (`profile`: the "
                   "ladder it predicts); wins over --ladder (and drops its beside rungs)",
        shown=f"{','.join(SOURCE_LADDER)}, i.e. the --ladder's rungs", group=Group.RUNGS)
    beside: tuple[str, ...] | None = rungs_option(None, help="rungs measured on the ladder's top, not built upon",
                                                  shown="the ladder's (full: ckpt)", metavar="A,B", group=Group.RUNGS)
    rung_files: tuple[str, ...] = option((), help="load your own rungs from FILE.py or package.module (declared "
                                                 "with speedladder.rung; docs/rungs.md), then name them among the "
                                                 "rungs; repeatable", shown="none", flag="--rung-file",
                                         metavar="FILE.py|MODULE", append=True, group=Group.RUNG_FILES)
    # Each rung file's sha256 when the run was resolved: a saved configuration refuses a file changed since.
    rung_hashes: dict[str, str] | None = option(None, help="the rung files' content hashes, as recorded",
                                                cli=False)
    stack_all: bool = option(False, help="build every rung on the last one that passed its gates, losses included "
                                         "(a pure cumulative waterfall); by default a speed rung that measures a "
                                         "loss is drawn red and named, and the next rung builds on the best "
                                         "configuration so far", group=Group.STACK)
    device: str = option("auto", help="auto (CUDA, else MPS, else CPU), cpu, cuda, cuda:N or mps", group=Group.MODEL)
    threads: int | None = option(None, help="the CPU threads torch uses (torch.set_num_threads), in this process "
                                            "and its children; recorded in the header", metavar="N",
                                 shown="torch's own choice", group=Group.MODEL)
    lr: float = option(1e-3, help="AdamW learning rate", group=Group.LEARNING)
    seed: int = option(0, help="seed of the initial weights and the batches", group=Group.MODEL)
    out: str = option("runs", help="parent folder of the run folder DIR/<timestamp>/", metavar="DIR",
                      group=Group.OUTPUT)
    peak_tflops: dict[str, float] | None = option(
        None, help="peak TFLOP/s for MFU per precision, e.g. bf16=989,fp32=67; a precision not given takes the "
                   "datasheet's, else the one measured here", shown="the vendors' datasheets for the GPUs in the "
                   "table; elsewhere each precision's matmul ceiling, measured on the spot",
        metavar="P=X,...", parse=peak_list, group=Group.CLIMB)
    recipe: RecipeConfig = option(factory=RecipeConfig, help="the training recipe")
    muon: MuonConfig = option(factory=MuonConfig, help="the muon rung's optimizer")
    timing: TimingConfig = option(factory=TimingConfig, help="how each rung is timed")
    gates: GateConfig = option(factory=GateConfig, help="the correctness gates")
    profile: ProfileConfig = option(factory=ProfileConfig, help="the baseline profile")
    memory: MemoryConfig = option(factory=MemoryConfig, help="the memory meters")
    model_changes: dict[str, int] | None = option(None, help="fields of the preset's GPTConfig changed (a sweep's "
                                                             "width, ...)", cli=False)

    def __post_init__(self) -> None:
        for name, value in (("batch size", self.batch_size), ("sequence length", self.seq_len),
                            ("batch multiplier", self.batch_multiplier), ("learning rate", self.lr),
                            ("--threads", self.threads)):
            positive(name, value)
        if self.vocab_size is not None and self.vocab_size <= 0:
            raise UsageError(f"vocabulary size must be positive, got {self.vocab_size}")
        if self.val_sequences < 1:
            raise UsageError(f"the val set needs at least one sequence, got {self.val_sequences}")
        if self.batch_lr_scale not in BATCH_LR_SCALES:
            raise UsageError(f"unknown batch learning-rate rule {self.batch_lr_scale!r} "
                             f"(choose from {', '.join(BATCH_LR_SCALES)})")
        if self.ladder is not None and self.ladder not in LADDERS:
            raise UsageError(f"unknown ladder {self.ladder!r} (choose from {', '.join(LADDERS)})")
        if self.model_source and self.hf:
            raise UsageError("give --model or --hf, not both")
        if self.hf_set and not self.hf:
            raise UsageError("--hf-set changes a Hugging Face config: it needs --hf")
        for precision, value in (self.peak_tflops or {}).items():
            if precision not in PRECISIONS:
                raise UsageError(f"unknown precision {precision!r} in the peak TFLOP/s (use {', '.join(PRECISIONS)})")
            positive(f"peak TFLOP/s for {precision}", value)

    def with_rungs(self, rungs: tuple[str, ...], beside: tuple[str, ...] = ()) -> RunConfig:
        """This run with these rungs climbed one by one (no named ladder), these beside: how a command whose own
        flags name the rungs (train, race, tune, sweep, a profile's or a meter's child) hands them to the run."""
        return dataclasses.replace(self, ladder=None, rungs=rungs, beside=beside)

    def with_ladder(self, name: str | None) -> RunConfig:
        """This run with a named ladder's rungs and beside rungs (None: the default, source), none given one by
        one: tune climbs the full ladder, a sweep sets each point's rungs itself."""
        return dataclasses.replace(self, ladder=name, rungs=None, beside=None)


def default(cls: type[Any], name: str) -> Any:
    """The default of a dataclass field, for code that shows it (the field itself is the one place it lives)."""
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


TOKEN_FILE_SUFFIX = ".bin"  # nanoGPT's prepared token files: ids back to back, uint16 (uint32 above 65,535)
TOKEN_FILE_TOKENIZER = "ids"  # a token file's ids are used as they are


def is_token_file(data: str) -> bool:
    return data.endswith(TOKEN_FILE_SUFFIX)
