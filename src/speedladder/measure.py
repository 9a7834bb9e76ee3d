"""Timing windows, memory, FLOPs, MFU and verdicts: every derived figure is computed here.

The rules (docs/measurement.md, rules 1-4): compilation and warm-up stay outside the timed windows
and are reported apart; the device is synchronized at window edges only; at
least three windows, every window's time kept; tokens/s is end-to-end (batch
fetch and host-to-device copy included); a window in which anything compiled
is flagged and left out of the statistics.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

Step = Callable[[], torch.Tensor]  # one whole training step, batch fetch included; returns the loss


def sync(device: torch.device) -> None:
    """Wait for the device's queued work: only ever at a window's edge."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def compile_count() -> int:
    """Graphs compiled so far in this process (dynamo's own counter; private, so read in one place)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def compile_cache_hits() -> int:
    """Compiled graphs served from inductor's and AOTAutograd's caches (on disk across runs): a warm compile."""
    from torch._dynamo.utils import counters

    return int(counters["inductor"]["fxgraph_cache_hit"] + counters["aot_autograd"]["autograd_cache_hit"])


@dataclass
class Window:
    seconds: float
    steps: int
    tokens: int
    recompiles: int  # graphs compiled while this window ran; any makes the window invalid

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

    @property
    def clean_windows(self) -> list[Window]:
        return [w for w in self.windows if w.recompiles == 0]


def run_windows(step: Step, device: torch.device, tokens_per_step: int, steps: int, windows: int,
                warmup: int, max_warmup: int, counter: Callable[[], int] = compile_count,
                on_progress: Callable[[str], None] = lambda msg: None,
                edge: Callable[[], None] | None = None) -> Timing:
    """Warm up until nothing compiles for `warmup` steps in a row, then time `windows` windows.

    `edge` runs at every window edge (default: synchronize the device); a
    data-parallel job also waits there for every rank, so its windows line up.
    """
    edge = edge or (lambda: sync(device))
    hits = compile_cache_hits()
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
        c0 = counter()
        t0 = time.perf_counter()
        step()
        edge()
        timing.warmup_step_s.append(time.perf_counter() - t0)
        compiled = counter() != c0
        timing.warmup_compiled.append(compiled)
        quiet = 0 if compiled else quiet + 1
    timing.cache_hits = compile_cache_hits() - hits
    for i in range(windows):
        c0 = counter()
        edge()
        t0 = time.perf_counter()
        for _ in range(steps):
            step()  # no host sync in here: the loss stays a device tensor
        edge()
        seconds = time.perf_counter() - t0
        window = Window(seconds, steps, steps * tokens_per_step, counter() - c0)
        timing.windows.append(window)
        flag = f", {window.recompiles} recompile(s): window invalid" if window.recompiles else ""
        on_progress(f"window {i + 1}/{windows}: {window.tokens_per_s:,.0f} tokens/s{flag}")
    return timing


def stepper(train_step: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
            batches: Iterator[tuple[torch.Tensor, torch.Tensor]]) -> Step:
    """Bind a training step to its batch stream: fetching and copying the batch is part of the step."""
    return lambda: train_step(*next(batches))


@dataclass
class Spread:
    median: float
    min: float
    max: float

    @property
    def rel_spread(self) -> float:
        return (self.max - self.min) / self.median if self.median else 0.0


def tokens_per_s(timing: Timing) -> Spread | None:
    rates = [w.tokens_per_s for w in timing.clean_windows]
    if not rates:
        return None
    return Spread(statistics.median(rates), min(rates), max(rates))


def step_ms(timing: Timing) -> float | None:
    per_step = [w.seconds / w.steps for w in timing.clean_windows]
    return 1e3 * statistics.median(per_step) if per_step else None


def compile_seconds(timing: Timing, median_step_s: float) -> float:
    """Time spent compiling: what the compiling steps took beyond a steady step."""
    total = timing.first_step_s - median_step_s
    for seconds, compiled in zip(timing.warmup_step_s, timing.warmup_compiled):
        if compiled:
            total += seconds - median_step_s
    return max(total, 0.0)


def flops_per_token(matmul_params: int, n_layer: int, n_head: int, head_dim: int, seq_len: int) -> int:
    """Training FLOPs per token, PaLM's convention (Chowdhery et al. 2022, appendix B): 6N + 12*L*H*Q*T.

    6N: forward (2N) and backward (4N) through the weight matmuls; 12LHQT: the
    attention scores and their weighted sum, forward and backward, no credit
    taken for the causal mask. Recomputation (checkpointing) is not counted:
    MFU counts useful work only.
    """
    return 6 * matmul_params + 12 * n_layer * n_head * head_dim * seq_len


# Dense peak TFLOP/s from vendors' datasheets, by precision of the matmuls.
# Matched by substring of torch.cuda.get_device_name(); the first match wins, so
# specific names come first. A device not here gets no MFU (shown "n/a"), never a guess.
PEAK_TFLOPS: tuple[tuple[str, dict[str, float]], ...] = (
    # fp8: the dense float8 tensor-core peak (datasheets quote twice that, with sparsity); A100 has none.
    ("H100 PCIe", {"fp8": 1513.0, "bf16": 756.0, "tf32": 378.0, "fp32": 51.0}),
    ("H100", {"fp8": 1978.9, "bf16": 989.4, "tf32": 494.7, "fp32": 66.9}),  # SXM
    ("H200", {"fp8": 1978.9, "bf16": 989.4, "tf32": 494.7, "fp32": 66.9}),  # same chip as H100 SXM
    ("A100", {"bf16": 312.0, "tf32": 156.0, "fp32": 19.5}),
    ("L40S", {"fp8": 733.0, "bf16": 362.0, "tf32": 183.0, "fp32": 91.6}),
    ("L4", {"fp8": 242.5, "bf16": 121.0, "tf32": 60.0, "fp32": 30.3}),
)


def peak_tflops(device_name: str, precision: str) -> float | None:
    for key, table in PEAK_TFLOPS:
        if key in device_name:
            return table.get(precision)
    return None


def mfu(tokens_s: float, flops_token: int, peak: float | None) -> float | None:
    """Model FLOPs utilization: achieved useful FLOP/s over the device's peak; None if the peak is unknown."""
    if peak is None:
        return None
    return tokens_s * flops_token / (peak * 1e12)


def verdict(rung: Spread, base: Spread) -> str:
    """win / loss only when the windows' ranges do not overlap; otherwise the change is noise."""
    if rung.min > base.max:
        return "win"
    if rung.max < base.min:
        return "loss"
    return "noise"


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory(device: torch.device) -> int | None:
    """Peak bytes allocated on the device; None where the device does not report it (CPU, MPS)."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return None
