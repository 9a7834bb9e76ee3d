"""One workload: the model, the corpus and its batches, the initial weights, and one way to measure a spec.

Every command that trains (run, profile, tune, train, predict, ddp and each
torchrun rank) builds its steps and batch streams here, and every timed
measurement of a spec goes through `measure_spec`, so the rules of
docs/measurement.md are applied in one place.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import statistics
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
from speedladder.measure import counters, devicemem, judging, machine_load, timer
from speedladder.models import build
from speedladder.models.definition import ModelDef
from speedladder.progress import task_of
from speedladder.records import CorpusRecord, MachineLoad, Results, SavedModel, storage
from speedladder.rungs import RUNGS, Env, env_for
from speedladder.rungs import files as rung_files
from speedladder.spec import StepSpec
from speedladder.step.schedule import Schedule, Span, race_length, schedule_of
from speedladder.step.train_step import TrainStep, matmul_precision

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


@dataclass
class Measurement:
    """A spec's timed windows and what is derived from them (docs/measurement.md, rules 1-4 and 8)."""

    timing: timer.Timing
    tokens_per_s: judging.Spread
    step_ms: float
    compile_s: float | None  # None for an uncompiled step
    peak_memory_bytes: int | None  # None where the device does not report it
    warnings: list[str] = field(default_factory=list)
    base_timing: timer.Timing | None = None  # the base re-timed beside it, windows interleaved
    base_tokens_per_s: judging.Spread | None = None
    peak_reserved_bytes: int | None = None  # the allocator's reserved peak (CUDA graphs' pools are reserved)
    # The other processes that used most CPU from the first window to the last, when one of them was shared.
    others: list[machine_load.Busy] = field(default_factory=list)
    # What the process held when the peaks were reset (None where the device reports no peaks): both peaks are over
    # it, so that they belong to this spec's step alone.
    held: devicemem.Held | None = None

    @property
    def held_before_bytes(self) -> int | None:
        return self.held.allocated if self.held is not None else None


def read_machine_load(meter: machine_load.Meter, say: Callable[[str], None]) -> MachineLoad:
    """The machine's load before anything runs: the others' over a short sample (this process asleep), and the load
    average, on this process's cores, said when others are busy; the windows add to it as they are timed."""
    before, loadavg = meter.before(), meter.loadavg()
    if before.shared:
        say(f"machine not alone: other processes use {before.cores:.2f} of {meter.cores} cores"
            + (f" (load average {loadavg:.2f})" if loadavg is not None else "")
            + "; each timed window reads what they use beside it")
    return MachineLoad(cores=meter.cores, shared_cores=meter.shared_cores, before=before.cores, loadavg=loadavg,
                       steal_before=before.steal_cores)


def note_load(machine: MachineLoad | None, m: Measurement) -> None:
    """A measurement's windows (the rung's and its base's beside it) and the other processes named, into the run's
    record of the machine's load."""
    windows = [w for w in m.timing.windows + (m.base_timing.windows if m.base_timing else [])
               if w.other_cores is not None]
    if machine is not None and windows:
        machine.add([w.other_cores or 0.0 for w in windows], [w.shared for w in windows],
                    steal=[w.steal_cores or 0.0 for w in windows])
        machine.name(m.others)


