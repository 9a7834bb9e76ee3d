"""One race run: a configuration trained from a seed's initial weights and batch order to the target val loss,
on a clock that runs over training steps only (engine.py races them)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

import torch

from speedladder.measure import counters, devicemem, machine_load
from speedladder.models import build
from speedladder.racing.verdicts import at_tokens
from speedladder.records import MachineLoad, RaceEntry, RaceRun, RaceSection
from speedladder.spec import StepSpec
from speedladder.step.train_step import matmul_precision
from speedladder.step.workload import Workload

_WARM_SEED = 1 << 20  # the stream of the untimed step before each run: no race seed draws from it
# A stretch of steps between two looks at the clock lasts about this long at most, where a step is slow: so that the
# runs of a seed take turns finely, and a run stops near its cap, not a whole evaluation interval past it.
STRETCH_S = 1.0


class Stepper(Protocol):
    """What a run trains: a TrainStep in this process, or a step that lives in another (`speedladder judge`'s
    worker), reset, called and evaluated the same way."""

    @property
    def spec(self) -> StepSpec: ...

    def reset(self, weights: dict[str, torch.Tensor] | None = None, updates: int = 0) -> None: ...

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor: ...

    def evaluate(self, x: torch.Tensor, y: torch.Tensor, chunk: int) -> torch.Tensor: ...


@dataclass
class Entrant:
    """A configuration ready to race: its record, its spec and its built (compiled, warmed-up) step."""

    entry: RaceEntry
    spec: StepSpec
    step: Stepper | None


class Clock(Protocol):
    """The race's clock: started before a stretch of training steps, stopped after it (outside every evaluation)."""

    def start(self) -> None: ...

    def stop(self, steps: int, spec: StepSpec) -> float:
        """Seconds the stretch of `steps` steps of `spec` took."""
        ...


class WallClock:
    """Wall time, the device synchronized at both ends of each stretch (docs/measurement.md, rule 3)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._t0 = 0.0

    def start(self) -> None:
        devicemem.sync(self.device)
        self._t0 = time.perf_counter()

    def stop(self, steps: int, spec: StepSpec) -> float:
        devicemem.sync(self.device)
        return time.perf_counter() - self._t0


def cross(run: RaceRun, target: float) -> None:
    """The time, tokens and steps to the target, where the curve's last point is the first at or below it:
    linear between that evaluation and the one before (the raw figures kept as first_eval_*)."""
    i = len(run.curve_val) - 1
    run.first_eval_seconds, run.first_eval_tokens, run.first_eval_steps = (
        run.curve_seconds[i], run.curve_tokens[i], run.curve_steps[i])
    if i == 0:
        run.seconds, run.tokens, run.steps = 0.0, 0.0, 0.0
        return
    v0, v1 = run.curve_val[i - 1], run.curve_val[i]
    assert v0 is not None and v1 is not None and v0 > target >= v1
    f = (v0 - target) / (v0 - v1)
    run.seconds = run.curve_seconds[i - 1] + f * (run.curve_seconds[i] - run.curve_seconds[i - 1])
    run.tokens = run.curve_tokens[i - 1] + f * (run.curve_tokens[i] - run.curve_tokens[i - 1])
    run.steps = run.curve_steps[i - 1] + f * (run.curve_steps[i] - run.curve_steps[i - 1])


def rotated(items: list, i: int) -> list:
    """Seed i's order: the list rotated by i (a cyclic Latin square over the seeds)."""
    k = i % len(items) if items else 0
    return items[k:] + items[:k]


def rung_cap(base: RaceRun, factor: float, given: float | None, race_cap: float | None) -> tuple[float | None, str]:
    """A rung's cap once its base's run of the same seed is done: `factor` times the base's time (at least its clock,
    when it stopped short of the target), never past the `given` cap (--time-cap); the race's cap when the base
    raised before its clock ran. The reason has a {} for the base's name."""
    if base.reached and base.seconds is not None:
        cap, why = factor * base.seconds, f"{factor:g}x {{}}'s time in this seed"
    elif base.train_seconds > 0:
        cap, why = factor * base.train_seconds, f"{factor:g}x {{}}'s clock in this seed (it stopped short)"
    else:
        return race_cap, "the race's time cap ({} raised)"
    return (given, "--time-cap") if given is not None and given <= cap else (cap, why)


