"""The memory meters on a rung of the ladder (docs/memory-sweep.md): its saved activations, counted on one
forward of its own step; the same predicted from the shapes; and off CUDA the step's resident peak, from a child
process that builds each queued rung's step in turn. The meters themselves are measure/memory.py's."""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable

import torch
from torch import nn

from speedladder import subproc
from speedladder.config.run import MemoryConfig, RunConfig
from speedladder.errors import one_line
from speedladder.measure import peakflops
from speedladder.measure.memory import MMAP_THRESHOLD, Saved, count_saved, process_peak_unsupported, resident_peak
from speedladder.measure.microbench import ceiling_side, matmul_ceiling
from speedladder.models.gpt import GPTConfig
from speedladder.records import RungResult, storage
from speedladder.rungs import float8_matmul_params, padded_vocab
from speedladder.spec import Capability, StepSpec
from speedladder.step.train_step import TrainStep, matmul_precision
from speedladder.step.workload import Workload, prepare


def step_saved(step: TrainStep, x: torch.Tensor, y: torch.Tensor) -> Saved:
    """The saved activations of one forward of a training step, as it runs in its windows (autocast, compile): one
    micro-batch's where the step accumulates, since each micro-step's are freed by its backward."""
    model = step.model
    x, y = x[: step.spec.micro_batch], y[: step.spec.micro_batch]

    def forward() -> object:
        if step.spec.cudagraphs:  # a new iteration for CUDA graph trees, as the step itself marks
            torch.compiler.cudagraph_mark_step_begin()
        with step._autocast:
            return step.forward(x, y)

    return count_saved(forward, [*model.parameters(), *model.buffers()])


# -- predicted from shapes ------------------------------------------------------------------

INDEX_BYTES = 8  # token ids, positions and targets are int64
FP32_BYTES = 4


def predicted_activation_bytes(m: GPTConfig | None, spec: StepSpec) -> tuple[int | None, str]:
    """What eager autograd saves in one forward of our GPT, from the shapes; None where the model has no account.

    Per block (B sequences of T tokens, width C, H heads, MLP width M; `a` the
    bytes of an activation: 4 in fp32, 2 under bf16 autocast):
      fp32, 4 bytes: the residual stream into each LayerNorm (2·BTC) and each norm's mean and 1/std (4·BT);
      a bytes: each Linear's input: the two norms' outputs (cast copies under autocast), the attention's
        merged heads (3·BTC); q, k and v copied contiguous for the batched matmuls (3·BTC) and the softmaxed
        scores (H·B·T·T), or, with fused attention, the projection it reads (3·BTC, q, k and v being views
        of it) and a fp32 log-sum-exp (4·H·B·T), its output being the merged heads already counted; ReLU's output (BTM), GELU's input and
        output (2·BTM);
      1 byte: the causal mask (T·T), unless attention is fused;
      2 bytes under autocast: every block weight cast to bf16 (3C² + C² + 2CM).
    Outside the blocks: token ids and positions (int64), the last norm's input and statistics, the head's
    input (a·BTC, plus its bf16 weight under autocast), the fp32 log-softmax over the vocabulary (4·BT·V)
    and the targets. Checkpointing keeps each block's input (4·BTC) and nothing inside.
    Compiled steps are predicted as eager: inductor's partitioner chooses its own saves (the measurement
    says what it chose).
    """
    if m is None:
        return None, "no account of this model's saves: it is not our GPT (the measurement stands alone)"
    if spec.float8_recipe is not None:
        return None, "no account of float8's saved scales and casts"
    B, T, C, H, M = spec.micro_batch, spec.seq_len, m.n_embd, m.n_head, m.mlp_hidden  # one micro-step's saves
    bf16 = spec.autocast in ("bf16", "fp16")  # either half precision: two bytes an activation, as autocast casts
    a = 2 if bf16 else FP32_BYTES
    vocab = padded_vocab(m.vocab_size) if Capability.PAD_VOCAB in spec.transforms else m.vocab_size
    bt, btc = B * T, B * T * C
    if Capability.CHECKPOINTING in spec.transforms:
        block, how = FP32_BYTES * btc, "each block's input only (checkpointed)"
    else:
        sdpa = Capability.SDPA in spec.transforms
        attention = (a * 3 * btc + FP32_BYTES * H * bt) if sdpa else (a * (3 * btc + H * B * T * T) + T * T)
        mlp = a * B * T * M * (2 if m.activation == "gelu" else 1)
        weights = 2 * (4 * C * C + 2 * C * M) if bf16 else 0
        block = FP32_BYTES * (2 * btc + 4 * bt) + a * 3 * btc + attention + mlp + weights
        how = "per block: norms' inputs and statistics, Linear inputs, " + (
            "fused attention's inputs and output" if sdpa else "q/k/v copies and the T×T scores") + ", the MLP"
    outside = (INDEX_BYTES * (bt + T + bt) + FP32_BYTES * (btc + 2 * bt) + a * btc
               + FP32_BYTES * bt * vocab + FP32_BYTES
               + (2 * vocab * C if bf16 else 0))
    total = m.n_layer * block + outside
    compiled = "; compiled steps predicted as eager" if spec.compile else ""
    return total, f"{how}, {m.n_layer} blocks, plus embeddings, head and loss ({spec.autocast or 'fp32'}{compiled})"


