"""Every rung's error measured from a float64 reference, judged against the error eager makes at its precision.

A fixed tolerance chosen on one processor cries wolf on another: a compiled kernel that rounds differently from
eager is still right, and how far apart the two may be depends on how far each is from the exact result, which
depends on the model, the weights and the processor. So the gates measure that distance instead of assuming it
(docs/measurement.md, rule 12), as dynamo's accuracy checker does (torch._dynamo.utils.same with fp64_ref):

- The truth: eager in float64 at the reference's weights, on the probe batch: logits, loss and every gradient,
  at the trained weights and at the probe weights, and its loss curve over the gate batches. Computed once per
  batch shape.
- The scale: the distance from that truth of eager at the rung's own precision (eager fp32 for an fp32 rung, eager
  under bf16 autocast for a bf16 one), and of the rung it built on where it has the same precision and shape.
- The rule, per tensor: the rung's distance from the truth <= FP64_K x the largest of those + FP64_FLOOR.

A distance is relative to the truth's norm, or, for a gradient that vanishes (a key bias: softmax does not see a
constant added to a row's scores, so its gradient is zero and fp32 computes rounding noise there), to the norm the
model's mean gradient would give a tensor of that size: no tensor is judged finer than the model's gradients are.
A wrong function moves by the size of what it changes; a re-rounding moves by the size of eager's own error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from speedladder.records.checks import Distance, Fp64

# The multiplier on eager's own distance from fp64: dynamo's is 2 (3 for bf16 and fp16); ours judges every gradient
# tensor on its own rather than the outputs as a whole, so it keeps one more step of room. On d2l-cpu, tiny and a
# Hugging Face OPT, correct rungs (compile, sdpa, ckpt, pad-vocab, fused AdamW, after eager and after bf16) sat at
# 0.97-1.35x eager's distance in logits and worst gradient, and at most 5.4x in one tensor eager happened to get
# within 1e-7 (the floor covers it); the planted wrong rungs after bf16 at 2.7x the allowance or more, after
# eager at 50x or more (tests/test_gates.py).
FP64_K = 3.0
# Re-rounded runs of eager fp32's curve behind Truth.curve_spread (each one more training curve of the gate batches).
# Under nanoGPT's recipe on d2l-cpu the fuzz's curve distances at 10 seeds spread from under 1.1e-6 to 3.4e-5, four
# of them below a tenth of the largest: with eager's own and four draws, all five fall below it about once in 200.
CURVE_DRAWS = 4
# A loss curve is chaotic: one step's rounding is carried and amplified by every later update, so two honest curves'
# distances from fp64 differ by several times (sdpa's 4.3x eager fp32's over 20 steps of d2l-cpu). A wrong update
# rule moves it by far more (skipping every other step after bf16: 35x what K=3 would allow).
CURVE_K = 10.0
# The smallest relative distance always allowed, by precision, for a quantity eager happens to get almost exact: in
# fp32 a long reduction reordered (~sqrt(n) roundings of 6e-8: ~1e-5 at n = 16k tokens); at lower precisions eager's
# own distance is orders above its floor, which only keeps a zero from being demanded.
FP64_FLOOR = {"fp32": 1e-5, "tf32": 1e-4, "fp16": 1e-4, "bf16": 1e-3, "fp8": 1e-2}  # fp16: tf32's mantissa

Outputs = tuple[torch.Tensor, float, dict[str, torch.Tensor]]  # logits, loss, gradients (probes.outputs)


@dataclass
class Truth:
    """Eager in float64 at one batch shape, on the host: what every rung's error is measured from."""

    trained: Outputs  # at the reference's trained weights (what equivalence compares)
    probe: Outputs  # at the probe weights (what the differential check compares)
    curve: list[float] | None  # its loss curve over the gate batches, from the initial weights
    # At "trained" and "probe" weights, where the probe could not be moved off every kink: per parameter, what
    # flipping the remaining elements could move its gradient by (absolute; kinks.flip_allowance).
    flips: dict[str, dict[str, float]] = field(default_factory=dict)
    # The loss curve is chaotic: one draw of eager's distance is no scale for it (under nanoGPT's recipe one came
    # out 20 times smaller than another). The largest distance of eager fp32 re-rounded (the rounding fuzz at
    # CURVE_DRAWS seeds): every curve is allowed CURVE_K x at least this.
    curve_spread: float | None = None

    @staticmethod
    def grad_rms(out: Outputs) -> float:
        """The per-element RMS of every gradient together: the scale of a tensor whose own gradient vanishes."""
        grads = out[2].values()
        n = sum(g.numel() for g in grads)
        return math.sqrt(sum(float(g.pow(2).sum()) for g in grads) / n) if n else 0.0


