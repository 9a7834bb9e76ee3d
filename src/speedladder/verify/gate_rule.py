"""The rule every rung's gate is judged by, in the order it runs (docs/measurement.md, rules 7, 12 and 16).

Is this rung the same function? Read top to bottom in `verdict`:

1. Outputs at the reference weights: the rung's logits, loss and every gradient at eager fp32's trained weights
   (equivalence) and at the probe weights (differential), on the reference's probe batch; its loss curve over the
   gate batches, where it keeps AdamW's update.
2. Distance from the truth: each relative to the truth's norm (distance.py). The truth is eager in float64; where
   float64 cannot run, eager fp32 stands in, and the verdict's status says so (`Fp64.truth`).
3. The allowed scale: eager's own distance at the rung's precision (eager fp32's; at a lower precision eager fp32
   with that precision emulated, never the rung's own code), the rung it built on (same precision and shape), and
   for the loss curve eager fp32 re-rounded (measured only when the curve would fail without it: it can only
   widen the allowance).
4. Judge, quantity by quantity: distance <= k x the scale + the floor (tolerance.py), plus the price of the kinks the
   probe could not avoid.
5. The loss band against eager fp32's curve, or, for a rung that changes the update, the tokens it needs to reach
   AdamW's loss.
6. Causality: the past logits must not move when the future tokens change.
7. On failure, the op at fault (bisection.py; `explain`, after the verdict, which stands whatever happens to it).

The refinements (tolerance.Refinements) are switches of steps 1-4 and 7; nothing else decides a verdict.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from speedladder.records import Differential, Equivalence, Fp64, Gate, Kinks
from speedladder.spec import StepSpec
from speedladder.step.train_step import TrainStep, matmul_precision
from speedladder.verify import bisection, curves, probes
from speedladder.verify.distance import Errors, errors, judge, over
from speedladder.verify.emulated_precision import Arithmetic
from speedladder.verify.reference import Batch, Phases, Reference
from speedladder.verify.tolerance import TOLERANCES, Refinements


@dataclass(frozen=True)
class Settings:
    """What the run's configuration sets for the rule (config.run.GateConfig)."""

    loss_band: float
    target_steps: int


class Scales(Protocol):
    """What the rule asks of the run (verify.gates.Gates provides it): the scales and models it may need."""

    def eager_at(self, spec: StepSpec, ref: Reference) -> tuple[str, Errors, Errors] | None:
        """Eager at the spec's precision and its distances from the truth at the trained and the probe weights; None
        where it is not measured (the emulated_precision switch off, at a lower precision)."""

    def spread(self, spec: StepSpec, ref: Reference) -> float | None:
        """The curve's least scale: eager fp32 re-rounded (computed once per reference)."""

    def census(self, spec: StepSpec, ref: Reference, weights: str) -> Kinks | None:
        """One check's kink census at the rung's precision."""

    def adamw(self, spec: StepSpec) -> tuple[TrainStep, list[Batch]]:
        """AdamW at the spec, and the batches tokens to a target trains over."""

    def explaining(self, spec: StepSpec) -> tuple[TrainStep, TrainStep | None, Arithmetic]:
        """Eager fp32 with the spec's architecture, the float64 model (None: none runs) and the spec's arithmetic
        emulated: what bisection compares the rung with."""


