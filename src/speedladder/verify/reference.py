"""Eager fp32's reference at one batch shape and its truth, built in timed phases (docs/measurement.md, rules 12
and 16).

In order, from one fp32 model and one float64 model, each reused (never a model per check):
1. eager fp32 trains over the K gate batches: its loss curve, and the trained weights every output is compared at;
2. the probe batch (the `kink_census` refinement: the first gate batch with its sequences that hold an element
   within rounding of a kink replaced by clean ones of the second);
3. eager fp32's outputs (logits, loss, every gradient) at the trained and the probe weights on the probe batch;
4. the truth: eager in float64 over the same curve and at the same weights and batch; where the probe could not
   avoid a kink, the flips' price (the `flip_pricing` refinement); where float64 cannot run, eager fp32 stands in
   for the truth, and the reference says why (the verdict's status);
5. on demand, when a curve would fail without it: eager fp32 re-rounded (the rounding fuzz as hooks on the same
   model, CURVE_DRAWS seeds), the curve's least scale.

A batch m times the workload's is built of micro-batches and judged where its maths is decided: the function per
micro-batch (the workload batch's reference, its probe batch rolled m ways so each micro-batch holds the same clean
sequences in another order: the outputs, census and truth are that reference's), and the accumulation on its own
(the loss curve at the big batch, eager fp32's and float64's accumulated over micro-batches, over the same tokens
as the workload batch's curve).
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import TypeVar

import torch

from speedladder.errors import is_oom, one_line
from speedladder.measure import devicemem
from speedladder.records.checks import Kinks
from speedladder.rungs.fuzz import attach
from speedladder.spec import StepSpec
from speedladder.step.train_step import TrainStep
from speedladder.verify import curves, flip_pricing, kink_census, probes
from speedladder.verify.distance import Outputs, Truth, curve_error, errors
from speedladder.verify.emulated_precision import Arithmetic
from speedladder.verify.kink_census import BAND, Batch, Count
from speedladder.verify.tolerance import Refinements

# Re-rounded runs of eager fp32's curve behind the curve's least scale (each one more training curve of the gate
# batches). Under nanoGPT's recipe on d2l-cpu the fuzz's curve distances at 10 seeds spread from under 1.1e-6 to
# 3.4e-5, four of them below a tenth of the largest: with eager's own and four draws, all five fall below it about
# once in 200.
CURVE_DRAWS = 4
# At most this many logits are kept per reference (16M floats = 64 MB): whole sequences, from the first.
_PROBE_LOGITS = 1 << 24

T = TypeVar("T")


class Phases:
    """Seconds by phase, in the order they ran (a phase entered twice adds up)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start


def hand_back(device: torch.device) -> None:
    """What a phase freed goes back (compiled code is kept: the rung's step is gated after its reference)."""
    gc.collect()
    devicemem.return_host_memory()
    if device.type == "cuda":
        torch.cuda.empty_cache()


@dataclass
class Reference:
    """Eager fp32 at one batch shape, from the initial weights, and its truth; every tensor on the host."""

    batches: list[Batch]  # the gate batches of its loss curve
    curve: list[float]  # eager fp32's training loss over them
    weights: dict[str, torch.Tensor]  # eager fp32's trained weights (a big batch: the workload batch's)
    batch: Batch  # the probe batch every output is compared on
    probe_rows: int  # sequences of the probe batch whose logits are compared
    logits: torch.Tensor  # (probe_rows, T, V), at the trained weights
    loss: float
    grads: dict[str, torch.Tensor]
    probe: probes.Probe  # eager fp32 at the probe weights, with its distances from the truth (the fp32 scale)
    truth: Truth  # eager in float64 at the same weights, batch and curve; eager fp32 itself where fp64 cannot run
    micro: int | None = None  # the micro-batch its curve was accumulated over (a batch m times the workload's)
    fp64_why: str = ""  # why eager fp32 stands in for the truth ("" when float64 ran)
    kinks: dict[str, Kinks] = field(default_factory=dict)  # the census that chose the probe, per weights
    remaining: dict[str, Count] = field(default_factory=dict)  # what lies within rounding of a kink at the probe
    seconds: dict[str, float] = field(default_factory=dict)  # what building it cost, by phase
    probe_weights: dict[str, torch.Tensor] = field(default_factory=dict)  # the trained weights amplified, once

    def __post_init__(self) -> None:
        if not self.probe_weights:
            self.probe_weights = probes.amplified(self.weights)

    @property
    def fp64(self) -> Truth | None:
        """The float64 truth; None where eager fp32 stands in for it."""
        return self.truth if self.truth.fp64 else None


