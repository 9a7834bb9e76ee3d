"""How a spec is measured: `measure_spec` warms a rung's step and its base's up and times their windows interleaved,
so the rules of docs/measurement.md are applied in one place; the machine's load read around them.
"""

from __future__ import annotations

import functools
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from speedladder.data.batches import BatchStream
from speedladder.measure import counters, devicemem, judging, machine_load, timer
from speedladder.progress import task_of
from speedladder.records import MachineLoad
from speedladder.spec import StepSpec
from speedladder.step.train_step import TrainStep, matmul_precision
from speedladder.step.workload import Workload


@dataclass(frozen=True)
class Ranks:
    """How the processes of one job time a spec together. A process alone by default (ALONE); a torchrun job's
    ranks are parallel/rank.py's (`job_ranks`): each rank ends its warm-up on the same step, lines its windows up
    and takes one window length, and a window's tokens are the whole job's."""

    world: int = 1  # processes, each doing spec.tokens_per_step a step
    counter: Callable[[], int] = counters.compile_count  # compiles so far: a warm-up ends when it stops rising
    edge: Callable[[], None] | None = None  # called at each window's edges (a job's barrier)
    agree: Callable[[int], int] = lambda n: n  # the steps per window every process takes


ALONE = Ranks()


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
    """Steps per window for a rung (and its base beside it), recorded on each timing; `agree` makes every process
    of a job take the same count (Ranks.agree)."""
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
                 step: TrainStep | None = None, stream: BatchStream | None = None, ranks: Ranks = ALONE,
                 size_windows: bool | None = None, meter: machine_load.Meter | None = None,
                 compile_estimate_s: float | None = None, short_below: float | None = None
                 ) -> tuple[Measurement, TrainStep]:
    """Build (unless given), warm up and time one spec with the run's windows; the step is returned for the gates.

    With `base`, the base spec is built too and its windows interleaved with the spec's (timer.interleave), so the
    comparison carries no drift. `ranks`: a process alone, or one rank of a job (Ranks). On CUDA (or with `size_windows`) the steps per window come from the
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
            timing = timer.warm_up(run, device, work.cfg.warmup, t.max_warmup, ranks.counter, say, ranks.edge, rec)
        peak, reserved = devicemem.peak_memory(device, held), devicemem.peak_reserved(device, held)  # before its base
        base_timing = None
        if base is None:
            steps = _window_steps(work, [timing], size, ranks.agree)
            first = meter.snapshot() if meter is not None else None
            _alone(functools.partial(timer.time_window, run, device, ranks.world * spec.tokens_per_step, steps,
                                     ranks.counter, ranks.edge, meter=meter), timing, t.windows, say)
        else:
            base_step = work.step(base)
            base_run = _in_precision(base, timer.stepper(base_step, work.stream(base)))
            with task_of(say, "base: the first step (it compiles) and the warm-up", shown=base.compile):
                base_timing = timer.warm_up(base_run, device, work.cfg.warmup, t.max_warmup, ranks.counter,
                                              lambda m: say("base: " + m), None, recorded if base.cudagraphs else None)
            steps = _window_steps(work, [timing, base_timing], size, ranks.agree)
            first = meter.snapshot() if meter is not None else None
            _interleave(functools.partial(timer.interleave, run, base_run, timing, base_timing, device,
                                          spec.tokens_per_step, base.tokens_per_step, steps, counter=ranks.counter,
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
