"""The gates of a run: eager fp32's references, kept per batch shape, and every rung judged by the one rule
(gate_rule.py) against them (docs/measurement.md, rules 7, 9, 12 and 16).

This module builds what the rule compares with, once each, from one fp32 and one float64 model per shape
(reference.py), and turns a gate that cannot run into a failed gate, never a passed one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from speedladder.data.corpus import unigram_entropy
from speedladder.errors import is_oom, one_line
from speedladder.models.capability import FP8_TRANSFORMS
from speedladder.progress import Progress, task_of
from speedladder.records import Explanation, Gate, Kinks, LearnsCheck, ReferenceCost
from speedladder.rungs import architecture, float8_eligible
from speedladder.spec import StepSpec
from speedladder.step.train_step import TrainStep, matmul_precision
from speedladder.step.workload import Workload, free_device_memory
from speedladder.verify import curves, emulated_precision, gate_rule, kink_census, reference
from speedladder.verify.distance import Errors, curve_error, errors
from speedladder.verify.emulated_precision import Arithmetic
from speedladder.verify.probes import Probe
from speedladder.verify.reference import Batch, Reference
from speedladder.verify.tolerance import ALL_ON, Refinements

# What a float64 step costs against an fp32 one, for the reference's estimate before it has run (on the CPUs it was
# measured on, 1.7-2.3x; on a GPU without fast float64 it is more, and the bar's rate takes over once it runs).
FP64_COST = 2.0


def reference_spec(spec: StepSpec) -> StepSpec:
    """Eager fp32 at a spec's shape, with its architecture rungs (they change the function on purpose): what the
    spec is checked against."""
    return StepSpec(spec.batch_size, spec.seq_len, transforms=architecture(spec))


def precision_spec(spec: StepSpec) -> StepSpec:
    """Eager at a spec's shape and arithmetic: its autocast, TF32 and fp8 casts and its architecture rungs, nothing
    else (the scale at its precision)."""
    return StepSpec(spec.batch_size, spec.seq_len, autocast=spec.autocast, tf32=spec.tf32,
                    transforms=tuple(t for t in spec.transforms if t in FP8_TRANSFORMS or t in architecture(spec)))


@dataclasses.dataclass
class _EagerAt:
    """Eager at a lower precision (emulated) on a reference: its distances from the truth, and the elements within
    its own band of a kink at each weights (a record: eager there crosses such kinks as the rung does)."""

    name: str
    trained: Errors
    probe: Errors
    near: dict[str, int | None]


class Gates:
    """Every check a measured rung must pass, and the references they compare with.

    Owns, per batch shape: eager fp32's reference (reference.Reference: its loss curve over the gate batches, its
    trained weights, its outputs on the probe batch at the trained and the probe weights, the truth beside it and
    the kink census that chose the probe), built from one fp32 and one float64 model that stay until `release`; per
    lower precision, eager fp32 with that precision emulated (the scale); the learns-check's eager curves. Each is
    made the first time a rung needs it, and kept.

    For one rung (`check`): its shape's reference (timed by phase, shown with an estimate), then the rule
    (gate_rule.verdict). After the climb, `learns` trains the fastest rung that passed beside eager fp32.

    Leaves behind: a Gate record per rung (every check's figures, the seconds of its steps, the reference's cost where
    it built one, an explanation when it failed) and the rung's probe outputs, which the rungs built on it are
    checked against. Nothing here is timed for speed.
    """

    def __init__(self, work: Workload, progress: Progress, refine: Refinements = ALL_ON) -> None:
        self.work = work
        self.progress = progress
        self.refine = refine
        self.references: dict[StepSpec, Reference | str] = {}  # by reference_spec; a string says why none
        self.costs: dict[StepSpec, ReferenceCost] = {}  # what each reference cost, said by the gate that built it
        self.scales: dict[tuple[StepSpec, StepSpec], _EagerAt] = {}  # eager at a lower precision, per reference
        self.scale_curves: dict[tuple[StepSpec, StepSpec], float | None] = {}  # ... and its curve's distance
        self.spreads: dict[StepSpec, float | None] = {}  # the curve's least scale, per reference
        self.eager_curves: dict[tuple[int, int], list[float]] = {}  # the learns-check's baseline, per shape
        self.entropy = unigram_entropy(work.corpus)
        self._models: dict[tuple[StepSpec, torch.dtype], TrainStep] = {}  # the references' models, reused

    # -- what a spec is judged against ------------------------------------------------------------------------

    def is_reference(self, spec: StepSpec) -> bool:
        """Eager fp32 at the workload's shape (any batch), with the spec's architecture rungs if any: the function
        every other rung is checked against (reference_spec). An architecture rung on eager is its own reference:
        the causality probe, the learns-check and the race judge it."""
        return spec == reference_spec(spec) and spec.seq_len == self.work.cfg.seq_len

    def micro_batch(self, batch_size: int) -> int | None:
        """The micro-batch eager fp32 at this batch is built of: the workload's own batch, where this one is a whole
        multiple of it (the batch rung's), else None (one batch). Eager fp32 at the workload's batch is the
        baseline, which ran, so each micro-batch fits."""
        base = self.work.cfg.batch_size
        return base if batch_size > base and batch_size % base == 0 else None

    def model(self, spec: StepSpec, dtype: torch.dtype = torch.float32) -> TrainStep:
        """Eager at a reference spec in fp32 or float64: one model each, reused by every phase and check until
        `release` (a check resets its weights and optimizer)."""
        key = (spec, dtype)
        if key not in self._models:
            self._models[key] = self.work.step(spec, dtype=None if dtype == torch.float32 else dtype)
        return self._models[key]

    def release(self) -> None:
        """The references' models go (a rung's timing must not share the device with them); they are built again
        when a later check needs one."""
        self._models.clear()
        free_device_memory(self.work.device)

    def _make64(self, spec: StepSpec) -> tuple[Callable[[], TrainStep] | None, str]:
        if self.work.device.type == "mps":
            return None, "float64 does not run on MPS"
        return (lambda: self.model(spec, torch.float64)), ""

    def reference(self, spec: StepSpec, say: Callable[[str], None] | None = None,
                  step_ms: float | None = None) -> Reference | str:
        """Eager fp32 at the spec's shape (with its architecture rungs), built once per shape (reference.py): at a
        batch m times the workload's, from the workload batch's reference and a loss curve of its own; a string
        says why there is none. `step_ms`: a step of eager fp32 at this shape, for the estimate shown."""
        eager = reference_spec(spec)
        if eager in self.references:
            return self.references[eager]
        micro = self.micro_batch(eager.batch_size)
        base: Reference | str | None = None
        if micro is not None:
            base = self.reference(dataclasses.replace(eager, batch_size=micro), say,
                                  step_ms * micro / eager.batch_size if step_ms else None)
            if isinstance(base, str):
                self.references[eager] = base
                return base
        k = self.work.cfg.run.gates.loss_steps
        m = eager.batch_size // micro if micro else 1
        steps = reference.curve_steps(k, m) if micro else k
        arch = f" with {'+'.join(architecture(eager))}" if architecture(eager) else ""
        what = (f"eager fp32{arch} reference at B={eager.batch_size}, T={eager.seq_len}: " + (
            f"its loss curve over {steps} steps (the tokens of {k} at B={micro}), accumulated over micro-batches "
            f"of {micro}, in fp32 and float64" if micro else
            f"{k} steps and its outputs in fp32 and float64, the kink census"))
        # About: eager fp32's steps and float64's, and (at the workload's batch) four more passes and the census.
        estimate = (steps + (0 if micro else 3)) * (1 + FP64_COST) * step_ms / 1e3 if step_ms else None
        with task_of(say or self.progress.scoped("gates"), what, estimate_s=estimate):
            clock = reference.Phases()
            with clock("eager fp32 model and gate batches"):
                step = self.model(eager)
                batches = self.work.gate_batches(eager, steps)
            make64, why = self._make64(eager)
            with matmul_precision(eager):
                if micro is not None:
                    assert isinstance(base, Reference)
                    made = reference.at_batch(base, m, step, make64, batches)
                else:
                    made = reference.build(step, make64, batches, self.refine, why)
            made.seconds = {**clock.seconds, **made.seconds}
        self.references[eager] = made
        self.costs[eager] = ReferenceCost(batch_size=eager.batch_size, seq_len=eager.seq_len, micro=micro,
                                          steps=steps, seconds={k: round(v, 3) for k, v in made.seconds.items()},
                                          total_s=round(sum(made.seconds.values()), 3),
                                          function_at=micro)
        return made

    def eager_reference(self, spec: StepSpec, step_ms: float | None = None) -> Reference | str:
        """What eager fp32 at a spec's shape is probed for causality on: the workload batch's reference and its probe
        batch rolled to this batch (no curve needed), or the reference at this shape."""
        eager = reference_spec(spec)
        micro = self.micro_batch(eager.batch_size)
        if eager in self.references or micro is None:
            return self.reference(eager, step_ms=step_ms)
        base = self.reference(dataclasses.replace(eager, batch_size=micro),
                              step_ms=step_ms * micro / eager.batch_size if step_ms else None)
        if isinstance(base, str):
            return base
        m = eager.batch_size // micro
        return dataclasses.replace(base, batch=reference.rolled(base.batch, m),
                                   probe=dataclasses.replace(base.probe, shape=(eager.batch_size, eager.seq_len),
                                                             errors=None, eager=True))

    # -- the scales the rule asks for (rule.Scales) ------------------------------------------------------------

    def arithmetic(self, spec: StepSpec, step: TrainStep) -> Arithmetic:
        """Eager fp32's arithmetic at the spec's precision, emulated (emulated_precision.py): never the rung's own
        path."""
        fp8, recipe = None, spec.float8_recipe or "rowwise"
        if spec.precision == "fp8":
            prefix = self.work.model.blocks_prefix or "blocks."
            fp8 = emulated_precision.fp8_weights(step.model, lambda m, name: float8_eligible(m, name, prefix, recipe))
        return emulated_precision.arithmetic(spec.precision, fp8, bf16_rest=spec.autocast == "bf16",
                                             fp8_recipe=recipe)

    def eager_at(self, spec: StepSpec, ref: Reference) -> tuple[str, Errors, Errors] | None:
        """Eager at the spec's precision and its distances from the truth at the trained and the probe weights: eager
        fp32's are the reference's own; at a lower precision, eager fp32 (with the spec's architecture rungs) with
        that precision's rounding emulated, once per reference: its outputs where the function is judged (at a big
        batch, the workload batch's reference), its curve at the spec's own shape (the emulated_precision switch
        off: none)."""
        p = precision_spec(spec)
        if self.is_reference(p):
            assert ref.probe.errors is not None
            return "eager fp32", *ref.probe.errors
        if not self.refine.emulated_precision:
            return None
        eager = reference_spec(spec)
        micro = self.micro_batch(eager.batch_size)
        func = dataclasses.replace(eager, batch_size=micro) if micro else eager  # where the function is judged
        fref = self.references.get(func) if micro else ref
        assert isinstance(fref, Reference)
        key = (func, dataclasses.replace(p, batch_size=func.batch_size))
        if key not in self.scales:
            plain = self.model(func)
            emulated = self.arithmetic(p, plain)
            with matmul_precision(func):
                trained, at_probe, _ = reference.eager_at(plain, fref, emulated, with_curve=False)
                near = self._near_at(plain, fref, emulated)
            t = fref.truth
            self.scales[key] = _EagerAt(f"eager {p.precision} (emulated)", errors(trained, t.trained),
                                        errors(at_probe, t.probe), near)
        if (eager, p) not in self.scale_curves:
            plain = self.model(eager)
            with matmul_precision(eager), self.arithmetic(p, plain)():
                curve = curves.loss_curve(plain, ref.batches, ref.micro)
            self.scale_curves[(eager, p)] = curve_error(curve, ref.truth.curve)
        e = self.scales[key]
        return e.name, e.trained, dataclasses.replace(e.probe, curve=self.scale_curves[(eager, p)])

    def _near_at(self, plain: TrainStep, ref: Reference, emulated: Arithmetic) -> dict[str, int | None]:
        """Elements within rounding of a kink at a lower precision's band, at the trained and the probe weights."""
        if not (self.refine.kink_census and ref.truth.fp64):
            return {}
        step64 = self.model(reference_spec(plain.spec), torch.float64)
        out: dict[str, int | None] = {}
        for k, w in (("trained", ref.weights), ("probe", ref.probe_weights)):
            c = kink_census.census(step64, plain, w, ref.batch, emulated)
            out[k] = None if c.why else c.near
        return out

    def spread(self, spec: StepSpec, ref: Reference) -> float | None:
        """The curve's least scale, once per reference: eager fp32 re-rounded (reference.spread)."""
        eager = reference_spec(spec)
        if eager not in self.spreads:
            with matmul_precision(eager):
                self.spreads[eager] = reference.spread(self.model(eager), ref)
            ref.truth.curve_spread = self.spreads[eager]
        return self.spreads[eager]

    def census(self, spec: StepSpec, ref: Reference, weights: str) -> Kinks | None:
        """One check's kink census: the reference's at these weights, with the count at the spec's own precision's
        band where that is lower than fp32's."""
        found = ref.kinks.get(weights)
        if found is None:
            return None
        out = dataclasses.replace(found, precision=spec.precision, by_op=dict(found.by_op), rows=list(found.rows))
        if spec.precision != "fp32":
            eager, p = reference_spec(spec), precision_spec(spec)
            micro = self.micro_batch(eager.batch_size)
            key = ((dataclasses.replace(eager, batch_size=micro), dataclasses.replace(p, batch_size=micro)) if micro
                   else (eager, p))
            at = self.scales.get(key)
            out.near_at_precision = at.near.get(weights) if at else None
        return out

    def adamw(self, spec: StepSpec) -> tuple[TrainStep, list[Batch]]:
        return (self.work.step(dataclasses.replace(spec, optimizer="adamw")),
                self.work.gate_batches(spec, self.work.cfg.run.gates.target_steps))

    def explaining(self, spec: StepSpec) -> tuple[TrainStep, TrainStep | None, Arithmetic]:
        plain = self.model(reference_spec(spec))
        make64, _ = self._make64(reference_spec(spec))
        ref = self.references.get(reference_spec(spec))
        step64 = make64() if make64 is not None and isinstance(ref, Reference) and ref.truth.fp64 else None
        return plain, step64, self.arithmetic(spec, plain)

    # -- one rung ----------------------------------------------------------------------------------------------

    def check(self, step: TrainStep, ref: Reference | str | None, base: Probe | None, base_name: str | None,
              say: Callable[[str], None], step_ms: float | None = None) -> tuple[Gate, Probe | None]:
        """Every gate that applies to the step (`ref`: its shape's reference, made here when None), and its outputs at
        the probe weights (for the rungs built on it). A gate that cannot run fails the rung but keeps its speed;
        the reason is in the record."""
        spec = step.spec
        eager = reference_spec(spec)
        before = set(self.costs)
        gate: Gate | None = None
        mine: Probe | None = None
        try:
            if self.is_reference(spec):  # eager fp32 itself: probed for causality, the reference of the others
                found = self.eager_reference(spec, step_ms)
                if isinstance(found, str):
                    return Gate(passed=False, reference=True, detail=found), None
                gate = gate_rule.causality_only(step, found)
                mine = dataclasses.replace(found.probe, eager=True)
            else:
                if ref is None:
                    ref = self.reference(spec, say, step_ms)
                if isinstance(ref, str):
                    return Gate(passed=False, detail=ref), None
                if base is not None and base.eager and base.shape == ref.probe.shape:
                    base = dataclasses.replace(base, errors=ref.probe.errors)  # eager fp32 here: the reference's own
                gates = self.work.cfg.run.gates
                say("gates: equivalence with eager fp32, causality, the rung it built on, then " + (
                    f"loss band over {len(ref.batches)} batches" if spec.same_update else
                    f"tokens to AdamW's loss over {gates.target_steps} batches"))
                with matmul_precision(spec):
                    gate, mine = gate_rule.verdict(step, ref, base, base_name, self,
                                              gate_rule.Settings(gates.loss_band, gates.target_steps))
                gate_rule.explain(step, ref, gate, self, self.refine, say)
        except Exception as e:  # noqa: BLE001 -- the speed stays measured; the rung is unverified, so not passed
            why = "ran out of memory" if is_oom(e) else one_line(e)
            if eager not in self.references and not self.is_reference(spec):
                self.references[eager] = f"the eager fp32 reference at B={eager.batch_size} could not be made: {why}"
            if gate is None:
                return Gate(passed=False, detail=f"the gates could not run: {why}"), None
            gate.explanation = Explanation(summary=f"no explanation: it failed to run ({why})")
        gate.references = [c for k, c in self.costs.items() if k not in before]  # what this rung's gate built
        return gate, mine

    # -- after the climb ---------------------------------------------------------------------------------------

    def learns(self, spec: StepSpec, say: Callable[[str], None]) -> LearnsCheck:
        """The learns-check of one spec: the same batches and steps as eager fp32 at its shape (docs/measurement.md,
        rule 9); eager's curve is trained once per shape. A failure to run is the caller's to record."""
        g = self.work.cfg.run.gates
        key = (spec.batch_size, spec.seq_len)
        # The reference's lines are named as what they are, apart from the rung's own (which `say` names).
        reference_say = self.progress.scoped(f"learns-check: eager fp32 reference, B={key[0]} T={key[1]}")
        if key not in self.eager_curves:
            reference_say(f"over the same {g.learns_steps} batches as the rung")
            self.eager_curves[key] = self._curve(StepSpec(*key), reference_say)
        if spec == StepSpec(*key):  # eager fp32 at this shape (a batch rung built on eager): the same steps
            say("the same step as eager fp32 at this shape: its curve is the reference's, not trained twice")
            curve = self.eager_curves[key]
        else:
            curve = self._curve(spec, say)
        return curves.learns_check(curve, self.eager_curves[key], g.learns_band, self.entropy)

    def _curve(self, spec: StepSpec, say: Callable[[str], None]) -> list[float]:
        # Eager fp32 (the learns-check's baseline) at a big batch is accumulated as its reference is.
        micro = self.micro_batch(spec.batch_size) if self.is_reference(spec) else None
        try:
            with matmul_precision(spec):
                return curves.train_curve(self.work.step(spec), self.work.stream(spec),
                                          self.work.cfg.run.gates.learns_steps, on_progress=say, micro=micro)
        finally:
            free_device_memory(self.work.device)