def verdict(step: TrainStep, ref: Reference, base: probes.Probe | None, base_name: str | None, scales: Scales,
            settings: Settings) -> tuple[Gate, probes.Probe]:
    """Every check of one rung, in the rule's order (the module's docstring, steps 1-6); the gate and the rung's
    outputs at the probe weights, what the rungs built on it are checked against."""
    clock = Phases()
    spec, truth = step.spec, ref.truth
    tol = TOLERANCES[spec.precision]

    # 1. Outputs at the reference weights, and the loss curve.
    with clock("outputs"):
        trained = probes.outputs(step, ref.weights, ref.batch, ref.probe_rows)
        p_logits, p_loss, p_grads = probes.outputs(step, ref.probe_weights, ref.batch, ref.probe_rows)
    curve = None
    if spec.same_update:
        with clock("loss curve"):
            curve = curves.loss_curve(step, ref.batches)
    mine = probes.Probe(p_logits, p_grads, curve, spec.precision, (spec.batch_size, spec.seq_len), p_loss)

    # 2. Distance from the truth (float64, or eager fp32 standing in for it).
    mine.errors = (errors(trained, truth.trained, flips=truth.flips.get("trained")),
                   errors((p_logits, p_loss, p_grads), truth.probe, curve, truth.curve, flips=truth.flips.get("probe")))

    # 3. The allowed scale: eager at this precision (emulated below fp32), the base at the same arithmetic and shape.
    with clock("scale"):
        e = scales.eager_at(spec, ref)
    eager = ((e[0], e[1]), (e[0], e[2])) if e else (None, None)
    same = base is not None and base.errors is not None and (base.shape, base.precision) == (mine.shape, mine.precision)
    below = ((base_name or "", base.errors[0]), (base_name or "", base.errors[1])) if same and base and base.errors \
        else (None, None)

    # 4. Judge; a curve that would fail asks for eager fp32 re-rounded, which can only widen its allowance.
    eq = judge(mine.errors[0], eager[0], below[0], spec.precision, tol, truth.fp64)
    at_probe = judge(mine.errors[1], eager[1], below[1], spec.precision, tol, truth.fp64, truth.curve_spread)
    if at_probe.curve is not None and over(at_probe.curve) > 1 and truth.curve_spread is None:
        with clock("curve spread"):
            spread = scales.spread(spec, ref)
        at_probe = judge(mine.errors[1], eager[1], below[1], spec.precision, tol, truth.fp64, spread)
    eq.kinks, at_probe.kinks = scales.census(spec, ref, "trained"), scales.census(spec, ref, "probe")
    equivalence, differential = _equivalence(spec, ref, trained, eq), _differential(spec, at_probe, same, base_name)

    # 5. The loss band, or tokens to AdamW's loss for a rung that changes the update.
    band = curves.loss_band(curve, ref.curve, settings.loss_band) if curve else curves.no_loss_band(spec)
    target = None
    if curve is None:
        with clock("tokens to a target"):
            target = curves.tokens_to_target(step, *scales.adamw(spec))

    # 6. Causality.
    with clock("causality"):
        causal = probes.causality(step, ref.probe_weights, ref.batch, ref.probe_rows, step.vocab_size)

    checks = [equivalence, band, causal, differential] + ([target] if target else [])
    failed = next((c for c in checks if not c.passed), None)
    gate = Gate(passed=failed is None, detail=failed.detail if failed else "", equivalence=equivalence,
                loss_band=band, tokens_to_target=target, causality=causal, differential=differential,
                seconds={k: round(v, 3) for k, v in clock.seconds.items()})
    return gate, mine


def explain(step: TrainStep, ref: Reference, gate: Gate, scales: Scales, refine: Refinements,
            say: Callable[[str], None] = lambda m: None) -> None:
    """7. On failure, the op at fault (bisection.py): the gate's explanation, and what finding it cost. Apart from
    `verdict`, so that a verdict stands whatever happens to its explanation."""
    if gate.passed or not refine.bisection:
        return
    say("gate failed: looking for where the divergence starts")
    start = time.perf_counter()
    plain, step64, emulated = scales.explaining(step.spec)
    with matmul_precision(step.spec):
        gate.explanation = bisection.explain(step, ref, gate, plain, step64, emulated)
    gate.seconds["bisection"] = round(time.perf_counter() - start, 3)


def _equivalence(spec: StepSpec, ref: Reference, trained: tuple, fp64: Fp64) -> Equivalence:
    """The equivalence record: the rung against eager fp32 at the trained weights (figures kept for the reader),
    judged by its distance from the truth."""
    logits, loss, grads = trained
    grad_name, grad_err = probes.worst_grad(grads, ref.grads)
    seen = ref.logits.numel() > 0  # False: the model returns no logits; its loss and gradients are compared
    return Equivalence(
        precision=spec.precision, logits_max_abs_err=float((logits - ref.logits).abs().max()) if seen else None,
        logits_rel_err=probes.rel(logits, ref.logits) if seen else None, loss=loss, loss_ref=ref.loss,
        grad_rel_err=grad_err, grad_worst=grad_name,
        logits=None if seen else "not compared: the forward returns a loss only",
        rule="fp64" if ref.truth.fp64 else "eager fp32", fp64=fp64, fp64_why=ref.fp64_why,
        passed=fp64.passed, detail="" if fp64.passed else "equivalence: " + fp64.detail)


def _differential(spec: StepSpec, d: Fp64, same: bool, base: str | None) -> Differential:
    """The differential record: the rung at the probe weights, its distance from the truth judged against eager's
    at its precision and, where it has the same precision and shape (`same`), the base's."""
    return Differential(
        base=base if same else None, precision=spec.precision, fp64=d,
        rule="fp64" if d.truth == "fp64" else "eager fp32",
        logits_rel=d.logits.rung if d.logits else None, logits_allowed=d.logits.allowed if d.logits else None,
        grad_worst=d.grad.name if d.grad else None, grad_rel=d.grad.rung if d.grad else None,
        grad_allowed=d.grad.allowed if d.grad else None, k=d.k, floor=d.floor,
        curve_rel=d.curve.rung if d.curve else None, curve_allowed=d.curve.allowed if d.curve else None,
        passed=d.passed, detail="" if d.passed else "differential: " + d.detail)


def causality_only(step: TrainStep, ref: Reference) -> Gate:
    """Eager fp32 itself (any batch, with its architecture rungs): the reference every other rung is checked
    against, probed for causality alone."""
    start = time.perf_counter()
    causal = probes.causality(step, ref.probe_weights, ref.batch, ref.probe_rows, step.vocab_size)
    return Gate(passed=causal.passed, reference=True, causality=causal,
                detail=causal.detail or "eager fp32 is the reference the other rungs are checked against",
                seconds={"causality": round(time.perf_counter() - start, 3)})
