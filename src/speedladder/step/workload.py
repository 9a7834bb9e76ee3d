"""One workload: the model, the corpus and its batches, the initial weights, and the header of its results.

Every command that trains (run, profile, tune, train, predict, ddp and each
torchrun rank) builds its steps and batch streams here; every timed
measurement of a spec goes through step/measurement.py's `measure_spec`.
"""

from __future__ import annotations

import dataclasses
import gc
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from speedladder.config.resolved import Resolved, resolve
from speedladder.config.run import RunConfig, pick_device
from speedladder.config.settings import RaceConfig
from speedladder.data.batches import BatchStream, val_windows
from speedladder.data.corpus import (
    Corpus,
    Split,
    check_fits,
    check_ids,
    check_val_ids,
    check_val_size,
    holdout,
    load_corpus,
)
from speedladder.errors import UsageError
from speedladder.measure import devicemem
from speedladder.models import build
from speedladder.models.definition import ModelDef
from speedladder.records import CorpusRecord, Results, SavedModel, storage
from speedladder.rungs import RUNGS, Env, env_for
from speedladder.rungs import files as rung_files
from speedladder.spec import StepSpec
from speedladder.step.schedule import Schedule, Span, race_length, schedule_of
from speedladder.step.train_step import TrainStep

# The gate batches are drawn from a stream of their own, apart from the timing stream's.
GATE_SEED_OFFSET = 1


def source_of(run: RunConfig) -> str | None:
    """A FILE.py:NAME made absolute, so a child process or a rank finds the same file (RunConfig checked the
    model flags themselves when it was made)."""
    where, colon, name = (run.model_source or "").rpartition(":")
    if colon and where.endswith(".py"):
        return f"{Path(where).expanduser().resolve()}:{name}"
    return run.model_source


def define_model(cfg: Resolved, vocab: int | None, obj: Any = None) -> tuple[Resolved, ModelDef, dict[str, torch.Tensor]]:
    """The model a run climbs and its initial weights; `vocab` is the data's (None: the model's).

    `obj` is a model given to the Python API as an object (an nn.Module, a class, a function).
    """
    run = cfg.run
    cfg = cfg.with_run(dataclasses.replace(run, model_source=source_of(run)))
    run = cfg.run
    vocab = run.vocab_size or vocab
    ours = not (run.hf or run.model_source or obj is not None)
    if ours and vocab:
        cfg = cfg.with_vocab(vocab)  # the preset's GPT takes the data's vocabulary
    model_def, init = build.define(run.hf, run.hf_set, run.model_source, obj, vocab, cfg.seq_len,
                                   cfg.model if ours else None, run.preset, run.seed)
    return cfg, model_def, init