@dataclass
class Errors:
    """One set of outputs' distances from the truth, each relative to its scale (see the module's docstring)."""

    logits: float | None  # None: the model returns no logits
    loss: float
    grads: dict[str, float]
    curve: float | None = None  # the loss curve's largest relative distance, step by step
    extra: dict[str, float] = field(default_factory=dict)
    flips: dict[str, float] = field(default_factory=dict)  # per gradient: what remaining kinks could move it by


def _rel(a: torch.Tensor, truth: torch.Tensor, floor_norm: float = 0.0) -> float:
    scale = max(float(truth.norm()), floor_norm)
    return float((a.double() - truth).norm()) / scale if scale > 0 else (0.0 if float(a.norm()) == 0 else math.inf)


def curve_error(curve: list[float] | None, truth: list[float] | None) -> float | None:
    if curve is None or truth is None:
        return None
    if not all(math.isfinite(v) for v in curve):
        return math.inf
    return max(abs(a - b) / abs(b) for a, b in zip(curve, truth))


def _scale(t: torch.Tensor, rms: float) -> float:
    return max(float(t.norm()), rms * math.sqrt(t.numel()))


def errors(out: Outputs, truth: Outputs, curve: list[float] | None = None,
           truth_curve: list[float] | None = None, flips: dict[str, float] | None = None) -> Errors:
    """How far one set of outputs (at the truth's weights, on its batch) is from it; `flips`: what kinks the probe
    could not avoid could move each gradient by (absolute), made relative as the distances are."""
    logits, loss, grads = out
    t_logits, t_loss, t_grads = truth
    rms = Truth.grad_rms(truth)
    g = {n: _rel(grads[n], t, rms * math.sqrt(t.numel())) if n in grads and grads[n].shape == t.shape else math.inf
         for n, t in t_grads.items()}
    moved = {n: v / _scale(t_grads[n], rms) for n, v in (flips or {}).items()
             if n in t_grads and _scale(t_grads[n], rms) > 0}
    return Errors(logits=_rel(logits, t_logits) if t_logits.numel() else None,
                  loss=abs(loss - t_loss) / abs(t_loss) if t_loss else abs(loss),
                  grads=g, curve=curve_error(curve, truth_curve), flips=moved)


def judge(rung: Errors, eager: tuple[str, Errors], base: tuple[str, Errors] | None, precision: str,
          curve_spread: float | None = None) -> Fp64:
    """The rung's distance from fp64 against FP64_K x the scale (eager at its precision, its base) + the floor,
    quantity by quantity; the record keeps the three distances of the logits, the loss, the worst gradient tensor
    (by its distance over what it is allowed) and the loss curve, whose scale is at least `curve_spread`."""
    k, floor = FP64_K, FP64_FLOOR[precision]
    e, b = eager[1], (base[1] if base else None)

    def one(name: str, r: float | None, ev: float | None, bv: float | None, times: float = k,
            flip: float = 0.0, spread: float | None = None) -> Distance:
        scale = max(v for v in (ev, bv, spread, 0.0) if v is not None)
        return Distance(name=name, eager=ev, base=bv, rung=r, allowed=times * scale + floor + flip,
                        kinks=flip or None, spread=spread)

    logits = one("logits", rung.logits, e.logits, b.logits if b else None) if rung.logits is not None else None
    loss = one("loss", rung.loss, e.loss, b.loss if b else None)
    grads = [one(n, r, e.grads.get(n), b.grads.get(n) if b else None, flip=rung.flips.get(n, 0.0))
             for n, r in rung.grads.items()]
    worst = max(grads, key=lambda d: _over(d), default=None)
    curve = (one("loss curve", rung.curve, e.curve, b.curve if b else None, CURVE_K, spread=curve_spread)
             if rung.curve is not None else None)
    out = Fp64(k=k, floor=floor, scale=eager[0] + (f" and {base[0]} (the rung it built on)" if base else ""),
               logits=logits, loss=loss, grad=worst, curve=curve, tensors=len(grads))
    problems = [f"{'the gradient of ' + d.name if d is worst else d.name} is {d.rung:.2e} from fp64 (allowed "
                f"{d.allowed:.2e}: {CURVE_K if d is curve else k:g}x {out.scale}'s {_largest(d):.2e} + {floor:g}"
                + (f" + {d.kinks:.2e} for kinks the probe could not avoid" if d.kinks else "") + ")"
                for d in (logits, loss, worst, curve) if d is not None and not _over(d) <= 1]
    out.passed = not problems
    out.detail = "; ".join(problems)
    return out


def _over(d: Distance) -> float:
    """The distance over what is allowed (above 1 fails); NaN or inf never passes."""
    if d.rung is None or d.allowed is None:
        return 0.0
    return d.rung / d.allowed if math.isfinite(d.rung) else math.inf


def _largest(d: Distance) -> float:
    return max(v for v in (d.eager, d.base, d.spread, 0.0) if v is not None)