def _child(run_cfg: RunConfig, spec_dicts: list[dict], cfg: MemoryConfig) -> list[dict]:
    """Each spec's step built, measured and dropped in turn: one Python and one workload for all of them (the
    resident set before each one's steps is its own base, so what an earlier step left behind is not its rise)."""
    work = prepare(run_cfg)
    out: list[dict] = []
    for spec in map(StepSpec.from_dict, spec_dicts):
        try:
            with matmul_precision(spec):
                train = work.step(spec)
                batches = work.stream(spec)
                out.append(resident_peak(lambda: train(*next(batches)), cfg.warmup, cfg.steps))  # noqa: B023
        except Exception as e:  # noqa: BLE001 -- this spec's figure is missing and says why; the next one runs
            out.append({"error": one_line(e)})
        train = batches = None  # type: ignore[assignment]  # references dropped for gc (the lambda needs them set)
        gc.collect()
        torch.compiler.reset()
    return out


def peaks_in_child(run_cfg: RunConfig, specs: list[StepSpec], cfg: MemoryConfig) -> list[dict]:
    """The resident peaks of several specs' steps, measured one after the other in one fresh Python process (see
    the module's docstring); a spec that failed has {"error": ...} instead. Each spec gets the timeout."""
    answer = subproc.run_module("speedladder.ladder.rung_memory", (run_cfg, [spec.to_dict() for spec in specs], cfg),
                                "the memory process", cfg.timeout_s * len(specs),
                                MALLOC_MMAP_THRESHOLD_=str(MMAP_THRESHOLD))
    assert isinstance(answer, list)
    return answer


# -- one rung ------------------------------------------------------------------------------


def record(r: RungResult, work: Workload, spec: StepSpec, step: TrainStep, say: Callable[[str], None],
           peaks: Peaks | None = None) -> None:
    """Fill a rung's memory figures: saved activations (here, now), predicted, and the step's peak off CUDA.

    The resident peak is queued on `peaks` (measured after the climb and the learns-check), or measured
    now without it. A meter that fails leaves its figure None and says why in r.memory_note; the rung stands.
    """
    r.predicted_activation_bytes, why = predicted_activation_bytes(work.cfg.model, spec)
    notes = [f"predicted: {why}"]
    try:
        x, y = next(work.stream(spec))
        r.saved_activation_bytes = step_saved(step, x, y).activation_bytes
    except Exception as e:  # noqa: BLE001 -- a meter that cannot run is reported, never guessed
        notes.append(f"saved activations not measured: {e}")
    r.memory_note = "; ".join(notes)
    cfg = work.cfg.run.memory
    unsupported = process_peak_unsupported()
    if work.device.type == "cuda" or not cfg.process_peak or unsupported:
        r.memory_note += "; " + ("step peak: the CUDA allocator's" if work.device.type == "cuda" else
                                 "step peak: off (--no-process-peak)" if not cfg.process_peak else unsupported or "")
    elif peaks is not None:
        peaks.todo.append((r, spec))
    else:
        measure_peak(r, work, spec, say)


def measure_peak(r: RungResult, work: Workload, spec: StepSpec, say: Callable[[str], None]) -> None:
    """The rung's resident peak, from a child process; a failure is said in r.memory_note."""
    cfg = work.cfg.run.memory
    say(f"memory: {r.name}'s resident peak in a child process ({cfg.warmup} + {cfg.steps} steps)")
    measure_peaks([(r, spec)], work)