def probe_rows(batch: Batch, vocab: int) -> int:
    """Whole sequences of the probe batch whose logits are kept (at most _PROBE_LOGITS logits)."""
    batch_size, seq_len = batch[0].shape
    return max(1, min(batch_size, _PROBE_LOGITS // (seq_len * vocab)))


def _on_host(weights: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    """Weights kept on the host, in pinned memory where they go back to a GPU at every check (a fast copy)."""
    return {n: w.pin_memory() for n, w in weights.items()} if device.type == "cuda" else weights


def _truth_of(step64: TrainStep, ref: Reference, refine: Refinements, clock: Phases) -> Truth:
    """Eager in float64: its curve, its outputs at the reference's trained and probe weights on the probe batch,
    and the price of the kinks the probe could not avoid."""
    with clock("float64 curve"):
        curve = curves.loss_curve(step64, ref.batches, ref.micro)
    with clock("float64 outputs"):
        trained = probes.outputs(step64, ref.weights, ref.batch, ref.probe_rows, keep=torch.float64)
        at_probe = probes.outputs(step64, ref.probe_weights, ref.batch, ref.probe_rows, keep=torch.float64)
    flips: dict[str, dict[str, float]] = {}
    if refine.flip_pricing:
        # Elements the probe could not be moved off, at ops whose flip moves the backward alone: priced in float64,
        # and every gradient's allowance grows by what they could move it by (flip_pricing.py).
        with clock("flip pricing"):
            for k, w in (("trained", ref.weights), ("probe", ref.probe_weights)):
                left = ref.remaining.get(k)
                if left is not None and left.flippable:
                    flips[k] = flip_pricing.flip_allowance(step64, w, ref.batch, left)
                    if flips[k] and k in ref.kinks:
                        ref.kinks[k].priced = sum(t.numel() for t in left.flippable.values())
    return Truth(trained, at_probe, curve, flips)


def fall_back(what: Callable[[], T], who: str) -> tuple[T | None, str]:
    """A phase that may not run on this model (the float64 model, its phases, the kink census): its result, or
    None and why, which the record says (the reference's one fallback: float64 gone, eager fp32 stands in for the
    truth; the census gone, the probe is the first gate batch, unexamined)."""
    try:
        return what(), ""
    except Exception as e:  # noqa: BLE001 -- a model that will not run in float64, or under the census's dispatch
        return None, f"{who} {'ran out of memory' if is_oom(e) else f'failed ({one_line(e)})'}"


def _eager_as_truth(ref: Reference) -> Truth:
    return Truth((ref.logits, ref.loss, ref.grads), (ref.probe.logits, ref.probe.loss, ref.probe.grads), ref.curve,
                 fp64=False)


def _judged(ref: Reference) -> Reference:
    """Eager fp32's own distances from the truth: the scale of every fp32 rung (zero where it is the truth)."""
    t = ref.truth
    ref.probe.errors = (errors((ref.logits, ref.loss, ref.grads), t.trained),
                        errors((ref.probe.logits, ref.probe.loss, ref.probe.grads), t.probe, ref.curve, t.curve))
    return ref


def build(step: TrainStep, make64: Callable[[], TrainStep] | None, batches: list[Batch], refine: Refinements,
          why64: str = "") -> Reference:
    """Eager fp32's reference at the batches' shape and its truth (the module's docstring, steps 1-4); `make64`
    builds the float64 model (None: float64 does not run here, `why64` says why)."""
    clock = Phases()
    with clock("eager fp32 curve"):
        curve = curves.loss_curve(step, batches)
        weights = _on_host(probes.host_copy(dict(step.params), torch.float32), step.device)
    at_probe_w = _on_host(probes.amplified(weights), step.device)
    rows = probe_rows(batches[0], step.vocab_size)
    named = {"trained": weights, "probe": at_probe_w}

    def model64() -> TrainStep:
        with clock("float64 model"):
            assert make64 is not None
            return make64()

    def census(step64: TrainStep) -> kink_census.Chosen:
        with clock("kink census"):
            return kink_census.choose_probe(step64, step, named, batches)

    step64, why = fall_back(model64, "the float64 model") if make64 is not None else (None, why64)
    chosen: kink_census.Chosen | None = None
    why_census = "switched off" if not refine.kink_census else why
    if step64 is not None and refine.kink_census:
        s64 = step64
        chosen, why_census = fall_back(lambda: census(s64), "the kink census")
    batch, kinks, remaining = chosen if chosen is not None else (batches[0], {}, {})
    if chosen is None and refine.kink_census:
        kinks = {k: Kinks(ran=False, band=BAND, detail=f"{why_census}: the probe is the first gate batch, unexamined")
                 for k in named}
    with clock("eager fp32 outputs"):
        logits, loss, grads = probes.outputs(step, weights, batch, rows)
        p_logits, p_loss, p_grads = probes.outputs(step, at_probe_w, batch, rows)
    shape = (batches[0][0].shape[0], batches[0][0].shape[1])
    probe = probes.Probe(p_logits, p_grads, curve, "fp32", shape, p_loss)
    ref = Reference(batches, curve, weights, batch, rows, logits, loss, grads, probe,
                    Truth((logits, loss, grads), (p_logits, p_loss, p_grads), curve, fp64=False),
                    kinks=kinks, remaining=remaining, probe_weights=at_probe_w)
    if step64 is not None:
        s64 = step64
        truth, why = fall_back(lambda: _truth_of(s64, ref, refine, clock), "the float64 reference")
        if truth is not None:
            ref.truth = truth
    ref.fp64_why = (why + ": distances measured from eager fp32, which stands in for the truth"
                    if not ref.truth.fp64 else "")
    if not ref.truth.fp64:
        ref.truth = _eager_as_truth(ref)
    hand_back(step.device)
    ref.seconds = clock.seconds
    return _judged(ref)


def rolled(batch: Batch, m: int) -> Batch:
    """A batch m times as big, of micro-batches that each hold the batch's sequences in another order (rolled by
    one more row each): the same clean sequences, and no row beside the same neighbour twice."""
    x, y = batch
    return (torch.cat([x.roll(-j, dims=0) for j in range(m)]), torch.cat([y.roll(-j, dims=0) for j in range(m)]))


def curve_steps(k: int, m: int) -> int:
    """The steps of the loss curve at a batch m times the workload's: the same tokens as its K steps (at least two,
    so that one update is seen, where K has two)."""
    return max(min(k, 2), math.ceil(k / m))


def at_batch(base: Reference, m: int, step: TrainStep, make64: Callable[[], TrainStep] | None,
             batches: list[Batch]) -> Reference:
    """The reference at a batch m times the workload's (the module's docstring): the workload batch's function on its
    probe rolled m ways, and the loss curve at the big batch accumulated over micro-batches of the workload's."""
    clock = Phases()
    micro = base.batch[0].shape[0]
    with clock("eager fp32 curve"):
        curve = curves.loss_curve(step, batches, micro)
    big = rolled(base.batch, m)
    shape = (big[0].shape[0], big[0].shape[1])
    probe = replace(base.probe, curve=curve, shape=shape, errors=None)
    truth = replace(base.truth, curve=curve, curve_spread=None)  # eager fp32 as the truth, until float64's
    ref = replace(base, batches=batches, curve=curve, batch=big, probe=probe, truth=truth, micro=micro, seconds={})
    if base.truth.fp64 and make64 is not None:
        def fp64_curve() -> Truth:
            with clock("float64 model"):
                step64 = make64()
            with clock("float64 curve"):
                return replace(base.truth, curve=curves.loss_curve(step64, batches, micro), curve_spread=None)
        fp64, why = fall_back(fp64_curve, "the float64 curve")
        if fp64 is not None:
            ref.truth = fp64
        else:
            ref.fp64_why = why + ": distances measured from eager fp32, which stands in for the truth"
            ref.truth = _eager_as_truth(ref)
    hand_back(step.device)
    ref.seconds = clock.seconds
    return _judged(ref)


def spread(step: TrainStep, ref: Reference) -> float | None:
    """The largest distance from the truth of eager fp32's curve re-rounded (the rounding fuzz as hooks on the
    reference's own fp32 model, CURVE_DRAWS seeds, taken off after each): the curve's least scale."""
    out = []
    for seed in range(CURVE_DRAWS):
        remove = attach(step.model, seed=seed)
        try:
            out.append(curve_error(curves.loss_curve(step, ref.batches, ref.micro), ref.truth.curve))
        finally:
            remove()
    step.reset()
    return max((v for v in out if v is not None), default=None)


def eager_at(step: TrainStep, ref: Reference, arithmetic: Arithmetic,
             with_curve: bool = True) -> tuple[Outputs, Outputs, list[float] | None]:
    """Eager fp32 under a lower precision's emulated arithmetic: its outputs at the trained and the probe weights on
    the probe batch, and its loss curve over the gate batches (accumulated as the reference's)."""
    with arithmetic():
        trained = probes.outputs(step, ref.weights, ref.batch, ref.probe_rows)
        at_probe = probes.outputs(step, ref.probe_weights, ref.batch, ref.probe_rows)
        curve = curves.loss_curve(step, ref.batches, ref.micro) if with_curve else None
    return trained, at_probe, curve


def spec_shape(spec: StepSpec) -> tuple[int, int]:
    return spec.batch_size, spec.seq_len
