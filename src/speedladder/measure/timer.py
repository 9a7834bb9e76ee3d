"""Warm-up and timed windows: a step timed as the rules say, a rung's windows interleaved with its base's.

The rules (docs/measurement.md, rules 1-4): compilation and warm-up stay outside the timed windows
and are reported apart; the device is synchronized at window edges only; at
least three windows, every window's time kept; tokens/s is end-to-end (batch
fetch and host-to-device copy included); a window in which anything compiled
is flagged and left out of the statistics.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from speedladder.measure import counters, devicemem, machine_load

Step = Callable[[], torch.Tensor]  # one whole training step, batch fetch included; returns the loss


@dataclass
class Window:
    seconds: float
    steps: int
    tokens: int
    recompiles: int  # graphs compiled while this window ran; any makes the window invalid
    # Other processes' mean cores while it ran, read from /proc at its edges (load.py; None where not read), and
    # whether that shared the machine with it: kept, and said, never left out (the base beside it shares it too).
    other_cores: float | None = None
    shared: bool = False
    steal_cores: float | None = None  # the hypervisor's steal over it, as mean cores (load.py): apart from the others'

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


@dataclass
class Timing:
    first_step_s: float  # the first step alone: compilation, lazy init, allocator growth
    warmup_step_s: list[float]  # every later warm-up step, synchronized one by one
    warmup_compiled: list[bool]  # whether that warm-up step compiled anything
    windows: list[Window] = field(default_factory=list)
    settled: bool = True  # False if compilation never stopped within max_warmup steps
    cache_hits: int = 0  # compiled graphs that came from a cache during warm-up: compile time is a warm one
    # Whether that warm-up step recorded CUDA graphs (cudagraph trees record after the compile, at run time):
    # part of compile s, like a step that compiled. Empty where nothing was counted.
    warmup_recorded: list[bool] = field(default_factory=list)
    # The window length (docs/measurement.md, rule 4): the steps each window ran, and on CUDA the step time they
    # were sized from so that a window lasts at least min_window_s (None where the configured steps were kept).
    window_steps: int | None = None
    sized_from_step_s: float | None = None
    min_window_s: float | None = None
    # One short window beside its base, and no more: a rung predicted far below its base that measured so
    # (docs/measurement.md, rule 4). Its windows claim nothing: fewer than a verdict needs.
    short: bool = False

    @property
    def steady_warmup_s(self) -> list[float]:
        """The warm-up steps that neither compiled nor recorded graphs: steady steps, each synchronized alone."""
        recorded = self.warmup_recorded or [False] * len(self.warmup_step_s)
        return [s for s, c, r in zip(self.warmup_step_s, self.warmup_compiled, recorded) if not (c or r)]

    @property
    def clean_windows(self) -> list[Window]:
        return [w for w in self.windows if w.recompiles == 0]


def warm_up(step: Step, device: torch.device, warmup: int, max_warmup: int,
            counter: Callable[[], int] = counters.compile_count, on_progress: Callable[[str], None] = lambda msg: None,
            edge: Callable[[], None] | None = None, recordings: Callable[[], int] | None = None) -> Timing:
    """The first step, then steps until nothing compiles for `warmup` steps in a row (rule 2): no window yet.

    `recordings` counts CUDA graphs recorded so far (counters.graph_recordings): a step that recorded is not yet
    steady either, and its time is compile time.
    """
    edge = edge or (lambda: devicemem.sync(device))
    recorded = recordings or (lambda: 0)
    hits = counters.compile_cache_hits()
    edge()
    t0 = time.perf_counter()
    step()
    edge()
    timing = Timing(first_step_s=time.perf_counter() - t0, warmup_step_s=[], warmup_compiled=[])
    on_progress(f"first step {timing.first_step_s:.2f}s; warming up")
    quiet = 0
    while quiet < warmup:
        if len(timing.warmup_step_s) >= max_warmup:
            timing.settled = False
            break
        c0, r0 = counter(), recorded()
        t0 = time.perf_counter()
        step()
        edge()
        timing.warmup_step_s.append(time.perf_counter() - t0)
        compiled = counter() != c0
        timing.warmup_compiled.append(compiled)
        if recordings is not None:
            timing.warmup_recorded.append(recorded() != r0)
        quiet = 0 if compiled or (recordings is not None and timing.warmup_recorded[-1]) else quiet + 1
    timing.cache_hits = counters.compile_cache_hits() - hits
    return timing


def window_steps(configured: int, step_s: float | None, min_window_s: float) -> int:
    """Steps per timed window: the configured ones, or more so that a window of steps of `step_s` lasts at
    least `min_window_s` (rule 4: a window this long holds many steps, so the two edge syncs and the first
    launches are a small part of it). No step time, or no minimum: the configured steps."""
    if step_s is None or step_s <= 0 or min_window_s <= 0:
        return configured
    return max(configured, math.ceil(min_window_s / step_s))


def sizing_step_s(*timings: Timing) -> float | None:
    """The step time windows are sized from: the fastest side's median steady warm-up step (a rung and its
    base share one window length, so the faster one's windows are the shortest); its first step when no
    warm-up step was steady (an overestimate: fewer steps, never more)."""
    per_side = [statistics.median(t.steady_warmup_s) if t.steady_warmup_s else t.first_step_s for t in timings]
    return min(per_side) if per_side else None


def time_window(step: Step, device: torch.device, tokens_per_step: int, steps: int,
                counter: Callable[[], int] = counters.compile_count, edge: Callable[[], None] | None = None,
                meter: machine_load.Meter | None = None) -> Window:
    """One timed window: synchronized at its two edges only, every compile inside it counted (rules 1 and 3). With a
    meter, the machine's load is read just outside its edges (load.py): nothing is read inside it."""
    edge = edge or (lambda: devicemem.sync(device))
    c0 = counter()
    before = meter.read() if meter is not None else None
    edge()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()  # no host sync in here: the loss stays a device tensor
    edge()
    seconds = time.perf_counter() - t0
    window = Window(seconds, steps, steps * tokens_per_step, counter() - c0)
    if meter is not None and before is not None:
        other = meter.between(before, meter.read())
        window.other_cores, window.shared, window.steal_cores = other.cores, other.shared, other.steal_cores
    return window


