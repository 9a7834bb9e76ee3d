"""The gates a measured rung must pass, run against eager fp32 references kept per batch shape.

correctness.py holds the checks themselves; this module decides which apply to a
step, builds the references they compare with (once per shape), and turns a
check that cannot run into a failed gate, never a passed one
(docs/measurement.md, rules 7 and 9).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from speedladder.data import unigram_entropy
from speedladder.errors import is_oom, one_line
from speedladder.progress import Progress
from speedladder.records import Differential, Explanation, Fp64, Gate, Kinks, LearnsCheck, not_applicable
from speedladder.rungs import StepSpec, architecture, float8_eligible, rounding_fuzz
from speedladder.spec import FP8_TRANSFORMS
from speedladder.step import TrainStep, matmul_precision
from speedladder.verify import bisect, correctness, emulate, kinks, probes, truth
from speedladder.verify.truth import Errors
from speedladder.workload import Workload, free_device_memory


def reference_spec(spec: StepSpec) -> StepSpec:
    """Eager fp32 at a spec's shape, with its architecture rungs (they change the function on purpose): what the
    spec is checked against."""
    return StepSpec(spec.batch_size, spec.seq_len, transforms=architecture(spec))


def precision_spec(spec: StepSpec) -> StepSpec:
    """Eager at a spec's shape and arithmetic: its autocast, TF32 and fp8 casts and its architecture rungs, nothing
    else (truth.py's scale)."""
    return StepSpec(spec.batch_size, spec.seq_len, autocast=spec.autocast, tf32=spec.tf32,
                    transforms=tuple(t for t in spec.transforms if t in FP8_TRANSFORMS or t in architecture(spec)))


class Gates:
    """Every check a measured rung must pass, and the references they compare with (docs/measurement.md, rules 7,
    9 and 12).

    Owns, per batch shape: the eager fp32 reference (its loss curve over the gate batches, its trained weights,
    its outputs on the probe batch at the trained and the probe weights), the float64 truth beside it and the kink
    census that chose the probe batch; per lower precision, eager fp32 with that precision emulated (the scale);
    and the learns-check's eager curves. Each is made the first time a rung needs it, and kept.

    In order, for one rung (check): the reference of its shape; its outputs at the trained weights; its loss curve
    (or tokens to AdamW's loss, for a rung that changes the update); causality; its distances from fp64 judged
    against eager's at its precision and its base's; on a failure, the explanation (bisect.py). After the climb,
    learns() trains the fastest rung that passed beside eager fp32.

    Leaves behind: a Gate record per rung (every check's figures, its census, an explanation when it failed) and
    the rung's probe outputs, which the rungs built on it are checked against. Nothing is timed here.
    """

    def __init__(self, work: Workload, progress: Progress) -> None:
        self.work = work
        self.progress = progress
        self.references: dict[StepSpec, correctness.Reference | str] = {}  # by reference_spec
        # Eager at each precision other than fp32, per shape: its distances from fp64 (eager_at).
        self.precision_refs: dict[StepSpec, tuple[str, Errors, Errors]] = {}
        # Elements within rounding of a kink at each lower precision's band (eager_at), per weights.
        self.near_at: dict[StepSpec, dict[str, int | None]] = {}
        self.eager_curves: dict[tuple[int, int], list[float]] = {}  # the learns-check's baseline, per shape
        self.entropy = unigram_entropy(work.corpus)

    def is_reference(self, spec: StepSpec) -> bool:
        """Eager fp32 at the workload's shape (any batch), with the spec's architecture rungs if any: the function
        every other rung is checked against (reference_spec). An architecture rung on eager is its own reference:
        the causality probe, the learns-check and the race judge it."""
        return spec == reference_spec(spec) and spec.seq_len == self.work.cfg.seq_len

    def micro_batch(self, batch_size: int) -> int | None:
        """The micro-batch eager fp32 at this batch is built over: the workload's own batch, where this one is a
        whole multiple of it (the batch rung's), else None (one batch). Eager fp32 at the workload's batch is the
        baseline, which ran, so each micro-batch fits; the accumulated loss and gradients are the big batch's."""
        base = self.work.cfg.batch_size
        return base if batch_size > base and batch_size % base == 0 else None

    def reference(self, spec: StepSpec) -> correctness.Reference | str:
        """Eager fp32 at the spec's shape (with its architecture rungs), once per shape, compared on a probe batch
        where no element lies within rounding of a kink (kinks.py), with its float64 truth; a string says why it
        could not be made."""
        eager = reference_spec(spec)
        if eager not in self.references:
            k = self.work.cfg.run.gates.loss_steps
            micro = self.micro_batch(eager.batch_size)
            arch = f" with {'+'.join(architecture(eager))}" if architecture(eager) else ""
            self.progress(f"eager fp32{arch} reference at B={eager.batch_size}, T={eager.seq_len} ({k} steps"
                          + (f", gradients accumulated over micro-batches of {micro})" if micro else ")"), "gates")
            try:
                step = self.work.step(eager)
                step64, why = self._fp64_step(eager)
                batches = self.work.gate_batches(eager, k)
                choose = None if step64 is None else self._chooser(step64, step, batches, micro)
                ref = correctness.reference(step, batches, micro, choose)
                if step64 is None:
                    ref.fp64_why = why
                else:
                    self.references[eager] = ref  # kept if the truth fails below: judged by the table, as said
                    ref = self._with_truth(ref, step64, eager)
                self.references[eager] = ref
            except Exception as e:  # noqa: BLE001 -- recorded in each gate that needed it; the ladder goes on
                why = "ran out of memory" if is_oom(e) else f"failed ({one_line(e)})"
                self.references[eager] = f"the eager fp32{arch} reference at B={eager.batch_size} {why}: not verified"
            finally:
                free_device_memory(self.work.device)
        return self.references[eager]

    def _fp64_step(self, eager: StepSpec) -> tuple[TrainStep | None, str]:
        """The float64 step the truth and the kink census run, or why there is none (the gates then judge by the
        per-precision table against eager fp32, and say so)."""
        if self.work.device.type == "mps":
            return None, "float64 does not run on MPS: judged by the per-precision tolerances against eager fp32"
        try:
            return self.work.step(eager, dtype=torch.float64), ""
        except Exception as e:  # noqa: BLE001 -- a model that will not run in float64: the table's rule, said
            why = "ran out of memory" if is_oom(e) else f"failed ({one_line(e)})"
            return None, f"the float64 reference {why}: judged by the per-precision tolerances against eager fp32"

    def _chooser(self, step64: TrainStep, step: TrainStep, batches: list[kinks.Batch],
                 micro: int | None) -> correctness.ProbeChooser:
        """The probe batch at the trained weights: kinks.choose_probe, or the first gate batch with the reason
        where the census cannot run."""
        def choose(weights: dict[str, torch.Tensor]) -> kinks.Chosen:
            named = {"trained": weights, "probe": probes.amplified(weights)}
            try:
                return kinks.choose_probe(step64, step, named, batches, micro)
            except Exception as e:  # noqa: BLE001 -- the gate then judges as before, and the record says why
                why = f"the kink census failed ({one_line(e)}): the probe is the first gate batch, unexamined"
                return batches[0], {k: Kinks(ran=False, detail=why, band=kinks.BAND) for k in named}, {}
        return choose

    def _with_truth(self, ref: correctness.Reference, step64: TrainStep, eager: StepSpec) -> correctness.Reference:
        """The reference with its float64 truth (truth.py), and the curve's least scale from eager fp32 re-rounded
        (the rounding fuzz at truth.CURVE_DRAWS seeds); or the reason there is none: then the gates judge by the
        per-precision table, as the record says."""
        try:
            rerounded = []
            for seed in range(truth.CURVE_DRAWS):
                step = self.work.step(eager)
                rounding_fuzz(seed=seed)(step.model)
                rerounded.append(step)
            with matmul_precision(eager):
                return correctness.with_truth(ref, step64, rerounded)
        except Exception as e:  # noqa: BLE001 -- a model that will not run in float64: the table's rule, said
            why = "ran out of memory" if is_oom(e) else f"failed ({one_line(e)})"
            ref.fp64, ref.fp64_why = None, (f"the float64 reference {why}: judged by the per-precision tolerances "
                                            "against eager fp32")
            return ref
        finally:
            free_device_memory(self.work.device)

    def arithmetic(self, spec: StepSpec, step: TrainStep) -> emulate.Arithmetic:
        """Eager fp32's arithmetic at the spec's precision, emulated (emulate.py): never the rung's own path."""
        fp8, recipe = None, spec.float8_recipe or "rowwise"
        if spec.precision == "fp8":
            prefix = self.work.model.blocks_prefix or "blocks."
            fp8 = emulate.fp8_weights(step.model, lambda m, name: float8_eligible(m, name, prefix, recipe))
        return emulate.arithmetic(spec.precision, fp8, bf16_rest=spec.autocast == "bf16", fp8_recipe=recipe)

    def eager_at(self, spec: StepSpec, ref: correctness.Reference) -> tuple[str, Errors, Errors]:
        """Eager at the spec's precision and its distances from fp64 at the trained and the probe weights: the
        scale a rung at that precision is judged on. Eager fp32's are the reference's own; at a lower precision it
        is eager fp32 (with the spec's architecture rungs) with that precision's rounding emulated, never autocast
        or the rung's own code (emulate.py), measured once per shape."""
        p = precision_spec(spec)
        if self.is_reference(p):
            assert ref.probe.errors is not None
            return "eager fp32", *ref.probe.errors
        if p not in self.precision_refs:
            assert ref.fp64 is not None
            step = self.work.step(reference_spec(spec))
            emulated = self.arithmetic(p, step)
            try:
                with matmul_precision(reference_spec(spec)), emulated():
                    trained = probes.outputs(step, ref.weights, ref.batch, ref.probe_rows)
                    at_probe = probes.outputs(step, ref.probe_weights, ref.batch, ref.probe_rows)
                    curve = correctness.loss_curve(step, ref.batches)
                near = self._near_at(step, ref, emulated)
            finally:
                free_device_memory(self.work.device)
            self.precision_refs[p] = (f"eager {p.precision} (emulated)", truth.errors(trained, ref.fp64.trained),
                                      truth.errors(at_probe, ref.fp64.probe, curve, ref.fp64.curve))
            self.near_at[p] = near
        return self.precision_refs[p]

    def census_of(self, spec: StepSpec, ref: correctness.Reference, weights: str) -> Kinks | None:
        """One check's kink census: the reference's at these weights, with the count at the spec's own precision's
        band where that is lower than fp32's."""
        found = ref.kinks.get(weights)
        if found is None:
            return None
        out = dataclasses.replace(found, precision=spec.precision, by_op=dict(found.by_op), rows=list(found.rows))
        if spec.precision != "fp32":
            out.near_at_precision = self.near_at.get(precision_spec(spec), {}).get(weights)
        return out

    def _near_at(self, step: TrainStep, ref: correctness.Reference,
                 emulated: emulate.Arithmetic) -> dict[str, int | None]:
        """Elements within rounding of a kink at a lower precision's band, at the trained and the probe weights:
        eager at that precision crosses such kinks as the rung does, so its distance carries them (recorded)."""
        step64 = self._fp64_step(reference_spec(step.spec))[0]
        out: dict[str, int | None] = {}
        for k, w in (("trained", ref.weights), ("probe", ref.probe_weights)):
            try:
                c = kinks.census(step64, step, w, ref.batch, ref.micro, emulated) if step64 else None
                out[k] = None if c is None or c.why else c.near
            except Exception:  # noqa: BLE001 -- a count, not a verdict: left out, as None says
                out[k] = None
        return out

    def check(self, step: TrainStep, ref: correctness.Reference | str | None, base: probes.Probe | None,
              base_name: str | None, say: Callable[[str], None]) -> tuple[Gate, probes.Probe | None]:
        """Every gate that applies to the step, and its outputs at the probe weights (for the rungs built on it).

        A gate that cannot run fails the rung but keeps its speed.
        """
        if self.is_reference(step.spec):
            ref = self.reference(step.spec)  # the eager fp32 step is itself checked for causality
            if isinstance(ref, str):
                return Gate(passed=False, reference=True, detail=ref), None
            causal = correctness.causality(step, ref)
            return Gate(passed=causal.passed, reference=True, causality=causal,
                        detail=causal.detail or "eager fp32 is the reference the other rungs are checked "
                                                   "against"), ref.probe
        if isinstance(ref, str) or ref is None:
            return Gate(passed=False, detail=ref or "no reference"), None
        spec, gates = step.spec, self.work.cfg.run.gates
        say("gates: equivalence with eager fp32, causality, the rung it built on, then " + (
            f"loss band over {len(ref.batches)} batches" if spec.same_update else
            f"tokens to AdamW's loss over {gates.target_steps} batches"))
        try:
            gate, mine = self._checks(step, ref, base, base_name)
        except Exception as e:  # noqa: BLE001 -- the speed stays measured; the rung is unverified, so not passed
            why = "ran out of memory" if is_oom(e) else one_line(e)
            return Gate(passed=False, detail=f"the gates could not run: {why}"), None
        if not gate.passed:
            say("gate failed: looking for where the divergence starts")
            gate.explanation = self.explain(step, ref, gate)
        return gate, mine

    def explain(self, step: TrainStep, ref: correctness.Reference, gate: Gate) -> Explanation:
        """Why a gate failed (bisect.py): the first module whose output or input gradient leaves the rounding
        band, or whose past moves under a changed future; whether a second probe fails too. Never raises: an
        explanation that cannot be made says why."""
        try:
            return self._explain(step, ref, gate)
        except Exception as e:  # noqa: BLE001 -- the verdict stands; only its explanation is missing
            return Explanation(summary=f"no explanation: it failed to run ({one_line(e)})")
        finally:
            free_device_memory(self.work.device)

    def _explain(self, step: TrainStep, ref: correctness.Reference, gate: Gate) -> Explanation:
        """bisect.explain, given the float64 step and eager at the rung's precision (emulated)."""
        plain = self.work.step(reference_spec(step.spec))
        step64 = self._fp64_step(reference_spec(step.spec))[0]
        return bisect.explain(step, ref, gate, plain, step64, self.arithmetic(step.spec, plain))

    def _checks(self, step: TrainStep, ref: correctness.Reference, base: probes.Probe | None,
                base_name: str | None) -> tuple[Gate, probes.Probe]:
        spec, gates = step.spec, self.work.cfg.run.gates
        trained = probes.outputs(step, ref.weights, ref.batch, ref.probe_rows)
        target, curve = None, None
        if spec.same_update:
            curve = correctness.loss_curve(step, ref.batches)
            band = correctness.loss_band(curve, ref.curve, gates.loss_band)
        else:
            band = correctness.no_loss_band(spec)
            adamw = self.work.step(dataclasses.replace(spec, optimizer="adamw"))
            target = correctness.tokens_to_target(step, adamw, self.work.gate_batches(spec, gates.target_steps))
        causal = correctness.causality(step, ref)
        mine = correctness.probe(step, ref, curve)
        if ref.fp64 is not None:
            fp64, diff = self._fp64(spec, ref, trained, mine, base, base_name)
            eq = correctness.equivalence(step, ref, trained, fp64)
        else:
            eq, diff = correctness.equivalence(step, ref, trained), self._differential(mine, base, base_name, ref)
        checks = [eq, band, causal, diff] + ([target] if target else [])
        failed = next((c for c in checks if not c.passed), None)
        gate = Gate(passed=failed is None, detail=failed.detail if failed else "", equivalence=eq, loss_band=band,
                    tokens_to_target=target, causality=causal, differential=diff)
        return gate, mine

    def _fp64(self, spec: StepSpec, ref: correctness.Reference, trained: truth.Outputs, mine: probes.Probe,
              base: probes.Probe | None, base_name: str | None) -> tuple[Fp64, Differential]:
        """The rung's distances from fp64, at the trained weights (equivalence's verdict) and at the probe weights
        with its loss curve (the differential's), each judged against eager's at its precision and, where it has
        the same precision and shape, the base's."""
        assert ref.fp64 is not None
        name, eager_trained, eager_probe = self.eager_at(spec, ref)
        flips = ref.fp64.flips
        mine.errors = (truth.errors(trained, ref.fp64.trained, flips=flips.get("trained")),
                       truth.errors((mine.logits, mine.loss, mine.grads), ref.fp64.probe, mine.curve, ref.fp64.curve,
                                    flips=flips.get("probe")))
        below: tuple[tuple[str, Errors] | None, tuple[str, Errors] | None] = (None, None)
        if (base is not None and base_name is not None and base.errors is not None
                and (base.shape, base.precision) == (mine.shape, mine.precision)):
            below = (base_name, base.errors[0]), (base_name, base.errors[1])
        same = below[0] is not None
        eq = truth.judge(mine.errors[0], (name, eager_trained), below[0], spec.precision)
        at_probe = truth.judge(mine.errors[1], (name, eager_probe), below[1], spec.precision,
                               curve_spread=ref.fp64.curve_spread)
        eq.kinks, at_probe.kinks = self.census_of(spec, ref, "trained"), self.census_of(spec, ref, "probe")
        d = at_probe
        diff = Differential(
            base=base_name if same else None, precision=spec.precision, rule="fp64", fp64=at_probe,
            logits_rel=d.logits.rung if d.logits else None, logits_allowed=d.logits.allowed if d.logits else None,
            grad_worst=d.grad.name if d.grad else None, grad_rel=d.grad.rung if d.grad else None,
            grad_allowed=d.grad.allowed if d.grad else None, k=d.k, floor=d.floor,
            curve_rel=d.curve.rung if d.curve else None, curve_allowed=d.curve.allowed if d.curve else None,
            passed=d.passed, detail="" if d.passed else "differential: " + d.detail)
        return eq, diff

    @staticmethod
    def _differential(mine: probes.Probe, base: probes.Probe | None, base_name: str | None,
                      ref: correctness.Reference) -> Differential:
        """Without fp64: the rung against the rung it built on, where the two are comparable; else why not."""
        if base is None or base_name is None:
            return not_applicable(Differential, "no measured rung below it to compare with")
        if base.shape != mine.shape:
            return not_applicable(Differential, f"the batch changed ({base.shape[0]} -> {mine.shape[0]}): checked "
                                                "against eager fp32 at the new shape")
        if base.precision != mine.precision:
            return not_applicable(Differential, f"the arithmetic changed ({base.precision} -> {mine.precision}): "
                                                f"checked against eager fp32 at {mine.precision}'s tolerance")
        return probes.differential(mine, base, ref.probe, base_name)

    def learns(self, spec: StepSpec, say: Callable[[str], None]) -> LearnsCheck:
        """The learns-check of one spec: the same batches and steps as eager fp32 at its shape
        (docs/measurement.md, rule 9); eager's curve is trained once per shape."""
        g = self.work.cfg.run.gates
        key = (spec.batch_size, spec.seq_len)
        # The reference's lines are named as what they are, apart from the rung's own (which `say` names).
        reference = self.progress.scoped(f"learns-check: eager fp32 reference, B={key[0]} T={key[1]}")
        try:
            if key not in self.eager_curves:
                reference(f"over the same {g.learns_steps} batches as the rung")
                self.eager_curves[key] = self._curve(StepSpec(*key), reference)
            if spec == StepSpec(*key):  # eager fp32 at this shape (a batch rung built on eager): the same steps
                say("the same step as eager fp32 at this shape: its curve is the reference's, not trained twice")
                curve = self.eager_curves[key]
            else:
                curve = self._curve(spec, say)
            check = correctness.learns_check(curve, self.eager_curves[key], g.learns_band, self.entropy)
        except Exception as e:  # noqa: BLE001 -- a failing learns-check fails its rung, recorded
            check = LearnsCheck(passed=False, detail=one_line(e))
        return check

    def _curve(self, spec: StepSpec, say: Callable[[str], None]) -> list[float]:
        # Eager fp32 (the learns-check's baseline) at a big batch is accumulated as its reference is.
        micro = self.micro_batch(spec.batch_size) if self.is_reference(spec) else None
        try:
            with matmul_precision(spec):
                return correctness.train_curve(self.work.step(spec), self.work.stream(spec),
                                          self.work.cfg.run.gates.learns_steps, on_progress=say, micro=micro)
        finally:
            free_device_memory(self.work.device)
