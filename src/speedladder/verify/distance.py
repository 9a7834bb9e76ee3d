"""A rung's distance from the truth, and the judge: the arithmetic of the one rule (docs/measurement.md, rule 12).

A fixed tolerance chosen on one processor cries wolf on another: a compiled kernel that rounds differently from
eager is still right, and how far apart the two may be depends on how far each is from the exact result. So the
gates measure that distance instead of assuming it, as dynamo's accuracy checker does
(torch._dynamo.utils.same with fp64_ref): per quantity, the rung's distance from the truth (eager in float64) may be
at most k times the scale (the largest distance of eager at its precision, of the rung it built on and, for a loss
curve, of eager fp32 re-rounded) plus a floor (tolerance.py). Where float64 cannot run, eager fp32 is the truth
and the verdict says so.

A distance is relative to the truth's norm, or, for a gradient that vanishes (a key bias: softmax does not see a
constant added to a row's scores, so its gradient is zero and fp32 computes rounding noise there), to the norm the
model's mean gradient would give a tensor of that size: no tensor is judged finer than the model's gradients are.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from speedladder.records.checks import Distance, Fp64
from speedladder.verify.tolerance import EAGER_AS_TRUTH, Tolerance

Outputs = tuple[torch.Tensor, float, dict[str, torch.Tensor]]  # logits, loss, gradients (probes.outputs)


@dataclass
class Truth:
    """Eager in float64 at one batch shape, on the host: what every rung's error is measured from (or eager fp32
    itself, where float64 cannot run: `fp64` False)."""

    trained: Outputs  # at the reference's trained weights (what equivalence compares)
    probe: Outputs  # at the probe weights (what the differential check compares)
    curve: list[float] | None  # its loss curve over the gate batches, from the initial weights
    # At "trained" and "probe" weights, where the probe could not be moved off every kink: per parameter, what
    # flipping the remaining elements could move its gradient by (absolute; flip_pricing.flip_allowance).
    flips: dict[str, dict[str, float]] = field(default_factory=dict)
    # The loss curve is chaotic: one draw of eager's distance is no scale for it (under nanoGPT's recipe one came
    # out 20 times smaller than another). The largest distance of eager fp32 re-rounded (the rounding fuzz at
    # CURVE_DRAWS seeds): every curve is allowed curve_k x at least this. Measured when a curve needs it.
    curve_spread: float | None = None
    fp64: bool = True  # False: eager fp32 stands in for the truth

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


def judge(rung: Errors, eager: tuple[str, Errors] | None, base: tuple[str, Errors] | None, precision: str,
          tol: Tolerance, fp64: bool = True, curve_spread: float | None = None) -> Fp64:
    """The rule, quantity by quantity: the rung's distance from the truth against tol.k x the scale (eager at its
    precision, the base it built on, and for the loss curve eager fp32 re-rounded) + the floor, and, where eager fp32
    is the truth (fp64 False), what eager fp32's own error may be. The record keeps the three distances of the
    logits, the loss, the worst gradient tensor (by its distance over what it is allowed) and the loss curve."""
    e, b = (eager[1] if eager else None), (base[1] if base else None)

    def one(name: str, r: float | None, ev: float | None, bv: float | None, times: float,
            flip: float = 0.0, spread: float | None = None) -> Distance:
        scale = max(v for v in (ev, bv, spread, 0.0) if v is not None)
        floor = tol.floor + (0.0 if fp64 else EAGER_AS_TRUTH.of(name))
        return Distance(name=name, eager=ev, base=bv, rung=r, allowed=times * scale + floor + flip,
                        kinks=flip or None, spread=spread)

    logits = (one("logits", rung.logits, e.logits if e else None, b.logits if b else None, tol.k)
              if rung.logits is not None else None)
    loss = one("loss", rung.loss, e.loss if e else None, b.loss if b else None, tol.k)
    grads = [one(n, r, e.grads.get(n) if e else None, b.grads.get(n) if b else None, tol.k,
                 flip=rung.flips.get(n, 0.0)) for n, r in rung.grads.items()]
    worst = max(grads, key=over, default=None)
    curve = (one("loss curve", rung.curve, e.curve if e else None, b.curve if b else None, tol.curve_k,
                 spread=curve_spread) if rung.curve is not None else None)
    parts = ([eager[0]] if eager else []) + ([f"{base[0]} (the rung it built on)"] if base else [])
    scale = " and ".join(parts) or "the floor alone (no eager at this precision, no base)"
    out = Fp64(k=tol.k, floor=tol.floor, scale=scale, logits=logits, loss=loss, grad=worst, curve=curve,
               tensors=len(grads), truth="fp64" if fp64 else "eager fp32")
    problems = [f"{'the gradient of ' + d.name if d is worst else d.name} is {d.rung:.2e} from "
                f"{'fp64' if fp64 else 'eager fp32'} (allowed {d.allowed:.2e}: "
                f"{tol.curve_k if d is curve else tol.k:g}x {out.scale}'s {_largest(d):.2e} + the floor"
                + (f" + {d.kinks:.2e} for kinks the probe could not avoid" if d.kinks else "") + ")"
                for d in (logits, loss, worst, curve) if d is not None and not over(d) <= 1]
    out.passed = not problems
    out.detail = "; ".join(problems)
    return out


def over(d: Distance) -> float:
    """The distance over what is allowed (above 1 fails); NaN or inf never passes."""
    if d.rung is None or d.allowed is None:
        return 0.0
    return d.rung / d.allowed if math.isfinite(d.rung) else math.inf


def _largest(d: Distance) -> float:
    return max(v for v in (d.eager, d.base, d.spread, 0.0) if v is not None)
