"""The gates a measured rung must pass, run against eager fp32 references kept per batch shape.

verify.py holds the checks themselves; this module decides which apply to a
step, builds the references they compare with (once per shape), and turns a
check that cannot run into a failed gate, never a passed one
(docs/measurement.md, rules 7 and 9).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from speedladder import verify
from speedladder.errors import is_oom, one_line
from speedladder.progress import Progress
from speedladder.records import Gate
from speedladder.rungs import StepSpec
from speedladder.step import TrainStep, matmul_precision
from speedladder.workload import Workload, free_device_memory


class Gates:
    def __init__(self, work: Workload, progress: Progress) -> None:
        self.work = work
        self.progress = progress
        self.references: dict[tuple[int, int], verify.Reference | str] = {}

    def is_reference(self, spec: StepSpec) -> bool:
        """Eager fp32 at the workload's shape (any batch): the function every other rung is checked against."""
        return spec == dataclasses.replace(self.work.base_spec, batch_size=spec.batch_size)

    def reference(self, spec: StepSpec) -> verify.Reference | str:
        """Eager fp32 at the spec's shape, once per shape; a string says why it could not be made."""
        key = (spec.batch_size, spec.seq_len)
        if key not in self.references:
            k = self.work.cfg.run.gates.loss_steps
            self.progress(f"eager fp32 reference at B={key[0]}, T={key[1]} ({k} steps)", "gates")
            eager = StepSpec(*key)
            try:
                self.references[key] = verify.reference(self.work.step(eager), self.work.gate_batches(eager, k))
            except Exception as e:  # noqa: BLE001 -- recorded in each gate that needed it; the ladder goes on
                why = "ran out of memory" if is_oom(e) else f"failed ({one_line(e)})"
                self.references[key] = f"the eager fp32 reference at B={key[0]} {why}: not verified"
            finally:
                free_device_memory(self.work.device)
        return self.references[key]

    def check(self, step: TrainStep, ref: verify.Reference | str | None, say: Callable[[str], None]) -> Gate:
        """Every gate that applies to the step; a gate that cannot run fails the rung but keeps its speed."""
        if self.is_reference(step.spec):
            return Gate(passed=True, reference=True,
                        detail="eager fp32 is the reference the other rungs are checked against")
        if isinstance(ref, str) or ref is None:
            return Gate(passed=False, detail=ref or "no reference")
        spec, gates = step.spec, self.work.cfg.run.gates
        say("gates: equivalence with eager fp32, then " + (
            f"loss band over {len(ref.batches)} batches" if spec.same_update else
            f"tokens to AdamW's loss over {gates.target_steps} batches"))
        target = None
        try:
            eq = verify.equivalence(step, ref)
            if spec.same_update:
                band = verify.loss_band(verify.loss_curve(step, ref.batches), ref.curve, gates.loss_band)
            else:
                band = verify.no_loss_band(spec)
                adamw = self.work.step(dataclasses.replace(spec, optimizer="adamw"))
                target = verify.tokens_to_target(step, adamw, self.work.gate_batches(spec, gates.target_steps))
        except Exception as e:  # noqa: BLE001 -- the speed stays measured; the rung is unverified, so not passed
            why = "ran out of memory" if is_oom(e) else one_line(e)
            return Gate(passed=False, detail=f"the gates could not run: {why}")
        checks = [eq, band] + ([target] if target else [])
        failed = next((c for c in checks if not c["passed"]), None)
        return Gate(passed=failed is None, detail=failed["detail"] if failed else "", equivalence=eq, loss_band=band,
                    tokens_to_target=target)

    def learns(self, spec: StepSpec, say: Callable[[str], None]) -> dict:
        """The learns-check of one spec from the initial weights (docs/measurement.md, rule 9)."""
        g = self.work.cfg.run.gates
        try:
            with matmul_precision(spec):
                check = verify.learns_check(self.work.step(spec), self.work.stream(spec), g.learns_steps,
                                            g.learns_min_drop, on_progress=say)
        except Exception as e:  # noqa: BLE001 -- a failing learns-check fails its rung, recorded
            check = {"passed": False, "detail": one_line(e)}
        finally:
            free_device_memory(self.work.device)
        return check
