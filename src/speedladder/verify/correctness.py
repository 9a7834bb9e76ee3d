"""Correctness gates: a faster step must still compute the same function and still learn.

1. Equivalence: on the same weights and the same batch, the rung's logits,
   loss and gradients match eager fp32 within a tolerance chosen for the rung's
   arithmetic (written beside each tolerance). The weights are eager fp32's
   after the K steps of 2, not the initial ones: at initialization every logit
   is near zero, and a wrong function can look right there.
2. Loss band: over the same first K batches, the rung's training loss stays
   within a stated fraction of eager fp32's, step by step.
3. Learns-check: after the ladder, the fastest rung that passed trains for a
   few hundred steps and its loss must fall clearly.
The reference for 1 and 2 is always eager fp32 at the rung's own batch shape,
computed once per shape and kept on the host (docs/measurement.md, rules 7 and 9).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from speedladder.data import BatchStream
from speedladder.measure import devicemem
from speedladder.records.checks import (
    Causality,
    Equivalence,
    Fp64,
    Kinks,
    LearnsCheck,
    LossBand,
    TokensToTarget,
    not_applicable,
)
from speedladder.rungs import StepSpec
from speedladder.step import TrainStep, matmul_precision
from speedladder.verify import probes, truth
from speedladder.verify.flips import flip_allowance
from speedladder.verify.kinks import Chosen, Count


@dataclass(frozen=True)
class Tolerance:
    rtol: float  # logits, elementwise, as torch.testing.assert_close takes it
    atol_rms: float  # logits' atol, as a fraction of the reference logits' RMS (logits have no fixed scale)
    loss_rtol: float  # the scalar loss
    grad_rel: float  # ||g - g_ref|| / ||g_ref|| for each parameter's gradient; the worst tensor is judged
    why: str


TOLERANCES: dict[str, Tolerance] = {
    # Compiled fp32 kernels reorder sums and fuse ops: rounding-level differences (~1e-6 relative per op).
    "fp32": Tolerance(rtol=1e-4, atol_rms=1e-4, loss_rtol=1e-5, grad_rel=1e-3,
                      why="fp32: same arithmetic, reordered sums: rounding-level differences only"),
    # TF32 keeps 10 mantissa bits (~5e-4 relative per product), compounded over the layers.
    "tf32": Tolerance(rtol=1e-2, atol_rms=2e-2, loss_rtol=1e-3, grad_rel=5e-2,
                      why="tf32: 10-bit mantissa in matmuls, ~5e-4 relative per product, compounded"),
    # fp16 keeps 10 mantissa bits (~5e-4 relative per rounding), on every op autocast runs in it (bf16's policy):
    # tf32's per rounding, with the outputs rounded too.
    "fp16": Tolerance(rtol=2e-2, atol_rms=4e-2, loss_rtol=2e-3, grad_rel=5e-2,
                      why="fp16: 10-bit mantissa, ~5e-4 relative per rounding, compounded; gradients loss-scaled"),
    # bf16 keeps 8 mantissa bits (~4e-3 relative per rounding), compounded over the layers.
    "bf16": Tolerance(rtol=5e-2, atol_rms=1e-1, loss_rtol=1e-2, grad_rel=1e-1,
                      why="bf16: 8-bit mantissa, ~4e-3 relative per rounding, compounded"),
    # e4m3 keeps 3 mantissa bits (~6e-2 relative per rounding) on scaled matmul inputs, e5m2 2 bits for
    # gradients; products accumulate in fp32, which averages the rounding. Chosen by that arithmetic,
    # not yet seen on a GPU.
    "fp8": Tolerance(rtol=2.5e-1, atol_rms=2.5e-1, loss_rtol=2e-2, grad_rel=2.5e-1,
                     why="fp8: 3-bit (e4m3) / 2-bit (e5m2) mantissas on scaled matmul inputs, fp32 accumulation"),
}

# Untimed training (the gates' curves) hands freed host memory back every this many steps: a 50k-vocabulary step
# frees tens of MB of logits, which the allocator would otherwise keep (devicemem.return_host_memory).
HAND_BACK_EVERY = 5

# At most this many logits are kept per reference (16M floats = 64 MB): whole sequences, from the first.
_PROBE_LOGITS = 1 << 24


Batch = tuple[torch.Tensor, torch.Tensor]
# Chooses the probe batch at the trained weights (kinks.choose_probe): the batch, the census per weights, and the
# count at the probe (what remains within rounding of a kink, when the probe could not be made clean).
ProbeChooser = Callable[[dict[str, torch.Tensor]], Chosen]


@dataclass
class Reference:
    """Eager fp32 at one batch shape, from the initial weights, on the host."""

    batches: list[Batch]  # the first K gate batches
    weights: dict[str, torch.Tensor]  # eager fp32's after training over those batches
    probe_rows: int  # sequences of the probe batch whose logits are compared
    logits: torch.Tensor  # (probe_rows, T, V)
    loss: float
    grads: dict[str, torch.Tensor]
    curve: list[float]  # training loss over the K batches
    probe: probes.Probe  # eager fp32 at the probe weights (probes.amplified): what differential checks measure from
    micro: int | None = None  # the micro-batch its steps were accumulated over, if any
    fp64: truth.Truth | None = None  # eager in float64 at the same weights and batches (with_truth)
    fp64_why: str = ""  # why there is none: the gates then fall back on the per-precision table
    # The batch every output is compared on: the first gate batch, or its sequences that hold no element within
    # rounding of a kink (verify/kinks.py); and the census that chose it, at the trained and at the probe weights.
    probe_batch: Batch | None = None
    kinks: dict[str, Kinks] = field(default_factory=dict)
    remaining: dict[str, Count] = field(default_factory=dict)

    @property
    def probe_weights(self) -> dict[str, torch.Tensor]:
        return probes.amplified(self.weights)

    @property
    def batch(self) -> Batch:
        """The probe batch (the first gate batch where no census moved it)."""
        return self.probe_batch if self.probe_batch is not None else self.batches[0]


def train_step(step: TrainStep, x: torch.Tensor, y: torch.Tensor, micro: int | None = None) -> torch.Tensor:
    """One training step (the loss as a device tensor); with `micro`, its gradients accumulated over
    micro-batches of that many sequences first (probes.accumulate): the same mean loss and gradients, and so
    the same update, as one step on the whole batch."""
    if micro is None:
        return step(x, y)
    _, loss = probes.accumulate(step, x, y, micro, rows=0)
    step.update()  # the recipe's clipping, schedule and optimizer, as the step's own call applies them
    return loss


def loss_curve(step: TrainStep, batches: list[tuple[torch.Tensor, torch.Tensor]],
               micro: int | None = None) -> list[float]:
    """Train from the initial weights over the given batches; the losses, read once at the end."""
    step.reset()
    losses = []
    for i, (x, y) in enumerate(batches):
        losses.append(train_step(step, x.to(step.device), y.to(step.device), micro))
        if i % HAND_BACK_EVERY == HAND_BACK_EVERY - 1:
            devicemem.return_host_memory()  # untimed: what the steps freed goes back (devicemem.return_host_memory)
    return torch.stack(losses).float().cpu().tolist()


def reference(step: TrainStep, batches: list[Batch], micro: int | None = None,
              choose: ProbeChooser | None = None) -> Reference:
    """Eager fp32 at the batches' shape: its loss curve over them, then its outputs at the weights they gave, on the
    probe batch `choose` picks at those weights (the first gate batch without one).

    `micro`: every forward and backward over micro-batches of that many sequences (gradient accumulation), so a
    big batch's reference needs the memory of a micro-batch; the loss and gradients are the whole batch's.
    """
    batch_size, seq_len = batches[0][0].shape
    rows = max(1, min(batch_size, _PROBE_LOGITS // (seq_len * step.vocab_size)))
    with matmul_precision(step.spec):
        curve = loss_curve(step, batches, micro)
        weights = {n: p.detach().cpu().clone() for n, p in step.params.items()}
        batch, census, remaining = choose(weights) if choose is not None else (batches[0], {}, {})
        logits, loss, grads = probes.outputs(step, weights, batch, rows, micro)
        p_logits, p_loss, p_grads = probes.outputs(step, probes.amplified(weights), batch, rows, micro)
    probe = probes.Probe(p_logits, p_grads, curve, "fp32", (batch_size, seq_len), p_loss)
    return Reference(batches, weights, rows, logits, loss, grads, curve, probe, micro, probe_batch=batch,
                     kinks=census, remaining=remaining)


def with_truth(ref: Reference, step64: TrainStep, rerounded: list[TrainStep] | None = None) -> Reference:
    """The reference with its fp64 truth (truth.py): the same model in float64 trained over the same batches from
    the same initial weights, and its outputs at the reference's trained and probe weights on the probe batch;
    eager fp32's own distances from it go on the reference's probe (the scale of every fp32 rung). `rerounded`:
    eager fp32 steps under the rounding fuzz, whose curves' largest distance is the curve's least scale."""
    curve = loss_curve(step64, ref.batches, ref.micro)
    trained = probes.outputs(step64, ref.weights, ref.batch, ref.probe_rows, ref.micro, keep=torch.float64)
    at_probe = probes.outputs(step64, ref.probe_weights, ref.batch, ref.probe_rows, ref.micro, keep=torch.float64)
    # Elements the probe could not be moved off, at ops whose flip moves the backward alone: priced in float64, and
    # every gradient's allowance grows by what they could move it by (flips.py).
    flips = {k: flip_allowance(step64, w, ref.batch, ref.micro, ref.remaining[k])
             for k, w in (("trained", ref.weights), ("probe", ref.probe_weights))
             if k in ref.remaining and ref.remaining[k].near}
    for k, priced in flips.items():
        if priced and k in ref.kinks:
            ref.kinks[k].priced = sum(t.numel() for t in ref.remaining[k].flippable.values())
    spread = [truth.curve_error(loss_curve(s, ref.batches, ref.micro), curve) for s in rerounded or ()]
    ref.fp64 = truth.Truth(trained, at_probe, curve, flips,
                           max((v for v in spread if v is not None), default=None))
    ref.probe.errors = (truth.errors((ref.logits, ref.loss, ref.grads), trained),
                        truth.errors((ref.probe.logits, ref.probe.loss, ref.probe.grads), at_probe, ref.curve, curve))
    return ref


def probe(step: TrainStep, ref: Reference, curve: list[float] | None) -> probes.Probe:
    """A rung's outputs at the probe weights: what the rungs built on it are checked against."""
    logits, loss, grads = probes.outputs(step, ref.probe_weights, ref.batch, ref.probe_rows)
    return probes.Probe(logits, grads, curve, step.spec.precision, (step.spec.batch_size, step.spec.seq_len), loss)


