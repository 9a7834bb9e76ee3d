"""Climb the ladder: for each rung, spec = rung(spec) -> build -> warm up -> time -> verify -> save.

Each rung builds on the best configuration so far: the last rung that ran,
passed its gates and paid (a speed rung whose best estimate is not above its
base, a loss or noise at or below 1.0x, is measured, named and left out, unless
--stack-all); one that is skipped, fails a gate, runs out of memory or raises is
recorded as such and left out of the specs above it.
results.json is rewritten after every rung.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from pathlib import Path

from speedladder.config.settings import CONFIG_FILE, Settings
from speedladder.config.settings import write as write_settings
from speedladder.errors import is_oom, one_line
from speedladder.ladder import rung_memory
from speedladder.ladder.builds_on import SHORT_BELOW, not_built_upon, pays, ranked, short_detail
from speedladder.measure import autotune, compiletime, judging, machine_load, peakflops
from speedladder.profile import explain, step_profile
from speedladder.profile.predict import chain
from speedladder.progress import Progress
from speedladder.records import (
    Gate,
    LearnsCheck,
    Prediction,
    ProfileSummary,
    Results,
    Role,
    RungResult,
    from_dict,
    storage,
)
from speedladder.records.timing import TimingRecord
from speedladder.rungs import RUNGS, Rung, RungError
from speedladder.spec import StepSpec
from speedladder.step.measurement import measure_spec, note_load, read_machine_load
from speedladder.step.train_step import TrainStep, matmul_precision
from speedladder.step.workload import Workload, free_device_memory, new_results
from speedladder.verify import rerun
from speedladder.verify.gates import Gates
from speedladder.verify.probes import Probe

AUTO = "auto"  # predict a ladder rung on the spec it builds on


class Ladder:
    """A run's climb: each rung of the ladder measured beside the rung it builds on, gated, and saved.

    Owns: the workload, the run's `Results` (written to `run_dir` after every rung), the gates (`Gates`: eager fp32
    references and each passing rung's probe outputs), the peaks (resident memory, FLOP/s), the machine-load meter,
    and the path of rungs that make the current base spec.

    Runs, in order (`run`, one named phase per line): the machine's load before anything of ours
    (`_machine_load`); the baseline's profile in a child process and a prediction for every rung (`profile`); the
    climb (`_climb_all`): for each rung, its transform on the base spec, then `climb` -- skipped when its
    requirement is unmet, else timed beside its base (`_time` -> measurement.measure_spec), metered, its ratios derived
    (`_derive`), then gated (`_gate` -> Gates.check, against the reference of its shape, made once); the next rung
    builds on it only if it passed and paid; its fp32 control where the rung changes the precision; the rungs
    measured beside the top (`--beside`); then a command's own step (`after_climb`, tune's); each loss and miss
    explained (`_explain_misses`); the learns-check on the fastest rung that passed (`_learns_check`); the resident
    peaks last, in a child process (`_memory_peaks`); the run's status (`_record_status`).

    Leaves behind: results.json (status "complete", "failed" when the baseline did not run, or "interrupted") and
    config.toml in `run_dir`, from which every report is drawn.
    """

    def __init__(self, work: Workload, run_dir: Path, progress: Progress | None = None,
                 budget: Callable[[], str | None] | None = None, settings: Settings | None = None,
                 sections: tuple[str, ...] = ("run", "quiet")) -> None:
        self.work = work
        self.run_dir = run_dir
        self.progress = progress or Progress(quiet=True)
        # Asked before each rung starts: a reason to skip it (a tune's time budget), or None.
        self.budget = budget
        self.gates = Gates(work, self.progress)
        self.results: Results = new_results(work)
        self.path: list[str] = []  # the rungs whose transforms make the current base spec
        # Each passing rung's outputs at the probe weights: what a rung built on it is checked against (probes.py).
        self.probes: dict[str, Probe] = {}
        self.finalists: list[str] | None = None  # set by tune: the learns-check tries these, in this order
        self.peaks = rung_memory.Peaks(work)  # off CUDA, the resident peaks measured once the climb is over
        self.flop_peaks = rung_memory.FlopPeaks(work)  # each precision's peak FLOP/s, for the MFU
        self.meter = machine_load.Meter.open()  # other processes' load around each window (None off Linux)
        self.compile_times = compiletime.of(work.device.type, work.init, work.model.blocks_prefix)  # by mode, cache
        self.profile_wall_s: float | None = None  # the baseline's profile in its child: the explanation's estimate
        self.save()
        # config.toml beside results.json: the resolved run, which `speedladder run --config` repeats.
        s = dataclasses.replace(settings or Settings(), run=work.cfg.run)
        write_settings(run_dir / CONFIG_FILE, s, f"speedladder: the configuration of {run_dir}", sections)

    def save(self) -> None:
        storage.save(self.results, self.run_dir)

    # -- one rung ---------------------------------------------------------------------------

    def climb(self, rung: Rung, spec: StepSpec, base: RungResult | None, role: Role = Role.RUNG,
              predicted: Prediction | None | str = AUTO) -> RungResult:
        """Measure and verify one spec against the result it builds on; the record is saved whatever happens."""
        control = role == Role.CONTROL
        r = RungResult(
            name=f"{rung.name}-fp32" if control else rung.name, rung=rung.name, role=role,
            reason=(rung.control_reason or "") if control else rung.reason, kind=rung.kind,
            built_on=base.name if base else None, spec=spec, precision=spec.precision,
            requirement=rung.requires.to_dict(), source=rung.source,
            predicted=None if control else self._predicted(rung) if isinstance(predicted, str) else predicted)
        self.results.rungs.append(r)
        say = self.progress.scoped(r.name)
        unmet = rung.requires.unmet(self.work.env) or self.work.unfit(spec) or (self.budget and self.budget())
        if unmet:
            r.status, r.detail = "skipped", unmet
            say(f"skipped: {unmet}")
            self.save()
            return r
        started = time.perf_counter()
        try:
            with autotune.to_log(self.run_dir / autotune.LOG, say):  # max-autotune's tables in a file, one line here
                self._measure(r, spec, base, say)
        except KeyboardInterrupt:
            if r.ok:  # timed, its speed saved: only its gates were cut
                r.gate = Gate(passed=False, cut=True, detail="not verified: the run stopped during its gates (Ctrl-C "
                                                              "or a cap); its speed was measured")
            else:
                r.status, r.detail = "interrupted", "stopped by Ctrl-C during this rung"
            raise
        except Exception as e:  # noqa: BLE001 -- an OOM or a failing technique ends this rung only, recorded
            r.status, r.detail = ("oom" if is_oom(e) else "error"), str(e) if isinstance(e, RungError) else one_line(e)
            say(f"{r.status}: {r.detail}")
        finally:
            free_device_memory(self.work.device)
            r.wall_s = time.perf_counter() - started
        self.save()
        return r

    def _measure(self, r: RungResult, spec: StepSpec, base: RungResult | None, say: Callable[[str], None]) -> None:
        """Time the rung beside its base and save its speed; then (a rung not stopped short) its gates, whose
        reference is built only now: a cut during the gates keeps the speed (docs/measurement.md, rule 16)."""
        with matmul_precision(spec):
            step = self._time(r, spec, base, say)
            if step is not None:
                self._gate(r, step, base, say)
        say("not gated" if r.gate is None else "gate " + ("passed" if r.gate.passed else f"FAILED: {r.gate.detail}"))

    def _time(self, r: RungResult, spec: StepSpec, base: RungResult | None,
              say: Callable[[str], None]) -> TrainStep | None:
        """The rung's step timed beside its base's, metered, its ratios derived and its speed saved; the step to
        gate, or None for a rung stopped short (neither metered nor gated: nothing builds on it)."""
        w = self.work
        base_spec = base.spec if base is not None else None
        m, step = measure_spec(w, spec, say, base=base_spec, meter=self.meter,
                               compile_estimate_s=self.compile_times.estimate(spec),
                               short_below=self._short_below(r, base))
        self.compile_times.note((spec, m.timing), (base_spec, m.base_timing))  # the rung's warm-up, its base's
        note_load(self.results.machine, m)
        r.timing = TimingRecord.of(m.timing)
        r.tokens_per_s, r.step_ms, r.compile_s = m.tokens_per_s, m.step_ms, m.compile_s
        r.peak_memory_bytes, r.peak_reserved_bytes = m.peak_memory_bytes, m.peak_reserved_bytes
        r.held_before_bytes = m.held_before_bytes
        r.warnings = m.warnings
        if step.scaler is not None:  # fp16: the updates its gradient scaler skipped while it was measured
            r.scaler_skipped, r.scaler_updates = step.skipped_updates(), step.updates
        if m.base_timing is not None:
            r.base_timing, r.base_tokens_per_s = TimingRecord.of(m.base_timing), m.base_tokens_per_s
            r.verdict, r.verdict_detail = judging.judge(m.timing, m.base_timing)
        if not m.timing.short:  # a rung stopped short is neither metered nor gated: nothing builds on it
            rung_memory.record(r, w, spec, step, say, self.peaks)  # saved activations, predicted, the step's peak
        fpt = w.flops_per_token(spec)
        peak, r.peak_basis = self.flop_peaks.of(spec, step.model, fpt)
        r.flops_per_token, r.tflops, r.peak_tflops = fpt, m.tokens_per_s.median * fpt / 1e12, peak
        r.mfu = peakflops.mfu(m.tokens_per_s.median, fpt, peak)
        r.status = "ok"
        if m.timing.short:
            r.verdict = judging.SHORT  # its detail once its x prev is known (_derive)
        self._derive(r, base)
        self.save()  # the speed is on disk before any reference is built
        t = m.tokens_per_s
        say(f"{t.median:,.0f} tokens/s (min {t.min:,.0f}, max {t.max:,.0f})"
            + (f", {r.verdict} against {base.name} re-timed beside it" if base is not None else ""))
        return None if m.timing.short else step

    def _gate(self, r: RungResult, step: TrainStep, base: RungResult | None, say: Callable[[str], None]) -> None:
        """The rung's gates against eager fp32 (its shape's reference, made now if not yet) and the rung it built on;
        a failure explains itself. The references' models go after it."""
        spec = step.spec
        baseline = self.results.baseline
        eager_ms = (baseline.step_ms * spec.tokens_per_step / self.work.base_spec.tokens_per_step
                    if baseline is not None and baseline.step_ms is not None else r.step_ms)
        try:
            r.gate, probe = self.gates.check(step, None, self.probes.get(base.name) if base else None,
                                             base.name if base else None, say, step_ms=eager_ms)
        finally:
            self.gates.release()
        if r.gate.explanation is not None:
            r.gate.explanation.command = rerun.command(self.run_dir, r.name)
            say(f"why: {r.gate.explanation.summary}")
        if r.gate.passed and probe is not None:
            self.probes[r.name] = probe

    def _short_below(self, r: RungResult, base: RungResult | None) -> float | None:
        """SHORT_BELOW for a ladder rung whose prediction is below it (timed in one short window beside its base,
        docs/measurement.md, rule 4); None otherwise (no base, no prediction, a control, a rung beside the top, and
        with --stack-all, which builds on every rung that passes its gates, so each is gated)."""
        pred = r.predicted.speedup if r.predicted else None
        known = (base is not None and r.role == Role.RUNG and pred is not None and pred < SHORT_BELOW
                 and not self.work.cfg.run.stack_all)
        return SHORT_BELOW if known else None

    def _derive(self, r: RungResult, base: RungResult | None) -> None:
        """Speed-ups against the rung built on (re-timed beside it) and, chained, against the baseline."""
        if not r.ok or r.tokens_per_s is None:
            return
        if base is None or base.tokens_per_s is None:
            r.speedup_cum = 1.0 if r.role == Role.RUNG else None
            r.verdict = "baseline"
            return
        beside = r.base_tokens_per_s or base.tokens_per_s
        if r.base_tokens_per_s is not None:  # the base's own measurement and the one beside this rung: drift?
            r.base_drift = judging.drift(base.tokens_per_s, r.base_tokens_per_s)
        r.speedup_prev = r.tokens_per_s.median / beside.median
        # Chained along the ladder: each factor measured with its base beside it, so drift does not compound.
        r.speedup_cum = (base.speedup_cum or 1.0) * r.speedup_prev
        if r.predicted and r.predicted.speedup:
            r.prediction_error = r.speedup_prev / r.predicted.speedup - 1  # > 0: faster than predicted
        if r.verdict == judging.SHORT:
            r.verdict_detail = short_detail(r)
        if r.role == Role.CONTROL:  # not a step up the ladder: its x prev is against its own rung, in the notes
            r.verdict = "control"
        elif r.verdict is None:
            r.verdict = judging.verdict(r.tokens_per_s, beside)

    # -- measure -> classify -> predict ---------------------------------------------------------

    def profile(self) -> None:
        """Profile the baseline in a child process, before any timed window; predict every rung from it."""
        say = self.progress.scoped("profile")
        say(f"profiling {self.work.cfg.run.profile.steps} baseline steps in a child process (no timed window "
            "shares its process)")
        started = time.perf_counter()
        try:
            # The child profiles the baseline only: it needs no rungs (nor to know rungs added in this process).
            run = self.work.cfg.run.with_rungs(("eager",))
            with say.task("profiling in a child process"):
                b = step_profile.run_in_child(run, (), self.run_dir / step_profile.TRACE, self.work.cfg.run.profile.timeout_s)
            self.profile_wall_s = time.perf_counter() - started
        except Exception as e:  # noqa: BLE001 -- the ladder is still worth measuring without predictions
            self.results.profile = ProfileSummary(error=one_line(e))
            say(f"failed, no predictions: {one_line(e)}")
            self.save()
            return
        self.results.profile = from_dict(ProfileSummary, b)
        preds = chain(self.results.profile, self.work.cfg.run.rungs or (), self.work.base_spec, self.work.env)
        self.results.predictions = [p.record() for p in preds]
        say(f"{b.get('regime_label') or b['regime']}: {b['evidence']}")
        for p in preds:
            say(f"predicted {p.rung}: " + ("n/a" if p.speedup is None else f"{p.speedup:.2f}x") + f" ({p.reason})")
        self.save()

    def _profiled(self) -> ProfileSummary | None:
        b = self.results.profile
        return None if b is None or b.error else b

    def _predicted(self, rung: Rung) -> Prediction | None:
        """This rung's prediction on the spec it actually builds on (the rungs that passed before it)."""
        b = self._profiled()
        if b is None or rung.name not in RUNGS:
            return None
        p = chain(b, [*self.path, rung.name], self.work.base_spec, self.work.env)[-1]
        return Prediction(p.speedup, p.reason)

    def predicted_together(self, names: tuple[str, ...]) -> Prediction | None:
        """The prediction for rungs applied together on the baseline: the product of their chained predictions."""
        b = self._profiled()
        if b is None:
            return None
        preds = chain(b, list(names), self.work.base_spec, self.work.env)
        speedups = [p.speedup for p in preds if p.speedup is not None]
        if len(speedups) < len(preds):
            return None
        x = math.prod(speedups)
        return Prediction(x, " × ".join(f"{p.rung} {p.speedup:.2f}" for p in preds) + f" ≈ {x:.2f}x")

    # -- the whole ladder -------------------------------------------------------------------

    def run(self, after_climb: Callable[[], None] | None = None) -> Results:
        """The run, phase by phase; a command's own step (tune's combinations) goes in `after_climb`."""
        try:
            self._machine_load()  # the machine's load, before anything of ours runs
            if self.work.cfg.run.profile.enabled:
                self.profile()  # the baseline profiled in a child process; every rung predicted from it
            self._climb_all()  # each rung built, timed beside its base, gated against its shape's reference
            if after_climb is not None:
                after_climb()
            self._explain_misses()  # each loss and miss: the rung's step and its base's profiled side by side
            self._learns_check()  # the fastest rung that passed its gates must learn
            self._memory_peaks()  # off CUDA, the resident peaks, in a child process, after all else
            self._record_status()  # complete, or failed when the baseline did not run
        except KeyboardInterrupt:
            self._stopped()
            raise
        finally:
            self.save()
        return self.results

    def _machine_load(self) -> None:
        """Other processes' load on the machine, read once before the run starts (docs/measurement.md)."""
        if self.meter is not None and self.results.machine is None:
            self.results.machine = read_machine_load(self.meter, self.progress.scoped("machine"))

    def _explain_misses(self) -> None:
        """Each loss and each miss beyond the limit explained: the rung's step and its base's profiled side by side."""
        explain.explain_misses(self.results, self.work, self.save, self.progress.scoped("explain"), self.budget,
                               self.profile_wall_s, self.run_dir)

    def _memory_peaks(self) -> None:
        """Off CUDA, each queued rung's resident peak, in a child process once everything else has run."""
        self.peaks.measure(self.progress.scoped("memory"))

    def _record_status(self) -> None:
        """The run's status: failed when the baseline did not run (every rung is measured against it, so the command
        exits non-zero), else complete."""
        failed = self.results.failed_baseline
        self.results.status = "failed" if failed else "complete"
        if failed:
            self.results.error = f"the baseline {failed.name} did not run: {failed.status}: {failed.detail}"

    def _climb_all(self) -> None:
        """Each rung of the ladder in turn: its spec built on the current base, then `climb`; the next rung builds
        on it only if it passed and paid; its fp32 control; then the rungs measured beside the top (`--beside`)."""
        spec, base = self.work.base_spec, None
        for name in self.work.cfg.run.rungs or ():
            rung = RUNGS[name]
            try:
                new = rung.transform(spec, self.work.env)
            except RungError as e:  # a user's spec transform raised: this rung fails, said, and the ladder goes on
                self._failed(rung, base, str(e))
                continue
            r = self.climb(rung, new, base)
            control = rung.control(new) if rung.control is not None else None
            # Only where the control changes the precision: one the rung's own spec already is measures nothing new.
            if r.ok and r.verdict != judging.SHORT and control is not None and control != new:
                self.climb(rung, control, r, role=Role.CONTROL)
            if base is not None and (r.verdict == judging.SHORT or (
                    r.passed and not self.work.cfg.run.stack_all and not pays(r))):
                r.not_built_upon = not_built_upon(r, base.name)
                self.progress.scoped(r.name)(f"not built upon: {r.not_built_upon}")
                self.save()
            elif r.passed:
                spec, base = new, r
                self.path.append(name)
        # Measured on the top of the ladder, not built upon: e.g. a memory rung priced against the best spec.
        for name in self.work.cfg.run.beside or ():
            rung = RUNGS[name]
            self.climb(rung, rung.transform(spec, self.work.env), base, role=Role.BESIDE)

    def _failed(self, rung: Rung, base: RungResult | None, why: str) -> None:
        """A rung whose spec could not be made: recorded as an error, with the reason."""
        r = RungResult(name=rung.name, rung=rung.name, role=Role.RUNG, reason=rung.reason, kind=rung.kind,
                       built_on=base.name if base else None, spec=None, precision="", requirement=rung.requires.to_dict(),
                       status="error", detail=why, source=rung.source)
        self.results.rungs.append(r)
        self.progress.scoped(r.name)(f"error: {why}")
        self.save()

    def _learns_estimate(self, r: RungResult, spec: StepSpec) -> float | None:
        """What a learns-check should take: its steps at the rung's measured step time, and eager fp32's at that
        shape (the baseline's step, scaled by the tokens) unless its curve is trained already."""
        steps, base = self.work.cfg.run.gates.learns_steps, self.results.baseline
        if r.step_ms is None or base is None or base.step_ms is None:
            return None
        eager_ms = 0.0 if (spec.batch_size, spec.seq_len) in self.gates.eager_curves else (
            base.step_ms * spec.tokens_per_step / self.work.base_spec.tokens_per_step)
        return steps * (r.step_ms + eager_ms) / 1e3

    learning: str | None = None  # the rung whose learns-check is running, when one is: a stop then says so

    def _stopped(self) -> None:
        """A run stopped (Ctrl-C, a plan's cap): interrupted, and a learns-check that did not run (or did not
        finish) recorded as not run, never as passed."""
        self.results.status = "interrupted"
        if self.results.learns_check is None or self.learning is not None:
            self.results.learns_check = LearnsCheck(
                rung=self.learning, skipped=True,
                detail=f"the run stopped during the learns-check of {self.learning}" if self.learning
                else "the run stopped before the learns-check")

    def _learns_check(self) -> None:
        """The fastest rung that passed every gate must also learn; if it does not, the next fastest is tried. Fastest
        by × cum, its ratios each measured beside its base: the absolute tokens/s of rows timed minutes apart are not
        comparable on a machine whose load moves (docs/measurement.md, rule 8)."""
        candidates = ranked(self.results)  # a rung left out of the climb (slower, or judged by the race) is none
        if self.finalists is not None:  # tune: the finalists re-measured beside eager, best ratio first
            candidates = [r for name in self.finalists if (r := self.results.rung(name)) is not None]
        if self.work.cfg.run.gates.learns_steps == 0 and candidates:
            self.results.fastest = candidates[0].name
            self.results.learns_check = LearnsCheck(rung=candidates[0].name, skipped=True, detail="--learns-steps 0")
            return
        for r in candidates:
            say = self.progress.scoped(f"learns-check {r.name}")
            spec = r.spec
            assert spec is not None  # it passed its gates: it was measured
            eager = "" if (spec.batch_size, spec.seq_len) in self.gates.eager_curves else (
                ", and eager fp32's over the same batches")
            self.learning = r.name
            with say.task(f"{self.work.cfg.run.gates.learns_steps} steps{eager}",
                          estimate_s=self._learns_estimate(r, spec)):
                try:
                    check = self.gates.learns(spec, say)
                except Exception as e:  # noqa: BLE001 -- a learns-check that cannot run fails its rung, recorded
                    check = LearnsCheck(passed=False, detail=one_line(e))
            self.learning = None
            check.rung = r.name
            self.results.learns_check = check
            say(("passed" if check.passed else "FAILED") +
                (f": loss {check.first_loss:.3f} -> {check.final_loss:.3f}" if check.drop is not None else "")
                + (f" ({check.detail})" if check.detail else ""))
            if check.passed:
                self.results.fastest = r.name
                return
            assert r.gate is not None
            r.gate.passed, r.gate.detail = False, f"learns-check: {check.detail}"
            self.save()
