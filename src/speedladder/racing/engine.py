"""`speedladder race`: every configuration trained to a target val loss, over seeds, judged by the time it takes.

Tokens/s says how fast a step runs; a race says how fast a model gets good (docs/race.md). As modded-nanogpt
judges its records:

1. The target is a val loss on held-out data: `--target-loss`, or by default the loss eager fp32 reaches after
   `calibrate_steps` steps on a seed of its own, so that every sound configuration can reach it.
2. Each configuration is prepared first (built, compiled and warmed up, its compile time recorded apart) and
   passes the causality probe: a step that lets a position see the future would reach any loss sooner.
3. Then every configuration is trained from each seed's initial weights and batch order until its val loss is at
   or below the target, or a time cap stops it ("did not reach", with its best loss). Runs go seed by seed
   across the configurations, so the machine's drift lands on all of them alike.
4. The clock runs over training steps only: it is stopped (the device synchronized) at every evaluation, which
   happens every `eval_every` base steps' worth of tokens, on a fixed val set, in eval mode, under no_grad.
5. A configuration's verdict against the one it builds on is Welch's t-test on the times, one-sided each way:
   win or loss at p < alpha (0.01), otherwise noise (stats.py). A configuration that changes how the model learns
   (batch, optimizer, learning rate) must also be no worse at equal tokens, or it is "not a win".

Everything lands in results.json's `race` section (records.RaceSection), saved after every run.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import torch

from speedladder import measure, models, probes, results
from speedladder.codec import to_data
from speedladder.errors import is_oom, one_line
from speedladder.progress import Progress
from speedladder.racing.verdicts import judge
from speedladder.records import Causality, RaceEntry, RaceRun, RaceSection, Results
from speedladder.rungs import ADAMW_VARIANTS, RUNGS, StepSpec, compose
from speedladder.settings import CONFIG_FILE, RaceConfig, Settings
from speedladder.settings import write as write_settings
from speedladder.step import TrainStep, matmul_precision
from speedladder.workload import Workload, free_device_memory, new_results

_PROBE_LOGITS = 1 << 24  # logits kept for the causality probe, as the gates keep (verify._PROBE_LOGITS)


class Clock(Protocol):
    """The race's clock: started before a stretch of training steps, stopped after it (outside every evaluation)."""

    def start(self) -> None: ...

    def stop(self, steps: int, spec: StepSpec) -> float:
        """Seconds the stretch of `steps` steps of `spec` took."""
        ...