def causality(step: TrainStep, ref: Reference) -> Causality:
    return probes.causality(step, ref.probe_weights, ref.batch, ref.probe_rows, step.vocab_size)


def equivalence(step: TrainStep, ref: Reference, trained: truth.Outputs | None = None,
                fp64: Fp64 | None = None) -> Equivalence:
    """Logits, loss and gradients of the rung (`trained`: its outputs at the reference's weights, computed here when
    not given) against eager fp32's, same weights, same batch. With `fp64` (the rung's distances from fp64 judged
    against eager's, truth.judge) that verdict is the check's; without it, the per-precision table's."""
    tol = TOLERANCES[step.spec.precision]
    logits, loss, grads = trained or probes.outputs(step, ref.weights, ref.batch, ref.probe_rows)
    grad_name, grad_err = probes.worst_grad(grads, ref.grads)
    seen = ref.logits.numel() > 0  # False: the model returns no logits; its loss and gradients are compared
    atol = tol.atol_rms * float(ref.logits.pow(2).mean().sqrt()) if seen else 0.0
    out = Equivalence(
        precision=step.spec.precision, rtol=tol.rtol, atol=atol, loss_rtol=tol.loss_rtol, grad_rel_tol=tol.grad_rel,
        tolerance_why=tol.why, logits_max_abs_err=float((logits - ref.logits).abs().max()) if seen else None,
        logits_rel_err=probes.rel(logits, ref.logits) if seen else None, loss=loss, loss_ref=ref.loss,
        grad_rel_err=grad_err, grad_worst=grad_name,  # the worst parameter's gradient, relative to its norm
        logits=None if seen else "not compared: the forward returns a loss only",
        rule="table" if fp64 is None else "fp64", fp64=fp64, fp64_why=ref.fp64_why)
    if fp64 is not None:
        out.passed, out.detail = fp64.passed, ("" if fp64.passed else "equivalence: " + fp64.detail)
        return out
    try:
        if seen:
            torch.testing.assert_close(logits, ref.logits, rtol=tol.rtol, atol=atol, msg=lambda m: "logits: " + m)
        torch.testing.assert_close(torch.tensor(loss), torch.tensor(ref.loss), rtol=tol.loss_rtol, atol=0.0,
                                   msg=lambda m: "loss: " + m)
    except AssertionError as e:
        out.passed, out.detail = False, _summary(str(e))
    if out.passed and not grad_err <= tol.grad_rel:
        out.passed = False
        out.detail = (f"the gradient of {grad_name} differs by {grad_err:.2e} relative "
                      f"(tolerance {tol.grad_rel:.0e} per tensor)")
    return out


