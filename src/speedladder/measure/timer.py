"""Timing windows, memory, FLOPs, MFU and verdicts: every derived figure is computed here.

The rules (docs/measurement.md, rules 1-4): compilation and warm-up stay outside the timed windows
and are reported apart; the device is synchronized at window edges only; at
least three windows, every window's time kept; tokens/s is end-to-end (batch
fetch and host-to-device copy included); a window in which anything compiled
is flagged and left out of the statistics.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import re
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

Step = Callable[[], torch.Tensor]  # one whole training step, batch fetch included; returns the loss


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return getattr(ctypes.CDLL(None), "malloc_trim", None)  # glibc; None on other C libraries
    except OSError:
        return None


_TRIM = _malloc_trim()


def return_host_memory() -> None:
    """Hand the host allocator's free memory back to the system (glibc's malloc_trim), outside timed work only.

    glibc keeps what a step frees (a logits tensor of tens of MB is freed every step) on its free lists: over a
    few hundred untimed steps (the learns-check) the resident set grew by GBs on a 1B-token file with a 50k
    vocabulary, memory nothing used. Never called inside or between timed windows: memory handed back is
    faulted in again by the next step, which would then be timed paying for it. No gc.collect here: a step's
    tensors are freed by reference counting, and a full collection costs ~15 ms, which every fifth step of a
    curve would pay.
    """
    if _TRIM is not None:
        _TRIM(0)


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


@contextlib.contextmanager
def graph_recordings() -> Iterator[Callable[[], int]]:
    """While open, counts the CUDA graphs that cudagraph trees record (at run time, after the compile).

    Dynamo runs its compile callbacks with the trigger CUDAGRAPH_RECORDING around each recording (private API,
    read in this one place; torch.compiler.reset() clears the callbacks, so one is registered per use). Where
    torch has no such trigger, nothing is counted.
    """
    from torch._dynamo import callback

    count = [0]
    trigger = getattr(getattr(callback, "CallbackTrigger", None), "CUDAGRAPH_RECORDING", None)

    def on_start(event: object) -> None:
        if trigger is not None and getattr(event, "callback_trigger", None) is trigger:
            count[0] += 1

    handler = callback.callback_handler
    handler.register_start_callback(on_start)
    try:
        yield lambda: count[0]
    finally:
        if on_start in handler.start_callbacks:
            handler.remove_start_callback(on_start)


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
    # Whether that warm-up step recorded CUDA graphs (cudagraph trees record after the compile, at run time):
    # part of compile s, like a step that compiled. Empty where nothing was counted.
    warmup_recorded: list[bool] = field(default_factory=list)
    # The window length (docs/measurement.md, rule 4): the steps each window ran, and on CUDA the step time they
    # were sized from so that a window lasts at least min_window_s (None where the configured steps were kept).
    window_steps: int | None = None
    sized_from_step_s: float | None = None
    min_window_s: float | None = None

    @property
    def steady_warmup_s(self) -> list[float]:
        """The warm-up steps that neither compiled nor recorded graphs: steady steps, each synchronized alone."""
        recorded = self.warmup_recorded or [False] * len(self.warmup_step_s)
        return [s for s, c, r in zip(self.warmup_step_s, self.warmup_compiled, recorded) if not (c or r)]

    @property
    def clean_windows(self) -> list[Window]:
        return [w for w in self.windows if w.recompiles == 0]


def warm_up(step: Step, device: torch.device, warmup: int, max_warmup: int,
            counter: Callable[[], int] = compile_count, on_progress: Callable[[str], None] = lambda msg: None,
            edge: Callable[[], None] | None = None, recordings: Callable[[], int] | None = None) -> Timing:
    """The first step, then steps until nothing compiles for `warmup` steps in a row (rule 2): no window yet.

    `recordings` counts CUDA graphs recorded so far (graph_recordings): a step that recorded is not yet
    steady either, and its time is compile time.
    """
    edge = edge or (lambda: sync(device))
    recorded = recordings or (lambda: 0)
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
    timing.cache_hits = compile_cache_hits() - hits
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
                counter: Callable[[], int] = compile_count, edge: Callable[[], None] | None = None) -> Window:
    """One timed window: synchronized at its two edges only, every compile inside it counted (rules 1 and 3)."""
    edge = edge or (lambda: sync(device))
    c0 = counter()
    edge()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()  # no host sync in here: the loss stays a device tensor
    edge()
    seconds = time.perf_counter() - t0
    return Window(seconds, steps, steps * tokens_per_step, counter() - c0)


def window_line(window: Window, i: int, n: int, who: str = "") -> str:
    flag = f", {window.recompiles} recompile(s): window invalid" if window.recompiles else ""
    return f"{who}window {i + 1}/{n}: {window.tokens_per_s:,.0f} tokens/s{flag}"


def interleave(step: Step, base: Step, timing: Timing, base_timing: Timing, device: torch.device,
               tokens_per_step: int, base_tokens_per_step: int, steps: int, windows: int,
               counter: Callable[[], int] = compile_count, on_progress: Callable[[str], None] = lambda msg: None) -> None:
    """The windows of a rung and of its base (both warmed up), interleaved A B B A A B ... (rule 8).

    Drift of the machine (heat, another process, clocks) during the
    measurement lands on both sides alike, inside the comparison, instead of
    between two measurements minutes apart; the ABBA order also keeps a steady
    drift from favouring either side.
    """
    sides = ((step, timing, tokens_per_step, ""), (base, base_timing, base_tokens_per_step, "base "))
    for i in range(windows):
        for fn, t, tps, who in (sides if i % 2 == 0 else sides[::-1]):
            t.windows.append(time_window(fn, device, tps, steps, counter))
            on_progress(window_line(t.windows[-1], i, windows, who))


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
    """Time spent compiling: what the compiling steps took beyond a steady step, the steps that recorded CUDA
    graphs counted with them."""
    total = timing.first_step_s - median_step_s
    recorded = timing.warmup_recorded or [False] * len(timing.warmup_step_s)
    for seconds, compiled, rec in zip(timing.warmup_step_s, timing.warmup_compiled, recorded):
        if compiled or rec:
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


# Dense peak TFLOP/s from the vendors' datasheets (with sparsity they quote twice these), by matmul precision.
# A device is named by torch.cuda.get_device_name(); `device_model` maps that name to one of these keys by its
# words, exactly (an "L40" is not an "L4"; an "H100 NVL" is not an SXM). A device not here has no MFU ("n/a").
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "H100 SXM": {"fp8": 1978.9, "bf16": 989.4, "tf32": 494.7, "fp32": 66.9},
    "H100 PCIe": {"fp8": 1513.0, "bf16": 756.0, "tf32": 378.0, "fp32": 51.2},
    "H100 NVL": {"fp8": 1670.5, "bf16": 835.5, "tf32": 417.5, "fp32": 60.0},
    "H200 SXM": {"fp8": 1978.9, "bf16": 989.4, "tf32": 494.7, "fp32": 66.9},  # the H100 SXM's chip, more memory
    "H200 NVL": {"fp8": 1670.5, "bf16": 835.5, "tf32": 417.5, "fp32": 60.0},
    "A100": {"bf16": 312.0, "tf32": 156.0, "fp32": 19.5},  # 40 GB and 80 GB, SXM and PCIe alike; no fp8
    "L40S": {"fp8": 733.0, "bf16": 362.0, "tf32": 183.0, "fp32": 91.6},
    "L40": {"fp8": 362.0, "bf16": 181.0, "tf32": 90.5, "fp32": 90.5},
    "L4": {"fp8": 242.5, "bf16": 121.0, "tf32": 60.0, "fp32": 30.3},
}


def device_model(device_name: str) -> str | None:
    """The PEAK_TFLOPS key of a CUDA device name, matched word by word; None for a device not in the table.

    Names as torch reports them: "NVIDIA H100 80GB HBM3" (SXM), "NVIDIA H100 PCIe", "NVIDIA H100 NVL",
    "NVIDIA H200", "NVIDIA H200 NVL", "NVIDIA A100-SXM4-40GB", "NVIDIA A100 80GB PCIe", "NVIDIA L40S", ...
    """
    words = set(re.split(r"[\s\-_]+", device_name.upper()))
    for chip in ("H100", "H200"):
        if chip in words:
            return f"{chip} NVL" if "NVL" in words else f"{chip} PCIe" if "PCIE" in words else f"{chip} SXM"
    return next((key for key in ("A100", "L40S", "L40", "L4") if key in words), None)


def peak_tflops(device_name: str, precision: str) -> float | None:
    model = device_model(device_name)
    return PEAK_TFLOPS[model].get(precision) if model else None


def peak_for(override: dict[str, float] | None, device_name: str, device_type: str, precision: str) -> float | None:
    """The peak an MFU is taken against: --peak-tflops for this precision if given, else the table's (CUDA only)."""
    if override:
        return override.get(precision)
    return peak_tflops(device_name, precision) if device_type == "cuda" else None