class WallClock:
    """Wall time, the device synchronized at both ends of each stretch (docs/measurement.md, rule 3)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._t0 = 0.0

    def start(self) -> None:
        measure.sync(self.device)
        self._t0 = time.perf_counter()

    def stop(self, steps: int, spec: StepSpec) -> float:
        measure.sync(self.device)
        return time.perf_counter() - self._t0


@dataclasses.dataclass
class Prepared:
    """A configuration ready to race: its record, its spec and its built (compiled, warmed-up) step."""

    entry: RaceEntry
    spec: StepSpec
    step: TrainStep | None


def changes_learning(spec: StepSpec, base: StepSpec) -> bool:
    """Batch, optimizer or learning rate differ: the rung changes how the model learns, not only how fast."""
    return (spec.batch_size != base.batch_size or spec.lr_scale != base.lr_scale
            or (spec.optimizer in ADAMW_VARIANTS) != (base.optimizer in ADAMW_VARIANTS))


class Race:
    def __init__(self, work: Workload, run_dir: Path, race: RaceConfig, progress: Progress | None = None,
                 clock: Clock | None = None, role: str = "rung", settings: Settings | None = None) -> None:
        self.work = work
        self.run_dir = run_dir
        self.cfg = race
        self.progress = progress or Progress(quiet=True)
        self.clock = clock or WallClock(work.device)
        self.role = role  # "combo" or "winner" when the configurations are given rather than a ladder
        self.val_x, self.val_y = work.val_set(work.cfg.seq_len)
        base = work.base_spec
        seed = work.cfg.run.seed
        self.section = RaceSection(
            seeds=[seed + i for i in range(race.seeds)], eval_every=race.eval_every,
            eval_tokens=race.eval_every * base.tokens_per_step, val_sequences=len(self.val_x),
            val_seq_len=work.cfg.seq_len, alpha=race.alpha, detect=race.detect,
            batch_lr_scale=work.cfg.run.batch_lr_scale, calibrate_steps=race.calibrate_steps,
            order="seed by seed: every configuration's run of one seed, then the next seed")
        self.section.config = to_data(race)
        self.results: Results = new_results(work, kind="race")
        self.results.race = self.section
        # config.toml: the resolved run and this race, which `speedladder race --config` repeats.
        write_settings(run_dir / CONFIG_FILE, dataclasses.replace(settings or Settings(), run=work.cfg.run, race=race),
                       f"speedladder race: the configuration of {run_dir}", ("run", "race", "quiet"))
        self.prepared: list[Prepared] = []
        self._inits: dict[int, dict[str, torch.Tensor]] = {}
        self.save()

    def save(self) -> None:
        results.save(self.results, self.run_dir)

    # -- the configurations ---------------------------------------------------------------------

    def _entry(self, name: str, names: tuple[str, ...], spec: StepSpec, built_on: Prepared | None,
               role: str) -> RaceEntry:
        last = RUNGS[names[-1]] if names else RUNGS["eager"]
        return RaceEntry(name=name, rungs=list(names), role=role, reason=last.reason, kind=last.kind,
                         built_on=built_on.entry.name if built_on else None, spec=spec.to_dict(),
                         precision=spec.precision,
                         changes_learning=built_on is not None and changes_learning(spec, built_on.spec))

    def prepare_ladder(self, names: tuple[str, ...]) -> None:
        """A cumulative ladder: each rung composed on the last configuration that was prepared and passed."""
        spec, base, path = self.work.base_spec, None, ()
        for name in names:
            rung = RUNGS[name]
            new = rung.transform(spec, self.work.env)
            p = self._prepare(self._entry(name, (*path, name), new, base, "rung"), new)
            if p.entry.ok:
                spec, base, path = new, p, (*path, name)

    def prepare_combos(self, combos: tuple[tuple[str, ...], ...], role: str = "combo") -> None:
        """Eager, then each given set of rungs composed on it, each judged against eager."""
        base = self._prepare(self._entry("eager", ("eager",), self.work.base_spec, None, "rung"),
                             self.work.base_spec)
        for names in combos:
            names = tuple(n for n in names if n != "eager")
            spec = compose(names, self.work.base_spec, self.work.env)
            self._prepare(self._entry("+".join(names) or "eager-again", names, spec, base if base.entry.ok else None,
                                      role), spec)

    def _prepare(self, entry: RaceEntry, spec: StepSpec) -> Prepared:
        """Build, compile and warm up; probe causality. A configuration that cannot run is recorded, never dropped."""
        self.section.entries.append(entry)
        say = self.progress.scoped(f"race {entry.name}")
        p = Prepared(entry, spec, None)
        self.prepared.append(p)
        unmet = next((why for n in entry.rungs if (why := RUNGS[n].requires.unmet(self.work.env))), None)
        unmet = unmet or self.work.unfit(spec)
        if unmet:
            entry.status, entry.detail = "skipped", unmet
            say(f"skipped: {unmet}")
            self.save()
            return p
        try:
            with matmul_precision(spec):
                say("building" + (" and compiling" if spec.compile else "") + ", warming up")
                step = self.work.step(spec)
                t = self.work.cfg.run.timing
                stream = self.work.stream(spec)
                started = time.perf_counter()
                timing = measure.warm_up(measure.stepper(step, stream), self.work.device, t.warmup,  # type: ignore[arg-type]
                                         t.max_warmup, on_progress=say)
                entry.warmup_s = time.perf_counter() - started
                steady = [s for s, c in zip(timing.warmup_step_s, timing.warmup_compiled) if not c]
                entry.compile_s = (measure.compile_seconds(timing, statistics.median(steady))
                                   if spec.compile and steady else None)
                entry.causality = self._causality(step, spec)
            p.step = step
            entry.status = "ok" if entry.causality.passed else "failed"
            entry.detail = entry.causality.detail
            say("ready" + (f" (compiled in {entry.compile_s:.1f} s, outside the clock)" if entry.compile_s else "")
                + ("" if entry.ok else f"; FAILED: {entry.detail}"))
        except KeyboardInterrupt:
            entry.status, entry.detail = "interrupted", "stopped by Ctrl-C while preparing"
            raise
        except Exception as e:  # noqa: BLE001 -- this configuration fails, recorded; the race goes on
            entry.status, entry.detail = ("oom" if is_oom(e) else "error"), one_line(e)
            say(f"{entry.status}: {entry.detail}")
            free_device_memory(self.work.device)
        self.save()
        return p

    def _causality(self, step: TrainStep, spec: StepSpec) -> Causality:
        """The gates' causality probe on this configuration's own shape, at the amplified initial weights."""
        (batch,) = self.work.gate_batches(spec, 1)
        rows = max(1, min(spec.batch_size, _PROBE_LOGITS // (spec.seq_len * step.vocab_size)))
        return probes.causality(step, probes.amplified(self.work.init), batch, rows, step.vocab_size)

    # -- one run ------------------------------------------------------------------------------

    def _init(self, seed: int) -> dict[str, torch.Tensor]:
        if seed not in self._inits:
            self._inits[seed] = models.initial_state(self.work.model, seed)
        return self._inits[seed]

    def _evaluate(self, step: TrainStep) -> float:
        return float(step.evaluate(self.val_x, self.val_y, self.work.cfg.batch_size))

    def train_to(self, step: TrainStep, seed: int, target: float, cap_s: float | None,
                 max_steps: int | None = None, say: Callable[[str], None] = lambda m: None) -> RaceRun:
        """Train from a seed's initial weights and batch order until the val loss is at or below `target`, the
        clock passes `cap_s`, `max_steps` are done, or the loss is not finite."""
        spec = step.spec
        step.reset(self._init(seed))
        measure.return_host_memory()  # before the clock starts: what the last run freed goes back to the system
        stream = self.work.stream(spec, seed=seed)
        run = RaceRun(seed=seed, stopped="")
        interval, tps = self.section.eval_tokens, spec.tokens_per_step
        steps = tokens = 0
        clock = 0.0
        next_eval = interval
        loss: torch.Tensor | None = None
        with matmul_precision(spec):
            v = self._point(run, step, loss, steps, tokens, clock)
            while True:
                if not math.isfinite(v):
                    run.stopped = "diverged"
                    break
                if v <= target:
                    run.stopped, run.seconds, run.tokens, run.steps = "reached", clock, tokens, steps
                    break
                if cap_s is not None and clock >= cap_s:
                    run.stopped = "time cap"
                    break
                if max_steps is not None and steps >= max_steps:
                    run.stopped = "steps"
                    break
                n = max(1, math.ceil((next_eval - tokens) / tps))
                if max_steps is not None:
                    n = min(n, max_steps - steps)
                c0 = measure.compile_count()
                self.clock.start()
                for _ in range(n):
                    loss = step(*next(stream))
                clock += self.clock.stop(n, spec)
                run.recompiles += measure.compile_count() - c0
                steps, tokens = steps + n, tokens + n * tps
                while next_eval <= tokens:
                    next_eval += interval
                v = self._point(run, step, loss, steps, tokens, clock)
        run.train_seconds = clock
        say(f"seed {seed}: " + (f"reached {target:.3f} at {run.seconds:.2f} s (step {run.steps:,}, "
                                f"{run.tokens:,} tokens)" if run.reached else
                                f"{run.stopped} after {clock:.2f} s; best {run.best_loss:.3f} at "
                                f"{run.best_seconds:.2f} s ({run.best_tokens:,} tokens)" if run.best_loss is not None
                                else f"{run.stopped}"))
        return run

    def _point(self, run: RaceRun, step: TrainStep, loss: torch.Tensor | None, steps: int, tokens: int,
               clock: float) -> float:
        """Evaluate (the clock is stopped) and add the point to the run's curve; the val loss."""
        t0 = time.perf_counter()
        v = self._evaluate(step)
        train = float(loss) if loss is not None else None  # read here, where the clock is stopped
        run.eval_seconds += time.perf_counter() - t0
        finite = math.isfinite(v)
        run.curve_steps.append(steps)
        run.curve_tokens.append(tokens)
        run.curve_seconds.append(clock)
        run.curve_val.append(v if finite else None)
        run.curve_train.append(train if train is not None and math.isfinite(train) else None)
        if finite and (run.best_loss is None or v < run.best_loss):
            run.best_loss, run.best_seconds, run.best_tokens = v, clock, tokens
        return v

    # -- the target and the cap -----------------------------------------------------------------

    def _eager_step(self) -> TrainStep:
        """Eager fp32 at the workload's shape: the prepared baseline when it is one, else built here."""
        base = self.work.base_spec
        found = next((p.step for p in self.prepared if p.spec == base and p.step is not None), None)
        return found or self.work.step(base)

    def calibrate(self) -> None:
        """Set the target (given, or eager fp32's val loss after calibrate_steps steps on a seed of its own) and
        the time cap (given, or cap_factor times what eager fp32 needs for those steps)."""
        c, sec = self.cfg, self.section
        say = self.progress.scoped("race target")
        eager = self._eager_step()
        seed = sec.seeds[-1] + 1  # not one of the race's seeds: eager's own runs are not judged by their own target
        if c.target_loss is None:
            say(f"calibrating: eager fp32, seed {seed}, {c.calibrate_steps} steps")
            run = self.train_to(eager, seed, -math.inf, None, max_steps=c.calibrate_steps)
            if run.curve_val[-1] is None:
                raise RuntimeError("eager fp32's val loss is not finite after calibration: no target to race to")
            sec.calibration = run
            sec.target_loss = run.curve_val[-1]
            sec.target_from = f"eager fp32's val loss after {c.calibrate_steps} steps (seed {seed})"
            eager_s = run.train_seconds
        else:
            sec.target_loss, sec.target_from = c.target_loss, "--target-loss"
            eager_s = self._steps_seconds(eager, seed, c.calibrate_steps)
        if c.time_cap_s is not None:
            sec.time_cap_s, sec.cap_from = c.time_cap_s, "--time-cap"
        else:
            sec.time_cap_s = c.cap_factor * eager_s
            sec.cap_from = f"{c.cap_factor:g}x eager fp32's {c.calibrate_steps} steps ({eager_s:.2f} s)"
        say(f"target val loss {sec.target_loss:.4f} ({sec.target_from}); each run is capped at "
            f"{sec.time_cap_s:.1f} s of training ({sec.cap_from})")
        self.save()

    def _steps_seconds(self, step: TrainStep, seed: int, steps: int) -> float:
        """What `steps` steps take on the clock, priced from a short stretch (for the cap when the target is given)."""
        n = max(1, min(steps, 2 * self.cfg.eval_every))
        run = self.train_to(step, seed, -math.inf, None, max_steps=n)
        return run.train_seconds * steps / n

    # -- the whole race -------------------------------------------------------------------------

    def run(self) -> Results:
        """Calibrate, race every prepared configuration seed by seed, then judge; saved after every run."""
        try:
            self.calibrate()
            ready = [p for p in self.prepared if p.entry.ok and p.step is not None]
            for seed in self.section.seeds:
                for p in ready:
                    say = self.progress.scoped(f"race {p.entry.name}")
                    try:
                        p.entry.runs.append(self.train_to(p.step, seed, self.section.target_loss,  # type: ignore[arg-type]
                                                          self.section.time_cap_s, say=say))
                    except KeyboardInterrupt:
                        raise
                    except Exception as e:  # noqa: BLE001 -- this run fails, recorded; the race goes on
                        p.entry.runs.append(RaceRun(seed=seed, stopped=f"error: {one_line(e)}"))
                        say(f"seed {seed}: error: {one_line(e)}")
                    self.save()
            judge(self.section)
            self.results.status = "complete"
        except KeyboardInterrupt:
            self.results.status = "interrupted"
            judge(self.section)
            raise
        finally:
            self.save()
        return self.results
