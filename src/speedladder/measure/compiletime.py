"""How long a compiled rung's first step and warm-up should take, said before they run: by compile mode and cache state.

A graph this process has not compiled yet compiles cold: the cold-compile model (`cold_s`), the Python part of a
compile grown by the blocks, weighed by precision and checkpointing, plus the kernel compiler's about fixed part, and
under max-autotune its GEMM autotuning, a fixed cost for each matmul shape; once a cold compile of the same mode is
measured here, the model is scaled by how far that one was off. A graph compiled before in this process (the same
model, transforms, precision, mode and micro-batch: the optimizer is not compiled) comes from inductor's caches on
disk: warm, estimated from the last warm compile measured in this mode (docs/measurement.md, rule 2).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from speedladder.measure.timer import Timing
from speedladder.spec import Capability, StepSpec

DEFAULT = "default"  # torch.compile's mode when none is given
COLD, WARM = "cold", "warm"  # the cache state a compile starts from

# The cold-compile model, cold = F x (a + b x blocks) x p + K (+ autotuning), from bench/plan.txt's comments.
PYTHON_S = 5.3  # a: a cold compile's Python part in fp32, least squares (docs/benchmarks.md#cpu-cold-compile)
PYTHON_S_PER_BLOCK = 2.8  # b: ... and each block's (docs/benchmarks.md#cpu-cold-compile)
WEIGHT = {"bf16": 1.4, "fp16": 1.4}  # p: a half-precision graph against fp32 (docs/benchmarks.md#cpu-cold-compile)
CHECKPOINT_WEIGHT = 1.2  # p: checkpointing's recomputed blocks, times the rest (docs/benchmarks.md#cpu-cold-compile)
FLOAT8_WEIGHT = 1.5  # p: fp8's casts and scales around each block Linear, a lead (bench/plan.txt)
RECORD_S = 1.0  # CUDA graphs recorded in the warm-up (reduce-overhead, max-autotune), a lead (bench/plan.txt)
WARM_S_PER_BLOCK = 0.25  # a warm compile before any is measured here (docs/measurement.md#compile-estimates)
ATTENTION_PRODUCTS = 6  # hand-written attention's batched products, forward and backward (none under SDPA)


@dataclass(frozen=True)
class Host:
    """The cold-compile model's constants where the graph compiles: F, K, and max-autotune's cost a matmul shape."""

    scale: float  # F: this host's Python against the development machine's
    kernels_s: float  # K: the kernel compiler's part, about fixed a graph (the blocks share their kernels)
    more_kernels_s: float  # K for checkpointing's or fp8's graphs, which have more distinct kernels
    autotune_s_per_shape: float | None  # max-autotune's benchmarking of one matmul shape; None: not measured


# F set so that GPT-2 in bf16 compiles in the source text's 26 s, K a lead (docs/measurement.md#compile-estimates).
CUDA = Host(scale=0.4, kernels_s=5.0, more_kernels_s=7.0, autotune_s_per_shape=5.0)
# The development machine itself: K its C++ compiler's calls (docs/benchmarks.md#cpu-cold-compile).
CPU = Host(scale=1.0, kernels_s=39.0, more_kernels_s=39.0, autotune_s_per_shape=None)


def host(device_type: str) -> Host:
    return CUDA if device_type == "cuda" else CPU


def mode(spec: StepSpec) -> str:
    return spec.compile_mode or DEFAULT


def graph(spec: StepSpec) -> StepSpec:
    """What the compiled graph depends on: the optimizer, its learning rate and the accumulation are not compiled,
    and a micro-batch is what one forward sees."""
    return dataclasses.replace(spec, batch_size=spec.micro_batch, accum=1, optimizer="adamw", lr_scale=1.0)


def matmul_shapes(spec: StepSpec, block_linears: int) -> int:
    """The distinct matmul shapes max-autotune benchmarks: each block Linear's and the head's forward, input- and
    weight-gradient products (the blocks share theirs), and hand-written attention's batched products."""
    attention = 0 if Capability.SDPA in spec.transforms else ATTENTION_PRODUCTS
    return 3 * (block_linears + 1) + attention