@dataclass
class Workload:
    """Everything a measurement needs that does not change between rungs."""

    cfg: Resolved
    device: torch.device
    corpus: Corpus  # the training split: every batch any command trains on is drawn from it
    init: dict[str, torch.Tensor]  # the weights every rung starts from, on the host
    env: Env
    model: ModelDef  # ours, Hugging Face's or the user's: how to build, call, count and change it
    split: Split  # the training split and the held-out val split, never overlapping
    # The recipe's learning-rate schedule, as long as the recipe says or else as the command's training
    # (`horizon`): every step built here follows it, the gates' references included.
    schedule: Schedule = field(default_factory=Schedule)

    def with_horizon(self, horizon: Span, tokens_only: bool = False) -> None:
        """The schedule made again for a training of this length (train's steps, a race's budget): a usage error
        when the recipe's warm-up does not fit in it. tokens_only: a race's, every count in tokens."""
        self.schedule = schedule_of(self.cfg.run.recipe, horizon, self.base_spec.tokens_per_step, tokens_only)

    def raced(self, race: RaceConfig) -> RaceConfig:
        """The race with its budget and calibration as long as the recipe's schedule, and this workload's schedule
        as long as the race's budget, every count in tokens (step/schedule.race_length)."""
        budget, calibrate, span = race_length(self.cfg.run.recipe, race.budget_steps, race.calibrate_steps,
                                              self.base_spec.tokens_per_step)
        self.with_horizon(span, tokens_only=True)
        return dataclasses.replace(race, budget_steps=budget, calibrate_steps=calibrate)

    @property
    def val(self) -> Corpus:
        return self.split.val

    @property
    def data_line(self) -> str:
        """What the header says of the data: what is trained on, and what is held out."""
        s = self.split
        return (f"{self.corpus.n_tokens:,} training tokens of {self.corpus.source}; {s.val_from} "
                f"({s.val.n_tokens:,} tokens) held out for validation")

    def val_set(self, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The fixed val set at a sequence length (the same for every configuration and seed), on the host;
        its split must hold one batch of the workload's shape."""
        check_val_size(self.split, self.cfg.batch_size, self.cfg.seq_len)
        return val_windows(self.val, seq_len, self.cfg.run.val_sequences)

    @property
    def base_spec(self) -> StepSpec:
        return StepSpec(self.cfg.batch_size, self.cfg.seq_len)

    @property
    def vocab_size(self) -> int:
        return self.model.vocab_size

    @property
    def params(self) -> int:
        return self.model.params

    @property
    def matmul_params(self) -> int | None:
        return self.model.matmul_params

    def flops_per_token(self, spec: StepSpec) -> int:
        """PaLM's 6N + 12LHQT where the architecture is known, else counted by torch (models/definition.py)."""
        return self.model.flops_per_token(spec.seq_len)

    def step(self, spec: StepSpec, wrap: Callable[[nn.Module], nn.Module] | None = None,
             device: torch.device | None = None, dtype: torch.dtype | None = None) -> TrainStep:
        """The training step of a spec, from the workload's initial weights (in `dtype`, e.g. the gates' float64
        reference, when given)."""
        return TrainStep(spec, self.model, self.init, device or self.device, self.cfg.run.lr, wrap=wrap,
                         muon=self.cfg.run.muon, dtype=dtype, recipe=self.cfg.run.recipe, schedule=self.schedule)

    def stream(self, spec: StepSpec, seed: int | None = None, device: torch.device | None = None) -> BatchStream:
        """The timing stream of a spec's shape (seeded by the run's seed unless told otherwise)."""
        return BatchStream(self.corpus, spec.batch_size, spec.seq_len, device or self.device,
                           self.cfg.run.seed if seed is None else seed)

    def gate_batches(self, spec: StepSpec, k: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The first k gate batches of a shape: the same for every rung of that shape, on the host."""
        stream = BatchStream(self.corpus, spec.batch_size, spec.seq_len, torch.device("cpu"),
                             self.cfg.run.seed + GATE_SEED_OFFSET)
        return [stream.next_host() for _ in range(k)]

    def unfit(self, spec: StepSpec) -> str | None:
        """Why a spec's batch cannot be drawn from this corpus, or None."""
        n = self.corpus.n_tokens - 1
        if spec.tokens_per_step > n:
            return f"batch {spec.batch_size} x {spec.seq_len} = {spec.tokens_per_step:,} tokens exceeds the corpus ({n:,})"
        return None


def prepare(run: RunConfig, model: object = None) -> Workload:
    """Resolve the config, load the corpus (tokenize text, map a token file), define the model and draw its
    initial weights. `model`: one given to the Python API as an object (else the config names it). The schedule is
    as long as the run's longest training, its learns-check (a command that trains longer says so: with_horizon)."""
    if run.threads is not None:
        torch.set_num_threads(run.threads)  # before anything runs: this process's steps, and its children's
    device = pick_device(run.device)
    run = with_rung_files(run)
    cfg = resolve(run, device, known_rungs=tuple(RUNGS))
    corpus = load_corpus(cfg.data, cfg.tokenizer, cfg.run.vocab_size)
    split = holdout(corpus, cfg.run.val_data, cfg.run.vocab_size)
    check_fits(split.train, cfg.batch_size, cfg.seq_len)
    cfg, model_def, init = define_model(cfg, corpus.vocab_size or None, model)
    if isinstance(corpus.tokens, torch.Tensor) and corpus.vocab_size > model_def.vocab_size:
        raise UsageError(f"the tokenizer's vocabulary ({corpus.vocab_size:,}) is larger than the model's "
                         f"({model_def.vocab_size:,}): give the model a vocab_size argument, or --vocab-size")
    check_ids(corpus, model_def.vocab_size)  # a token file: every id below the model's vocabulary, in chunks
    check_val_ids(split, model_def.vocab_size)
    vocab = corpus.vocab_size or model_def.vocab_size
    split = Split(dataclasses.replace(split.train, vocab_size=vocab), dataclasses.replace(split.val, vocab_size=vocab),
                  split.val_from)
    env = env_for(device, cfg.batch_multiplier, cfg.run.batch_lr_scale, model_def, base_batch=cfg.batch_size,
                  accum_steps=cfg.run.recipe.accum_steps)
    work = Workload(cfg, device, split.train, init, env, model_def, split)
    g = cfg.run.gates
    work.with_horizon(Span(g.learns_steps or g.loss_steps, "steps"))
    return work


def with_rung_files(run: RunConfig) -> RunConfig:
    """The user's rung files loaded (checked against the hashes a saved configuration recorded), and recorded
    as absolute paths with the sha256 of their content, so a child process, a re-run and a saved config.toml
    load the same rungs (rungs/files.py)."""
    if not run.rung_files:
        return run
    rung_files.load(run.rung_files, run.rung_hashes)
    found = rung_files.hashes(run.rung_files)
    return dataclasses.replace(run, rung_files=tuple(found), rung_hashes=found)


def new_results(work: Workload, kind: str | None = None) -> Results:
    """The header every results file starts with: what its numbers need to be trusted."""
    c = work.corpus
    return Results(schema=storage.SCHEMA, status="running", created=storage.now(), command=storage.command_line(),
                   config=work.cfg, environment=storage.environment(work.device), kind=kind,
                   corpus=CorpusRecord(
                       source=c.source, tokenizer=c.tokenizer,
                       # the --data file's tokens: the val split is inside it unless it has a file of its own
                       tokens=c.n_tokens + (work.val.n_tokens if work.cfg.run.val_data is None else 0),
                       vocab_size=c.vocab_size, train_tokens=c.n_tokens, val_tokens=work.val.n_tokens,
                       val_from=work.split.val_from),
                   model=SavedModel.of(work.cfg.run.preset, work.params, work.matmul_params, work.model.record()),
                   schedule=work.schedule.describe())


def free_device_memory(device: torch.device) -> None:
    """Forget compiled code, then hand the freed memory back: the next rung compiles its own (cold in dynamo),
    and the memory pools of the CUDA graphs it held are released before the cache is emptied, not a rung later."""
    gc.collect()
    torch.compiler.reset()
    devicemem.return_host_memory()  # between rungs, untimed: what the last one freed goes back to the system
    if device.type == "cuda":
        torch.cuda.empty_cache()