@dataclass
class RunInProgress:
    """A run in progress: where it is, and when it would stop. `cap_s` may be set while it runs (a rung's cap, once
    its base's time in the same seed is known)."""

    step: Stepper
    run: RaceRun
    stream: Iterator
    target: float
    cap_s: float | None
    max_steps: int | None
    budget_tokens: int | None
    steps: int = 0
    tokens: int = 0
    clock: float = 0.0
    next_eval: int = 0
    loss: torch.Tensor | float | None = None  # the last step's (a float from a step in another process)
    reached: bool = False
    done: bool = False
    step_hint_s: float = 0.0  # the untimed warm step's wall time: the step time before any is measured
    other_s: float = 0.0  # other processes' CPU seconds while its clock ran, and the wall seconds they were read over
    read_s: float = 0.0


class Runner:
    """Training runs to a target: what a race needs of its workload, its section and its clock.

    A run is resumable (begin, advance, finish), so that the runs of one seed can take turns stretch by stretch,
    the one with the least training time going next: the configurations of a seed then see the machine in the same
    seconds, and a slowdown lands on all of them alike (engine.Race._seed). `train_to` is one run alone.
    """

    work: Workload
    section: RaceSection
    clock: Clock
    meter: machine_load.Meter | None  # other processes' load, read around each stretch (never inside one)
    machine: MachineLoad | None  # ... and what it found, for the header (results.machine)
    val_x: torch.Tensor
    val_y: torch.Tensor
    _inits: dict[int, dict[str, torch.Tensor]]

    def _init(self, seed: int) -> dict[str, torch.Tensor]:
        if seed not in self._inits:
            self._inits[seed] = build.initial_state(self.work.model, seed)
        return self._inits[seed]

    def _evaluate(self, step: Stepper) -> float:
        return float(step.evaluate(self.val_x, self.val_y, self.work.cfg.batch_size))

    def _stream(self, step: Stepper, seed: int) -> Iterator:
        """A run's batches: the seed's order at the step's shape."""
        return self.work.stream(step.spec, seed=seed)

    def _steps(self, g: RunInProgress, n: int) -> torch.Tensor | float:
        """n training steps of a run, on the clock (advance starts and stops it); the last step's loss."""
        loss: torch.Tensor | float = 0.0
        for _ in range(n):
            loss = g.step(*next(g.stream))
        return loss

    def _warm(self, step: Stepper, init: dict[str, torch.Tensor]) -> float:
        """One untimed step on a stream no run draws from, then the weights and optimizer back: after memory was
        handed back to the system (devicemem.return_host_memory, before it), the pages the steps use are faulted in
        here, not on the clock. Its wall time (an overestimate of a step's) sizes the run's first stretch."""
        t0 = time.perf_counter()
        with matmul_precision(step.spec):
            step(*next(self.work.stream(step.spec, seed=_WARM_SEED)))
        devicemem.sync(self.work.device)
        wall = time.perf_counter() - t0
        step.reset(init)
        return wall

    def begin(self, step: Stepper, seed: int, target: float, cap_s: float | None = None,
              max_steps: int | None = None, budget_tokens: int | None = None) -> RunInProgress:
        """A run from a seed's initial weights and batch order, warmed up off the clock and evaluated at step 0."""
        init = self._init(seed)
        step.reset(init)
        hint = self._warm(step, init)
        g = RunInProgress(step, RaceRun(seed=seed, stopped=""), self._stream(step, seed), target, cap_s,
                  max_steps, budget_tokens, next_eval=self.section.eval_tokens, step_hint_s=hint or 0.0)
        with matmul_precision(step.spec):
            self._check(g, self._point(g.run, step, None, 0, 0, 0.0))
        return g

    def advance(self, g: RunInProgress) -> None:
        """One stretch of training steps towards the next evaluation (the clock running), then, if it got there,
        the evaluation. A stretch is cut to about STRETCH_S of the run's own step time so far."""
        spec = g.step.spec
        tps = spec.tokens_per_step
        n = max(1, math.ceil((g.next_eval - g.tokens) / tps))
        if g.max_steps is not None:
            n = min(n, g.max_steps - g.steps)
        step_s = g.clock / g.steps if g.steps and g.clock > 0 else g.step_hint_s
        if step_s > 0:
            n = min(n, max(1, int(STRETCH_S / step_s)))
        with matmul_precision(spec):
            c0 = counters.compile_count()
            before = self.meter.read() if self.meter is not None else None
            self.clock.start()
            g.loss = self._steps(g, n)
            g.clock += self.clock.stop(n, spec)
            if self.meter is not None and before is not None:
                other = self.meter.between(before, self.meter.read())
                g.other_s, g.read_s = g.other_s + other.seconds, g.read_s + other.wall
            g.run.recompiles += counters.compile_count() - c0
            g.steps, g.tokens = g.steps + n, g.tokens + n * tps
            if g.tokens < g.next_eval and not (g.max_steps is not None and g.steps >= g.max_steps):
                if g.cap_s is not None and g.clock >= g.cap_s:  # between evaluations: only the cap can stop it
                    g.run.stopped, g.done = "time cap", True
                return
            while g.next_eval <= g.tokens:
                g.next_eval += self.section.eval_tokens
            self._check(g, self._point(g.run, g.step, g.loss, g.steps, g.tokens, g.clock))

    def _check(self, g: RunInProgress, v: float) -> None:
        """Whether the run is done after the evaluation that gave v: diverged, reached (and past the budget), at its
        cap, or at its steps."""
        r = g.run
        if not math.isfinite(v):
            r.stopped, g.done = "diverged", True
            return
        if not g.reached and v <= g.target:
            g.reached = True
            cross(r, g.target)
        if g.reached and (g.budget_tokens is None or g.tokens >= g.budget_tokens):
            g.done = True
        elif g.cap_s is not None and g.clock >= g.cap_s:
            r.stopped, g.done = "time cap", True
        elif g.max_steps is not None and g.steps >= g.max_steps:
            r.stopped, g.done = "steps", True

    def finish(self, g: RunInProgress, say: Callable[[str], None] = lambda m: None) -> RaceRun:
        """The run's record, once it is done (or stopped where it is)."""
        r = g.run
        if g.reached:
            r.stopped = "reached"
        r.train_seconds, r.train_tokens, r.train_steps = g.clock, g.tokens, g.steps
        if g.read_s > 0 and self.meter is not None:  # judged over the whole run: a stretch can be under a tick
            r.other_cores, r.shared = g.other_s / g.read_s, machine_load.shared(g.other_s, g.read_s, self.meter.cores)
        if g.budget_tokens:
            b = at_tokens(r, g.budget_tokens)
            r.budget_loss = b if b is not None and math.isfinite(b) else None
        say(f"seed {r.seed}: " + (f"reached {g.target:.3f} at {r.seconds:.2f} s (step {r.steps:,.1f}, "
                                  f"{r.tokens:,.0f} tokens)" if r.reached else
                                  f"{r.stopped} after {g.clock:.2f} s; best {r.best_loss:.3f} at "
                                  f"{r.best_seconds:.2f} s ({r.best_tokens:,} tokens)" if r.best_loss is not None
                                  else f"{r.stopped}"))
        return r

    def snapshot(self) -> machine_load.Snapshot | None:
        """The other processes' CPU time so far, to name them if a run that follows shares the machine."""
        return self.meter.snapshot() if self.meter is not None else None

    def note_load(self, runs: list[RaceRun], first: machine_load.Snapshot | None) -> None:
        """Runs that ended into the record of the machine's load; the busiest other processes since `first` named
        when one of them shared the machine."""
        read = [r for r in runs if r.other_cores is not None]
        if self.machine is None or self.meter is None or not read:
            return
        self.machine.add([r.other_cores or 0.0 for r in read], [r.shared for r in read], runs=True)
        if first is not None and any(r.shared for r in read):
            self.machine.name(self.meter.busiest(first, self.meter.snapshot()))

    def train_to(self, step: Stepper, seed: int, target: float, cap_s: float | None,
                 max_steps: int | None = None, say: Callable[[str], None] = lambda m: None,
                 budget_tokens: int | None = None) -> RaceRun:
        """One run alone: until the val loss is at or below `target` and `budget_tokens` are trained; or until the
        clock passes `cap_s`, `max_steps` are done, or the loss is not finite."""
        devicemem.return_host_memory()  # before the warm step: what the last run freed goes back to the system
        g = self.begin(step, seed, target, cap_s, max_steps, budget_tokens)
        while not g.done:
            self.advance(g)
        return self.finish(g, say)

    def _point(self, run: RaceRun, step: Stepper, loss: torch.Tensor | float | None, steps: int, tokens: int,
               clock: float) -> float:
        """Evaluate (the clock is stopped) and add the point to the run's curve; the val loss."""
        t0 = time.perf_counter()
        v = self._evaluate(step)
        train = float(loss) if loss is not None else None  # read here, where the clock is stopped
        run.eval_seconds += time.perf_counter() - t0
        finite = math.isfinite(v)
        run.curve_steps.append(steps)
        run.curve_tokens.append(tokens)
        run.curve_seconds.append(clock)
        run.curve_val.append(v if finite else None)
        run.curve_train.append(train if train is not None and math.isfinite(train) else None)
        if finite and (run.best_loss is None or v < run.best_loss):
            run.best_loss, run.best_seconds, run.best_tokens = v, clock, tokens
        return v