def measure_peaks(todo: list[tuple[RungResult, StepSpec]], work: Workload) -> None:
    """Several rungs' resident peaks from one child process; a failure is said in each rung's memory_note."""
    try:
        run = work.cfg.run.with_rungs(("eager",))
        peaks = peaks_in_child(run, [spec for _, spec in todo], work.cfg.run.memory)
    except Exception as e:  # noqa: BLE001 -- recorded; the rungs' speed and gates stand
        peaks = [{"error": str(e)}] * len(todo)
    for (r, _), peak in zip(todo, peaks, strict=True):
        if "error" in peak:
            r.memory_note += f"; resident peak not measured: {peak['error']}"
        else:
            r.process_base_bytes, r.process_peak_bytes = peak["process_base_bytes"], peak["process_peak_bytes"]


class Peaks:
    """The rungs whose resident peak is still to measure.

    The child process costs seconds (a fresh Python, then each step built and, if compiled, compiled again from
    the cache), so one child measures every queued rung in turn, once the climb and the learns-check are over:
    nothing timed may share the machine with it. It runs after the learns-check rather than beside it: on 2
    cores the two processes' threads fought for them, and the pair took longer than one after the other (80 s
    against 60 s, docs/memory-sweep.md).
    """

    def __init__(self, work: Workload) -> None:
        self.work = work
        self.todo: list[tuple[RungResult, StepSpec]] = []

    def measure(self, say: Callable[[str], None]) -> None:
        todo, self.todo = self.todo, []
        if todo:
            say(f"the resident peaks of {len(todo)} rungs, one after the other in a child process")
            measure_peaks(todo, self.work)



CEILING_BUDGET_S = 0.5  # seconds of back-to-back products behind each precision's measured matmul ceiling


class FlopPeaks:
    """The peak FLOP/s each rung's MFU is taken against, per precision: given, from the datasheets, or this device's
    matmul ceiling measured here once per precision for the whole ladder (docs/measurement.md, the meters)."""

    def __init__(self, work: Workload) -> None:
        self.work = work
        self.ceilings: dict[str, float] = {}  # each precision's measured matmul ceiling (TFLOP/s)

    def of(self, spec: StepSpec, model: nn.Module, fpt: int) -> tuple[float | None, str]:
        """The peak TFLOP/s a rung's MFU is taken against, and how it was had (results.json's peak_basis).

        Each precision's peak is --peak-tflops's, else the datasheet's, else this device's matmul ceiling at
        that precision, measured here once (peakflops.known_peak, profile.facts.matmul_ceiling). An fp8 rung runs
        only the block linears in fp8; the head and attention stay at the precision below (bf16): its peak is the
        FLOP-weighted harmonic blend of the two (peakflops.blended_peak).
        """
        if spec.precision != "fp8":
            return self._precision(spec.precision)
        rest = "bf16" if spec.autocast == "bf16" else "tf32" if spec.tf32 else "fp32"
        prefix, recipe = self.work.model.blocks_prefix or "blocks.", spec.float8_recipe or "rowwise"
        fp8 = min(6 * float8_matmul_params(model, prefix, recipe), fpt)
        (p8, basis8), (p_rest, basis_rest) = self._precision("fp8"), self._precision(rest)
        blended = peakflops.blended_peak({"fp8": fp8, rest: fpt - fp8}, {"fp8": p8, rest: p_rest})
        parts = f"both the {basis8}" if basis8 == basis_rest else f"fp8's the {basis8}, {rest}'s the {basis_rest}"
        return blended, (f"fp8's peak for the block linears' {fp8 / fpt:.0%} of the FLOPs, {rest}'s for the rest "
                         f"(head, attention), blended by FLOP share; {parts}")

    def _precision(self, precision: str) -> tuple[float | None, str]:
        """One precision's peak and its basis: given or from the datasheet, else the matmul ceiling measured on
        this device, once per precision for the whole ladder (every rung at a precision is taken against one
        figure). None, and why, only where that measurement failed."""
        w = self.work
        known = peakflops.known_peak(w.cfg.run.peak_tflops, storage.device_name(w.device), w.device.type,
                                     w.env.cuda_capability, precision)
        if known is not None:
            return known.tflops, known.basis
        side = ceiling_side(w.device)
        if precision not in self.ceilings:
            try:
                self.ceilings[precision] = matmul_ceiling(w.device, precision, side, CEILING_BUDGET_S)
            except RuntimeError as e:  # out of memory beside the rung's step, or a product this build lacks
                return None, f"no peak: measuring the {precision} matmul ceiling failed ({one_line(e)})"
        measured = peakflops.measured_peak(self.ceilings[precision], side)
        return measured.tflops, measured.basis


if __name__ == "__main__":
    sys.exit(subproc.serve(sys.argv[1:], _child))