def _summary(message: str) -> str:
    """assert_close's message in one line: what differed and by how much."""
    lines = [ln.strip() for ln in message.strip().splitlines() if ln.strip()]
    keep = [lines[0]] + [ln for ln in lines[1:] if ln.startswith(("Mismatched", "Greatest absolute"))]
    return "; ".join(keep)


def loss_band(curve: list[float], ref_curve: list[float], band: float) -> LossBand:
    """Step by step over the same batches, |loss - loss_ref| <= band * loss_ref."""
    worst = max(abs(a - b) / b for a, b in zip(curve, ref_curve))
    finite = all(math.isfinite(v) for v in curve)
    passed = finite and worst <= band
    detail = "" if passed else (
        "non-finite loss" if not finite else f"loss strays {worst:.1%} from eager fp32 (band {band:.0%})")
    return LossBand(steps=len(curve), band=band, max_rel_diff=worst, losses=curve, ref_losses=ref_curve,
                    passed=passed, detail=detail)


def no_loss_band(spec: StepSpec) -> LossBand:
    """A rung that changes the update rule follows its own curve: the band does not apply, and says why."""
    return not_applicable(LossBand, f"{spec.update_change or spec.optimizer + ' updates differently from AdamW'}, "
                                    "so its loss curve differs by design; compared by tokens to a target loss instead")


