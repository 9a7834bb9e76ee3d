"""What the one rule allows, per precision, and the switches of its refinements (docs/measurement.md, rule 12).

A rung's distance from the truth may be at most `k` times the scale (the largest distance of eager at its
precision, of the rung it built on, of eager fp32 re-rounded) plus a floor; a loss curve `curve_k` times. Where
float64 cannot run, eager fp32 stands in for the truth (the verdict's status says so) and the allowance grows by
what eager fp32's own error may be (`EAGER_AS_TRUTH`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Floors:
    """A floor per judged quantity (relative distances)."""

    logits: float
    loss: float
    grad: float
    curve: float

    def of(self, quantity: str) -> float:
        return {"logits": self.logits, "loss": self.loss, "loss curve": self.curve}.get(quantity, self.grad)


@dataclass(frozen=True)
class Tolerance:
    """One precision's factors and floors."""

    # The multiplier on the scale: dynamo's is 2 (3 for bf16 and fp16); ours judges every gradient tensor on its
    # own rather than the outputs as a whole, so it keeps one more step of room (the measurements behind it:
    # docs/measurement.md, rule 12).
    k: float
    # A loss curve is chaotic: one step's rounding is carried and amplified by every later update, so two honest
    # curves' distances differ by several times; a wrong update rule moves it by far more.
    curve_k: float
    # The smallest relative distance always allowed, for a quantity eager happens to get almost exact: in fp32 a
    # long reduction reordered (~sqrt(n) roundings of 6e-8: ~1e-5 at n = 16k tokens); at lower precisions eager's
    # own distance is orders above it, and the floor only keeps a zero from being demanded.
    floor: float
    # Causality: the past logits may move at most causal_noise_k x the rung's own run-to-run noise, or this
    # fraction of the logits' RMS.
    causal_floor: float
    causal_noise_k: float = 4.0


# Without float64, eager fp32 is the truth, and a correct fp32 rung differs from it by eager's own error, which
# nothing measures: the allowance grows by what it may be (the fixed tolerances fp32 rungs were judged by before
# the fp64 rule: the logits' and the curve's 1e-4, the loss's 1e-5, a gradient's 1e-3 per tensor).
EAGER_AS_TRUTH = Floors(logits=1e-4, loss=1e-5, grad=1e-3, curve=1e-4)

TOLERANCES: dict[str, Tolerance] = {
    "fp32": Tolerance(k=3.0, curve_k=10.0, floor=1e-5, causal_floor=1e-6),
    # tf32 and fp16 keep a 10-bit mantissa (fp16: tf32's floors).
    "tf32": Tolerance(k=3.0, curve_k=10.0, floor=1e-4, causal_floor=1e-5),
    "fp16": Tolerance(k=3.0, curve_k=10.0, floor=1e-4, causal_floor=1e-5),
    "bf16": Tolerance(k=3.0, curve_k=10.0, floor=1e-3, causal_floor=1e-4),
    # fp8's rowwise recipe scales each token's row on its own, so no scale sees the future: bf16's causal floor (a
    # per-tensor scale would move the past, and this floor catches it).
    "fp8": Tolerance(k=3.0, curve_k=10.0, floor=1e-2, causal_floor=1e-4),
}


@dataclass(frozen=True)
class Refinements:
    """The refinements of the one rule, each behind a switch, all on by default. Each exists to prevent a false
    failure (bisection: to name the op at fault), and tests/verify/ switches each off to show it."""

    kink_census: bool = True  # the probe moved off elements within rounding of a kink (kink_census.py)
    flip_pricing: bool = True  # the kinks the probe cannot avoid, priced into the allowance (flip_pricing.py)
    emulated_precision: bool = True  # a lower precision's scale: eager fp32 with it emulated (emulated_precision.py)
    bisection: bool = True  # a failed gate names the module where the divergence starts (bisection.py)


ALL_ON = Refinements()