def _in_precision(spec: StepSpec, fn: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
    """A step run under its own matmul precision, so a rung and its base can take turns (TF32 is global state)."""
    def run() -> torch.Tensor:
        with matmul_precision(spec):
            return fn()
    return run


def sized_windows(device: torch.device, size: bool | None) -> bool:
    """Whether windows are sized from a timed step: on CUDA by default, where a preset's steps can last
    milliseconds; a CPU or MPS keeps the configured steps (its presets' windows already last 0.25-1 s)."""
    return device.type == "cuda" if size is None else size


def _window_steps(work: Workload, timings: list[timer.Timing], size: bool,
                  agree: Callable[[int], int]) -> int:
    """Steps per window for a rung (and its base beside it), recorded on each timing; `agree` makes every rank
    of a data-parallel job take the same count (the largest)."""
    t = work.cfg.run.timing
    min_s = t.min_window_s if size else 0.0
    step_s = timer.sizing_step_s(*timings) if size else None
    steps = agree(timer.window_steps(work.cfg.steps, step_s, min_s))
    for timing in timings:
        timing.window_steps = steps
        timing.sized_from_step_s, timing.min_window_s = (step_s, min_s) if size else (None, None)
    return steps


def _window_warnings(timing: timer.Timing, max_warmup: int) -> list[str]:
    out = []
    if not timing.settled:
        out.append(f"still compiling after {max_warmup} warm-up steps")
    if len(timing.clean_windows) < len(timing.windows):
        out.append(f"{len(timing.windows) - len(timing.clean_windows)} window(s) recompiled and were left out")
    seconds = [w.seconds for w in timing.clean_windows]
    if timing.min_window_s and seconds and statistics.median(seconds) < timing.min_window_s / 2:
        out.append(f"windows lasted {statistics.median(seconds):.2f} s, under half the {timing.min_window_s:g} s "
                   "they were sized for: a warm-up step, synchronized alone, overstated the step")
    return out


def _alone(window: Callable[[], timer.Window], timing: timer.Timing, windows: int, say: Callable[[str], None]) -> None:
    """A spec's windows with no base beside it, each said as it ends."""
    for i in range(windows):
        timing.windows.append(window())
        say(timer.window_line(timing.windows[-1], i, windows))


def _interleave(beside: Callable[..., None], timing: timer.Timing, base_timing: timer.Timing, windows: int,
                short_below: float | None, say: Callable[[str], None]) -> None:
    """The rung's windows and its base's, interleaved. With `short_below` (a rung predicted below that ratio to its
    base), one window of each first: a rung that measures below it stops there, its timing marked short; one that
    surprises gets the rest of its windows (docs/measurement.md, rule 4)."""
    done = 0
    if short_below is not None:
        beside(windows=1)
        done = 1
        ratio = timing.windows[-1].tokens_per_s / base_timing.windows[-1].tokens_per_s
        if timing.windows[-1].recompiles == 0 and ratio < short_below:
            timing.short = True
            say(f"one short window: {ratio:.2f}x its base, below {short_below:g}x as predicted: stopped there")
            return
        say(f"one short window: {ratio:.2f}x its base, not below {short_below:g}x as predicted: timed in full")
    beside(windows=windows - done, start=done)


def _others(meter: machine_load.Meter | None, first: machine_load.Snapshot | None, windows: list[timer.Window]) -> list[machine_load.Busy]:
    """The busiest other processes since the snapshot before the first window, when a window was shared."""
    if meter is None or first is None or not any(w.shared for w in windows):
        return []
    return meter.busiest(first, meter.snapshot())


def measure_spec(work: Workload, spec: StepSpec, say: Callable[[str], None], *, base: StepSpec | None = None,
                 step: TrainStep | None = None, stream: BatchStream | None = None,
                 counter: Callable[[], int] = counters.compile_count, edge: Callable[[], None] | None = None,
                 world: int = 1, size_windows: bool | None = None,
                 agree: Callable[[int], int] = lambda n: n, meter: machine_load.Meter | None = None,
                 compile_estimate_s: float | None = None, short_below: float | None = None
                 ) -> tuple[Measurement, TrainStep]:
    """Build (unless given), warm up and time one spec with the run's windows; the step is returned for the gates.

    With `base`, the base spec is built too and its windows interleaved with the spec's (timer.interleave), so the
    comparison carries no drift. `world` processes each do spec.tokens_per_step a step (a data-parallel job counts
    every rank's tokens); `counter`, `edge` and `agree` let such a job agree on its warm-up, line its windows up
    across ranks and take one window length. On CUDA (or with `size_windows`) the steps per window come from the
    warm-up's steady steps, so that a window lasts at least min_window_s. With a `meter` the machine's load is read
    at each window's edges (load.py). A compiled warm-up is shown as a task while it runs (against
    `compile_estimate_s`), its ticker stopped before the first window. `short_below`: see _interleave.
    """
    t = work.cfg.run.timing
    device = step.device if step is not None else work.device
    size = sized_windows(device, size_windows)
    held = devicemem.reset_peak_memory(device)
    say("building" + (" and compiling (first step)" if spec.compile else "")
        + (", with its base re-timed beside it" if base is not None else ""))
    step = step or work.step(spec)
    run = _in_precision(spec, timer.stepper(step, stream or work.stream(spec)))
    with counters.graph_recordings() as recorded:
        rec = recorded if spec.cudagraphs else None
        with task_of(say, "the first step (it compiles) and the warm-up", estimate_s=compile_estimate_s,
                     shown=spec.compile):
            timing = timer.warm_up(run, device, work.cfg.warmup, t.max_warmup, counter, say, edge, rec)
        peak, reserved = devicemem.peak_memory(device, held), devicemem.peak_reserved(device, held)  # before its base
        base_timing = None
        if base is None:
            steps = _window_steps(work, [timing], size, agree)
            first = meter.snapshot() if meter is not None else None
            _alone(functools.partial(timer.time_window, run, device, world * spec.tokens_per_step, steps, counter,
                                     edge, meter=meter), timing, t.windows, say)
        else:
            base_step = work.step(base)
            base_run = _in_precision(base, timer.stepper(base_step, work.stream(base)))
            with task_of(say, "base: the first step (it compiles) and the warm-up", shown=base.compile):
                base_timing = timer.warm_up(base_run, device, work.cfg.warmup, t.max_warmup, counter,
                                              lambda m: say("base: " + m), None, recorded if base.cudagraphs else None)
            steps = _window_steps(work, [timing, base_timing], size, agree)
            first = meter.snapshot() if meter is not None else None
            _interleave(functools.partial(timer.interleave, run, base_run, timing, base_timing, device,
                                          spec.tokens_per_step, base.tokens_per_step, steps, counter=counter,
                                          on_progress=say, meter=meter), timing, base_timing, t.windows, short_below, say)
            del base_step, base_run
    others = _others(meter, first, timing.windows + (base_timing.windows if base_timing is not None else []))
    spread = judging.tokens_per_s(timing)
    if spread is None:
        raise RuntimeError("every timed window recompiled: no valid window")
    step_ms = judging.step_ms(timing)
    assert step_ms is not None  # a window that gave tokens/s gave its step time
    m = Measurement(timing, spread, step_ms, timer.compile_seconds(timing, step_ms / 1e3) if spec.compile else None,
                    peak, _window_warnings(timing, t.max_warmup), base_timing,
                    judging.tokens_per_s(base_timing) if base_timing is not None else None,
                    peak_reserved_bytes=reserved, others=others, held=held)
    return m, step