def cold_s(spec: StepSpec, blocks: int, block_linears: int, on: Host) -> float:
    """The cold-compile model: F x (a + b x blocks) x p + K, plus CUDA graphs' recording and max-autotune's
    benchmarking where the mode has them (a CPU's autotuning, not measured, is left out)."""
    p = WEIGHT.get(spec.autocast or "", 1.0)
    if Capability.CHECKPOINTING in spec.transforms:
        p *= CHECKPOINT_WEIGHT
    if Capability.FLOAT8 in spec.transforms:
        p *= FLOAT8_WEIGHT
    more = Capability.CHECKPOINTING in spec.transforms or Capability.FLOAT8 in spec.transforms
    seconds = on.scale * (PYTHON_S + PYTHON_S_PER_BLOCK * blocks) * p + (on.more_kernels_s if more else on.kernels_s)
    if spec.cudagraphs and on is CUDA:
        seconds += RECORD_S
    if spec.compile_mode == "max-autotune" and on.autotune_s_per_shape is not None:
        seconds += on.autotune_s_per_shape * matmul_shapes(spec, block_linears)
    return seconds


def model_counts(weights: Mapping[str, torch.Tensor], prefix: str | None) -> tuple[int, int]:
    """The blocks under `prefix` ("blocks.") in a model's named weights, and the distinct matrix shapes in its first
    block (its Linears': what max-autotune benchmarks once for every block)."""
    if not prefix:
        return 0, 0
    blocks: set[str] = set()
    shapes: set[tuple[int, ...]] = set()
    for name, w in weights.items():
        if name.startswith(prefix):
            index = name[len(prefix):].split(".", 1)[0]
            blocks.add(index)
            if index == "0" and w.ndim == 2:
                shapes.add(tuple(w.shape))
    return len(blocks), len(shapes)


class Estimates:
    """Each compiled spec's first step and warm-up, estimated before it runs and measured after, keyed by compile
    mode and cache state: cold from the model, warm from the last warm compile measured in the same mode."""

    def __init__(self, device_type: str, blocks: int, block_linears: int) -> None:
        self.host, self.blocks, self.block_linears = host(device_type), blocks, block_linears
        self.compiled: set[StepSpec] = set()  # graphs this process compiled: inductor's caches hold them
        self.measured: dict[tuple[str, str], float] = {}  # (mode, cache state) -> the last one measured, seconds
        self.off: dict[str, float] = {}  # mode -> the last cold compile measured over the model's estimate of it

    def cache_state(self, spec: StepSpec) -> str:
        return WARM if graph(spec) in self.compiled else COLD

    def estimate(self, spec: StepSpec) -> float | None:
        """The seconds its first step and warm-up should take; None for a spec that does not compile."""
        if not spec.compile:
            return None
        if self.cache_state(spec) == COLD:
            return cold_s(spec, self.blocks, self.block_linears, self.host) * self.off.get(mode(spec), 1.0)
        warm = self.measured.get((mode(spec), WARM))
        if warm is None:  # none measured in this mode: any warm compile, else a lead by the blocks
            warm = next((s for (_, state), s in reversed(self.measured.items()) if state == WARM),
                        WARM_S_PER_BLOCK * max(self.blocks, 1))
        return warm

    def note(self, *measured: tuple[StepSpec | None, Timing | None]) -> None:
        """Specs' warm-ups as measured (the first step and every warm-up step), in the order they ran (a rung's, then
        its base's): warm when the graph was compiled before here or came from a cache (`cache_hits`), else cold."""
        for spec, timing in measured:
            if spec is None or timing is None or not spec.compile:
                continue
            warm = self.cache_state(spec) == WARM or timing.cache_hits > 0
            seconds = timing.first_step_s + sum(timing.warmup_step_s)
            self.measured[(mode(spec), WARM if warm else COLD)] = seconds
            if not warm:
                self.off[mode(spec)] = seconds / cold_s(spec, self.blocks, self.block_linears, self.host)
            self.compiled.add(graph(spec))


def of(device_type: str, weights: Mapping[str, torch.Tensor], blocks_prefix: str | None) -> Estimates:
    """The estimates for a model's compiles on a device, its blocks and their Linears counted from its weights."""
    return Estimates(device_type, *model_counts(weights, blocks_prefix))