def window_line(window: Window, i: int, n: int, who: str = "") -> str:
    flag = f", {window.recompiles} recompile(s): window invalid" if window.recompiles else ""
    if window.shared and window.other_cores is not None:
        flag += f"; other processes used {window.other_cores:.2f} cores meanwhile"
    return f"{who}window {i + 1}/{n}: {window.tokens_per_s:,.0f} tokens/s{flag}"


def interleave(step: Step, base: Step, timing: Timing, base_timing: Timing, device: torch.device,
               tokens_per_step: int, base_tokens_per_step: int, steps: int, windows: int,
               counter: Callable[[], int] = counters.compile_count, on_progress: Callable[[str], None] = lambda msg: None,
               meter: machine_load.Meter | None = None, start: int = 0) -> None:
    """The windows of a rung and of its base (both warmed up), interleaved A B B A A B ... (rule 8); `start`: the
    windows already timed, whose pattern the new ones continue.

    Drift of the machine (heat, another process, clocks) during the
    measurement lands on both sides alike, inside the comparison, instead of
    between two measurements minutes apart; the ABBA order also keeps a steady
    drift from favouring either side.
    """
    sides = ((step, timing, tokens_per_step, ""), (base, base_timing, base_tokens_per_step, "base "))
    for i in range(start, start + windows):
        for fn, t, tps, who in (sides if i % 2 == 0 else sides[::-1]):
            t.windows.append(time_window(fn, device, tps, steps, counter, meter=meter))
            on_progress(window_line(t.windows[-1], i, start + windows, who))


def stepper(train_step: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
            batches: Iterator[tuple[torch.Tensor, torch.Tensor]]) -> Step:
    """Bind a training step to its batch stream: fetching and copying the batch is part of the step."""
    return lambda: train_step(*next(batches))


def compile_seconds(timing: Timing, median_step_s: float) -> float:
    """Time spent compiling: what the compiling steps took beyond a steady step, the steps that recorded CUDA
    graphs counted with them."""
    total = timing.first_step_s - median_step_s
    recorded = timing.warmup_recorded or [False] * len(timing.warmup_step_s)
    for seconds, compiled, rec in zip(timing.warmup_step_s, timing.warmup_compiled, recorded):
        if compiled or rec:
            total += seconds - median_step_s
    return max(total, 0.0)
