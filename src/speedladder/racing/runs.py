"""One race run: a configuration trained from a seed's initial weights and batch order to the target val loss,
on a clock that runs over training steps only (engine.py races them)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Protocol

import torch

from speedladder import measure, models
from speedladder.racing.verdicts import at_tokens
from speedladder.records import RaceRun, RaceSection
from speedladder.rungs import StepSpec
from speedladder.step import TrainStep, matmul_precision
from speedladder.workload import Workload

_WARM_SEED = 1 << 20  # the stream of the untimed step before each run: no race seed draws from it


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
        measure.sync(self.device)
        self._t0 = time.perf_counter()

    def stop(self, steps: int, spec: StepSpec) -> float:
        measure.sync(self.device)
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


class Runs:
    """Training runs to a target: what a race needs of its workload, its section and its clock."""

    work: Workload
    section: RaceSection
    clock: Clock
    val_x: torch.Tensor
    val_y: torch.Tensor
    _inits: dict[int, dict[str, torch.Tensor]]

    def _init(self, seed: int) -> dict[str, torch.Tensor]:
        if seed not in self._inits:
            self._inits[seed] = models.initial_state(self.work.model, seed)
        return self._inits[seed]

    def _evaluate(self, step: TrainStep) -> float:
        return float(step.evaluate(self.val_x, self.val_y, self.work.cfg.batch_size))

    def _warm(self, step: TrainStep, init: dict[str, torch.Tensor]) -> None:
        """Memory handed back to the system, then one untimed step on a stream no run draws from, then the weights
        and optimizer back: the pages the steps use are faulted in here, not on the clock."""
        measure.return_host_memory()
        with matmul_precision(step.spec):
            step(*next(self.work.stream(step.spec, seed=_WARM_SEED)))
        measure.sync(self.work.device)
        step.reset(init)

    def train_to(self, step: TrainStep, seed: int, target: float, cap_s: float | None,
                 max_steps: int | None = None, say: Callable[[str], None] = lambda m: None,
                 budget_tokens: int | None = None) -> RaceRun:
        """Train from a seed's initial weights and batch order until the val loss is at or below `target` and
        `budget_tokens` are trained; or until the clock passes `cap_s`, `max_steps` are done, or the loss is not
        finite."""
        spec = step.spec
        init = self._init(seed)
        step.reset(init)
        self._warm(step, init)
        stream = self.work.stream(spec, seed=seed)
        run = RaceRun(seed=seed, stopped="")
        interval, tps = self.section.eval_tokens, spec.tokens_per_step
        steps = tokens = 0
        clock = 0.0
        next_eval = interval
        loss: torch.Tensor | None = None
        reached = False
        with matmul_precision(spec):
            v = self._point(run, step, loss, steps, tokens, clock)
            while True:
                if not math.isfinite(v):
                    run.stopped = "diverged"
                    break
                if not reached and v <= target:
                    reached = True
                    cross(run, target)
                if reached and (budget_tokens is None or tokens >= budget_tokens):
                    break
                if cap_s is not None and clock >= cap_s:
                    run.stopped = "time cap"
                    break
                if max_steps is not None and steps >= max_steps:
                    run.stopped = "steps"
                    break
                n = max(1, math.ceil((next_eval - tokens) / tps))
                if max_steps is not None:
                    n = min(n, max_steps - steps)
                c0 = measure.compile_count()
                self.clock.start()
                for _ in range(n):
                    loss = step(*next(stream))
                clock += self.clock.stop(n, spec)
                run.recompiles += measure.compile_count() - c0
                steps, tokens = steps + n, tokens + n * tps
                while next_eval <= tokens:
                    next_eval += interval
                v = self._point(run, step, loss, steps, tokens, clock)
        if reached:
            run.stopped = "reached"
        run.train_seconds = clock
        if budget_tokens:
            b = at_tokens(run, budget_tokens)
            run.budget_loss = b if b is not None and math.isfinite(b) else None
        say(f"seed {seed}: " + (f"reached {target:.3f} at {run.seconds:.2f} s (step {run.steps:,.1f}, "
                                f"{run.tokens:,.0f} tokens)" if run.reached else
                                f"{run.stopped} after {clock:.2f} s; best {run.best_loss:.3f} at "
                                f"{run.best_seconds:.2f} s ({run.best_tokens:,} tokens)" if run.best_loss is not None
                                else f"{run.stopped}"))
        return run

    def _point(self, run: RaceRun, step: TrainStep, loss: torch.Tensor | None, steps: int, tokens: int,
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