def blended_peak(flops: dict[str, float], peaks: dict[str, float | None]) -> float | None:
    """The peak of a step whose FLOPs run at several precisions: the FLOP-weighted harmonic blend.

    At each precision's peak, F_p FLOPs take F_p / P_p seconds; the whole step's F = sum F_p FLOPs at best take
    the sum of those, so its peak is F / sum(F_p / P_p). An fp8 rung runs the block linears in fp8 and the head
    and attention in bf16: its MFU is taken against this, not against fp8's peak. None if a peak is unknown.
    """
    used = {p: f for p, f in flops.items() if f > 0}
    if not used or any(peaks.get(p) is None for p in used):
        return None
    return sum(used.values()) / sum(f / peaks[p] for p, f in used.items())  # type: ignore[operator]


def mfu(tokens_s: float, flops_token: int, peak: float | None) -> float | None:
    """Model FLOPs utilization: achieved useful FLOP/s over the device's peak; None if the peak is unknown."""
    if peak is None:
        return None
    return tokens_s * flops_token / (peak * 1e12)


MIN_CLEAN_WINDOWS = 3  # a verdict needs at least this many clean windows on each side


def verdict(rung: Spread, base: Spread) -> str:
    """win / loss only when the windows' ranges do not overlap; otherwise the change is noise.

    With n windows on each side and no real change, every rung window lands
    above every base window with probability 1 / C(2n, n): 1/252 for n = 5, so
    a false win or loss in 2/252 = 0.8% of rungs (1/10 for n = 3). Interleaving
    the base's windows with the rung's keeps drift between them out of the ranges
    (run_pair); tests/test_verdicts.py checks the rate on synthetic windows.
    """
    if rung.min > base.max:
        return "win"
    if rung.max < base.min:
        return "loss"
    return "noise"