def tokens_to(losses: list[float], target: float, window: int, tokens_per_step: int) -> int | None:
    """Tokens trained until the running mean of `window` losses first reaches the target; None if never."""
    for i in range(window - 1, len(losses)):
        if sum(losses[i - window + 1: i + 1]) / window <= target:
            return (i + 1) * tokens_per_step
    return None


def tokens_to_target(step: TrainStep, adamw: TrainStep,
                     batches: list[tuple[torch.Tensor, torch.Tensor]]) -> TokensToTarget:
    """Both steps from the initial weights over the same batches: the tokens each needs to reach AdamW's
    final loss (the mean of its last tenth). Passes if the rung needs no more tokens than AdamW."""
    curves = {}
    for name, s in (("rung", step), ("adamw", adamw)):
        s.reset()
        curves[name] = torch.stack([s(x.to(s.device), y.to(s.device)) for x, y in batches]).float().cpu().tolist()
    window = max(1, len(batches) // 10)
    target = sum(curves["adamw"][-window:]) / window
    tps = batches[0][0].numel()
    ours, theirs = (tokens_to(curves[k], target, window, tps) for k in ("rung", "adamw"))
    finite = all(math.isfinite(v) for v in curves["rung"])
    passed = finite and ours is not None and theirs is not None and ours <= theirs
    if passed:
        detail = ""
    elif not finite:
        detail = "non-finite loss"
    elif ours is None:
        detail = f"never reached AdamW's loss {target:.3f} in {len(batches)} steps"
    else:
        detail = f"needed {ours:,} tokens to reach loss {target:.3f}, AdamW {theirs:,}"
    return TokensToTarget(steps=len(batches), target_loss=target, window=window, tokens=ours, adamw_tokens=theirs,
                          token_ratio=(theirs / ours) if ours and theirs else None, losses=curves["rung"],
                          adamw_losses=curves["adamw"], passed=passed, detail=detail)


def train_curve(step: TrainStep, stream: BatchStream, steps: int,
                on_progress: Callable[[str], None] = lambda msg: None, micro: int | None = None) -> list[float]:
    """Train from the initial weights for `steps` steps; the losses, read back once at the end (and at log lines).
    `micro`: each step's gradients accumulated over micro-batches of that many sequences (train_step)."""
    step.reset()
    losses: list[torch.Tensor] = []
    every = max(1, steps // 10)
    for i in range(steps):
        losses.append(train_step(step, *next(stream), micro))
        if (i + 1) % every == 0 or i + 1 == steps:
            on_progress(f"step {i + 1}/{steps}, loss {float(losses[-1]):.3f}")
        if i % HAND_BACK_EVERY == HAND_BACK_EVERY - 1:
            devicemem.return_host_memory()  # untimed: the allocator keeps what steps free unless told (devicemem.py)
    return torch.stack(losses).float().cpu().tolist()


def final_loss(curve: list[float]) -> float:
    """The mean of the last tenth of a curve: one step's loss is too noisy to judge by."""
    tail = curve[-max(1, len(curve) // 10):]
    return sum(tail) / len(tail)


def learns_check(curve: list[float], eager_curve: list[float], band: float, unigram_entropy: float) -> LearnsCheck:
    """Learns as well as the baseline: over the same batches for the same steps, the fast configuration's final
    loss is within `band` of eager fp32's, and below the corpus's unigram entropy (what a model that ignores
    context and position can reach, letter or token frequencies alone)."""
    final, eager = final_loss(curve), final_loss(eager_curve)
    finite = all(math.isfinite(v) for v in curve)
    within = finite and final <= eager * (1 + band)
    below = finite and final < unigram_entropy
    if not finite:
        detail = "non-finite loss"
    elif not within:
        detail = (f"final loss {final:.3f} is {final / eager - 1:.1%} above eager fp32's {eager:.3f} over the same "
                  f"batches (band {band:.0%})")
    elif not below:
        detail = (f"final loss {final:.3f} is not below the corpus's unigram entropy {unigram_entropy:.3f}: no more "
                  "than token frequencies learned")
    else:
        detail = ""
    return LearnsCheck(steps=len(curve), first_loss=curve[0], final_loss=final, eager_final_loss=eager, band=band,
                       unigram_entropy=unigram_entropy, losses=curve, eager_losses=eager_curve,
                       drop=(curve[0] - final) / curve[0] if curve[0] else 0.0, passed=within and below, detail=detail)