def drift(own: Spread, beside: Spread) -> float | None:
    """A base's tokens/s re-timed beside a rung over its own measurement as a rung, less 1, when the two disagree
    beyond both spreads (their min-max ranges do not overlap): the machine's speed moved between the two
    measurements. None when they agree. The rung's x prev is against the base beside it, so it holds; what does not
    hold is reading absolute tokens/s across rows measured minutes apart."""
    if beside.min > own.max or beside.max < own.min:
        return beside.median / own.median - 1
    return None


def judge(rung: Timing, base: Timing) -> tuple[str, str]:
    """The verdict of a rung against its base timed beside it, and why when there is none to give."""
    r, b = tokens_per_s(rung), tokens_per_s(base)
    short = [f"{who} has {len(t.clean_windows)}" for who, t in (("the rung", rung), ("its base", base))
             if len(t.clean_windows) < MIN_CLEAN_WINDOWS]
    if short or r is None or b is None:
        return "inconclusive", (f"fewer than {MIN_CLEAN_WINDOWS} clean windows: " + " and ".join(short)
                                + " (windows that compiled are left out)")
    return verdict(r, b), ""


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory(device: torch.device) -> int | None:
    """Peak bytes allocated on the device; None where the device does not report it (CPU, MPS)."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return None


def peak_reserved(device: torch.device) -> int | None:
    """Peak bytes the CUDA allocator reserved: CUDA graphs' private pools are reserved whole, and what their
    replays use is never allocated again, so the allocated peak can miss it. None off CUDA."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_reserved(device))
    return None
