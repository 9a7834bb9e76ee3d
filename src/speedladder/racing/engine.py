"""`speedladder race`: every configuration trained to a target val loss, over seeds, judged by the time it takes.

Tokens/s says how fast a step runs; a race says how fast a model gets good (docs/race.md):

1. The target is a val loss on held-out data: `--target-loss`, a saved race's (`--target-from`), or by default
   the loss eager fp32 reaches after `calibrate_steps` steps on a seed of its own.
2. Each configuration is prepared first (built, compiled and warmed up, its compile time recorded apart) and
   passes the causality probe: a step that lets a position see the future would reach any loss sooner.
3. The race goes in **stages**. A cumulative ladder's stage k trains rung k and the best configuration so far
   (its base), both afresh, from every seed's initial weights and batch order; given configurations (combos, a
   run's winner, tune's finalists) race in one stage beside eager. Within a seed the runs take turns, one stretch
   between two evaluations at a time, the one with the least training time next: they see the machine in the same
   seconds, so a slowdown of the machine lands on all of them alike. Who goes first rotates from seed to seed (a
   Latin square: with two configurations, base first, then rung first, ...).
4. A run trains until its val loss is at or below the target (the crossing interpolated between evaluations) and
   it has trained the token budget of modded-nanogpt's criterion, or until its cap: a rung stops at `cap_factor`
   times its base's time in the same seed, once the base is done; a base at the race's time cap (twice
   `cap_factor` times eager fp32's calibration). A run stopped at its cap did not reach: a censored time, at least
   its clock.
5. The clock runs over training steps only: it is stopped (the device synchronized) at every evaluation.
6. After each stage its rung is judged (verdicts.py): a paired test by seed on log times, censoring-aware. The next
   stage builds on the rung if its best estimate is above its base (a win, or noise above 1.0x), else on its base.

Everything lands in results.json's `race` section (records.RaceSection), saved after every run.
"""

from __future__ import annotations

import dataclasses
import gc
import math
import statistics
import time
from pathlib import Path

import torch

from speedladder.config.settings import CONFIG_FILE, RaceConfig, Settings
from speedladder.config.settings import write as write_settings
from speedladder.errors import is_oom, one_line
from speedladder.measure import devicemem, machine_load, timer
from speedladder.progress import Progress, task_of
from speedladder.racing.runs import Clock, Entrant, RunInProgress, Runner, Stepper, WallClock, rotated, rung_cap
from speedladder.racing.target import val_hash
from speedladder.racing.verdicts import builds_upon, built_upon_line, capped_out, changes_learning, judge
from speedladder.records import Causality, RaceEntry, RaceRun, RaceSection, RaceStage, Results, storage
from speedladder.records.race_section import RaceRole
from speedladder.rungs import RUNGS, compose
from speedladder.spec import StepSpec
from speedladder.step.measurement import read_machine_load
from speedladder.step.train_step import TrainStep, matmul_precision
from speedladder.step.workload import Workload, free_device_memory, new_results
from speedladder.verify import probes

_PROBE_LOGITS = 1 << 24  # logits kept for the causality probe, as the gates keep (verify._PROBE_LOGITS)


class Race(Runner):
    """A race: configurations trained to one target val loss from several seeds, each judged by its time to the
    target against the configuration it built on, paired by seed.

    Owns: the workload's val set, the race's section of results (`RaceSection`: entries, stages, verdicts), a clock,
    the machine-load meter, and each configuration's prepared step (`Entrant`: gated for causality, compiled and
    warmed up outside the clock).

    Runs, in order (`run`): the machine's load before anything of ours; then, for a ladder, rung by rung
    (`_run_ladder`): the baseline is prepared and the target calibrated on it (`calibrate`: eager fp32's val loss
    after `calibrate_steps` steps, a seed of its own); each later rung is composed on the best configuration so far,
    prepared, and raced beside it in one stage (`_stage`: every seed, the two runs of a seed taking turns stretch by
    stretch, `_seed`); the stage is judged (verdicts.judge) and the next rung builds on this one only if it paid.
    A rung stopped at its cap in each of its first two seeds is a loss and its other seeds are not run. Given
    configurations instead (`prepare_combos`, `prepare_configs`, tune's finalists) are raced in one stage.

    Leaves behind: results.json in `run_dir`, saved after every run and on an interrupt (status "complete" or
    "interrupted"), with config.toml beside it when the race is a command of its own; the report reads them.
    """

    def __init__(self, work: Workload, run_dir: Path, race: RaceConfig, progress: Progress | None = None,
                 clock: Clock | None = None, role: RaceRole = "rung", settings: Settings | None = None,
                 results_: Results | None = None, target_note: str | None = None) -> None:
        """results_: a results file of another command to race inside (tune's); by default a race of its own, with
        its config.toml. target_note: where a given target came from (--target-from)."""
        self.work = work
        self.run_dir = run_dir
        self.cfg = race
        self.progress = progress or Progress(quiet=True)
        self.clock = clock or WallClock(work.device)
        self.meter = machine_load.Meter.open()  # other processes' load around each stretch (None off Linux)
        self.role = role  # "combo", "winner" or "finalist" when the configurations are given rather than a ladder
        self.target_note = target_note
        self.val_x, self.val_y = work.val_set(work.cfg.seq_len)
        base = work.base_spec
        seed = work.cfg.run.seed
        budget_steps = race.calibrate_steps if race.budget_steps is None else race.budget_steps
        self.section = RaceSection(
            seeds=[seed + i for i in range(race.seeds)], eval_every=race.eval_every,
            eval_tokens=race.eval_every * base.tokens_per_step, val_sequences=len(self.val_x),
            val_seq_len=work.cfg.seq_len, val_hash=val_hash(self.val_x, self.val_y), alpha=race.alpha,
            detect=race.detect, batch_lr_scale=work.cfg.run.batch_lr_scale, calibrate_steps=race.calibrate_steps,
            cap_factor=race.cap_factor, budget_steps=budget_steps or None,
            budget_tokens=budget_steps * base.tokens_per_step or None, stack_all=race.stack_all,
            order="in stages; within a stage, the configurations' order rotated from seed to seed")
        self.section.config = race
        if results_ is None:
            self.results: Results = new_results(work, kind="race")
            self.results.race = self.section
            # config.toml: the resolved run and this race, which `speedladder race --config` repeats.
            write_settings(run_dir / CONFIG_FILE,
                           dataclasses.replace(settings or Settings(), run=work.cfg.run, race=race),
                           f"speedladder race: the configuration of {run_dir}", ("run", "race", "quiet"))
        else:
            self.results = results_
        self.machine = self.results.machine  # set when the race begins, unless the command's ladder did (tune)
        self.prepared: list[Entrant] = []
        self._ladder: tuple[str, ...] | None = None
        self._inits: dict[int, dict[str, torch.Tensor]] = {}
        self.save()

    def save(self) -> None:
        storage.save(self.results, self.run_dir)

    # -- the configurations ---------------------------------------------------------------------

    def _entry(self, name: str, names: tuple[str, ...], spec: StepSpec, built_on: Entrant | None,
               role: RaceRole) -> RaceEntry:
        last = RUNGS[names[-1]] if names else RUNGS["eager"]
        return RaceEntry(name=name, rungs=list(names), role=role, reason=last.reason, kind=last.kind,
                         built_on=built_on.entry.name if built_on else None, spec=spec,
                         precision=spec.precision,
                         changes_learning=built_on is not None and changes_learning(spec, built_on.spec))

    def prepare_ladder(self, names: tuple[str, ...]) -> None:
        """A cumulative ladder, raced stage by stage: run() prepares each rung when its stage comes, on the best
        configuration so far (the verdicts decide which)."""
        self._ladder = tuple(names)

    def prepare_combos(self, combos: tuple[tuple[str, ...], ...], role: RaceRole = "combo") -> None:
        """Eager, then each given set of rungs composed on it, each judged against eager, in one stage."""
        env = self.work.env
        self.prepare_configs([("+".join(n for n in names if n != "eager") or "eager-again",
                               tuple(n for n in names if n != "eager"),
                               compose(tuple(n for n in names if n != "eager"), self.work.base_spec, env))
                              for names in combos], role)

    def prepare_configs(self, configs: list[tuple[str, tuple[str, ...], StepSpec]], role: RaceRole) -> None:
        """Eager, then each (name, rungs, spec) given, each judged against eager, in one stage."""
        base = self._prepare(self._entry("eager", ("eager",), self.work.base_spec, None, "rung"),
                             self.work.base_spec)
        for name, names, spec in configs:
            self._prepare(self._entry(name, names, spec, base if base.entry.ok else None, role), spec)

    def _prepare(self, entry: RaceEntry, spec: StepSpec) -> Entrant:
        """Build, compile and warm up; probe causality. A configuration that cannot run is recorded, never dropped."""
        self.section.entries.append(entry)
        say = self.progress.scoped(f"race {entry.name}")
        p = Entrant(entry, spec, None)
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
                stream = self.work.stream(spec)
                started = time.perf_counter()
                last = next((x.entry.warmup_s for x in reversed(self.prepared) if x.spec.compile and x.entry.warmup_s),
                            None)  # the last compile's warm-up: what this one should take
                with task_of(say, "the first step (it compiles) and the warm-up", estimate_s=last, shown=spec.compile):
                    timing = timer.warm_up(timer.stepper(step, stream), self.work.device, self.work.cfg.warmup,
                                             self.work.cfg.run.timing.max_warmup, on_progress=say)
                entry.warmup_s = time.perf_counter() - started
                steady = [s for s, c in zip(timing.warmup_step_s, timing.warmup_compiled) if not c]
                entry.compile_s = (timer.compile_seconds(timing, statistics.median(steady))
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

    @staticmethod
    def _release(p: Entrant) -> None:
        """A configuration no later stage trains: its step (and compiled code) freed. Not torch.compiler.reset():
        the base's compiled step is still in use."""
        p.step = None
        gc.collect()

    # -- the target and the cap -----------------------------------------------------------------

    def _eager_step(self) -> Stepper:
        """Eager fp32 at the workload's shape: the prepared baseline when it is one, else built here."""
        base = self.work.base_spec
        found = next((p.step for p in self.prepared if p.spec == base and p.step is not None), None)
        return found or self.work.step(base)

    def calibrate(self) -> None:
        """Set the target (given, or eager fp32's val loss after calibrate_steps steps on a seed of its own) and
        the race's time cap (given, or cap_factor times what eager fp32 needs for those steps)."""
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
            sec.target_loss, sec.target_from = c.target_loss, self.target_note or "--target-loss"
            eager_s = self._steps_seconds(eager, seed, c.calibrate_steps)
        if c.time_cap_s is not None:
            sec.time_cap_s, sec.cap_from = c.time_cap_s, "--time-cap"
        else:  # a base is known to reach: its cap is only a guard, generous so that a slow moment cannot censor it
            sec.time_cap_s = 2 * c.cap_factor * eager_s
            sec.cap_from = f"twice --cap-factor times eager fp32's {c.calibrate_steps} steps ({eager_s:.2f} s)"
        say(f"target val loss {sec.target_loss:.4f} ({sec.target_from}); a rung stops at {c.cap_factor:g}x its "
            f"base's time in the same seed, a base at {sec.time_cap_s:.1f} s of training ({sec.cap_from})")
        self.save()

    def _steps_seconds(self, step: Stepper, seed: int, steps: int) -> float:
        """What `steps` steps take on the clock, priced from a short stretch (for the cap when the target is given)."""
        n = max(1, min(steps, 2 * self.cfg.eval_every))
        run = self.train_to(step, seed, -math.inf, None, max_steps=n)
        return run.train_seconds * steps / n

    def _seed(self, stage: RaceStage, order: list[Entrant], base: Entrant, seed: int) -> None:
        """One seed of a stage: every configuration's run begun (memory handed back once, then each warmed up off
        the clock), then the runs take turns, a stretch between two evaluations at a time, the one with the least
        training time next (ties in the seed's order). So they see the machine in the same seconds. Once the base
        is done, every other run is capped at cap_factor times its time. Each run is saved as it ends."""
        sec, name = self.section, base.entry.name
        target = sec.target_loss
        assert target is not None, "the target is set (given or calibrated) before any stage"
        devicemem.return_host_memory()  # once, before every run of the seed begins: not between their stretches
        going: list[tuple[int, Entrant, RunInProgress]] = []
        caps: dict[int, str] = {}

        def end(position: int, p: Entrant, run: RaceRun) -> None:
            run.stage, run.position = stage.index, position
            run.cap_from = caps.get(position, "") or ("the race's time cap" if p is base else
                                                      f"none: it was done before {name}")
            p.entry.runs.append(run)
            stage.wall_s = time.perf_counter() - started
            self.save()

        started = time.perf_counter() - (stage.wall_s or 0.0)
        for position, p in enumerate(order):
            cap = sec.time_cap_s if p is base else self.cfg.time_cap_s
            if p is not base and cap is not None:
                caps[position] = "--time-cap"
            assert p.step is not None, "only a configuration that was prepared races"
            try:
                going.append((position, p, self.begin(p.step, seed, target, cap,
                                                      budget_tokens=sec.budget_tokens)))
            except KeyboardInterrupt:
                raise
            except Exception as e:  # noqa: BLE001 -- this run fails, recorded; the race goes on
                self.progress.scoped(f"race {p.entry.name}")(f"seed {seed}: error: {one_line(e)}")
                end(position, p, RaceRun(seed=seed, stopped=f"error: {one_line(e)}"))
        while live := [x for x in going if not x[2].done]:
            position, p, g = min(live, key=lambda x: (x[2].clock, x[0]))
            try:
                self.advance(g)
            except KeyboardInterrupt:
                raise
            except Exception as e:  # noqa: BLE001 -- this run fails, recorded; the others go on
                g.run.stopped, g.done = f"error: {one_line(e)}", True
            if not g.done:
                continue
            run = self.finish(g, self.progress.scoped(f"race {p.entry.name}"))
            run.cap_s = g.cap_s
            end(position, p, run)
            if p is base:  # its time in this seed sets every other run's cap
                for other_position, other, og in going:
                    if og.done or other is base:
                        continue
                    og.cap_s, why = rung_cap(run, self.cfg.cap_factor, self.cfg.time_cap_s, sec.time_cap_s)
                    caps[other_position] = why.format(name)
                    if og.cap_s is not None and og.clock >= og.cap_s:
                        og.run.stopped, og.done = "time cap", True
                        stopped = self.finish(og, self.progress.scoped(f"race {other.entry.name}"))
                        stopped.cap_s = og.cap_s
                        end(other_position, other, stopped)

    def open_stage(self, configs: list[Entrant], base: Entrant) -> RaceStage:
        """A new stage of these configurations, each judged against `base` (race_seed runs its seeds)."""
        sec = self.section
        stage = RaceStage(index=len(sec.stages) + 1, names=[p.entry.name for p in configs], base=base.entry.name)
        sec.stages.append(stage)
        for p in configs:
            if p.entry.stage is None:
                p.entry.stage = stage.index
        return stage

    def race_seed(self, stage: RaceStage, configs: list[Entrant], base: Entrant, i: int) -> bool:
        """The stage's i-th seed, its order rotated by i; False, with nothing run, once every rung is decided. A rung
        stopped at cap_factor x its base in each of its first two seeds is a loss, and decided."""
        seed = self.section.seeds[i]
        going = [p for p in configs if p.entry.name not in stage.decided]
        if all(p is base for p in going) and len(configs) > 1:
            return False  # every rung decided: nothing left to race its base against
        order = rotated(going, i)
        stage.orders.append([p.entry.name for p in order])
        first = self.snapshot()  # the other processes' CPU so far, to name them if a run shares the machine
        self._seed(stage, order, base, seed)
        self.note_load([r for p in going for r in p.entry.runs if (r.stage, r.seed) == (stage.index, seed)], first)
        for p in going:
            if p is not base and capped_out(p.entry, base.entry, self.cfg.cap_factor):
                stage.decided.append(p.entry.name)
                self.progress.scoped(f"race {p.entry.name}")(
                    f"stopped at {self.cfg.cap_factor:g}x {base.entry.name}'s time in each of its first "
                    f"{i + 1} seeds: a loss; its other seeds are not run")
        return True

    def _stage(self, configs: list[Entrant], base: Entrant) -> RaceStage:
        """Every configuration trained from every seed, the order rotated from seed to seed; saved after each run."""
        stage = self.open_stage(configs, base)
        # Shown seed by seed, with no ticker thread: the runs' clocked stretches are timed work.
        with self.progress.scoped(f"race stage {stage.index}").task(
                f"{', '.join(stage.names)}, {len(self.section.seeds)} seeds", total=len(self.section.seeds),
                tick=False) as shown:
            for i, seed in enumerate(self.section.seeds):
                if not self.race_seed(stage, configs, base, i):
                    break
                shown.advance(note=f"seed {seed} done")
        return stage

    def _run_ladder(self, names: tuple[str, ...]) -> None:
        """Stage by stage: each rung composed on the best configuration so far, raced beside it, then judged; the
        next builds on it only if it paid (won, or was noise above 1.0x), or on every one that ran with stack_all."""
        spec, base, path = self.work.base_spec, None, tuple[str, ...]()
        for name in names:
            try:
                new = RUNGS[name].transform(spec, self.work.env)
            except Exception as e:  # noqa: BLE001 -- a rung's own transform that raised: recorded, the race goes on
                entry = self._entry(name, (*path, name), spec, base, "rung")
                entry.status, entry.detail, entry.built_upon = "error", one_line(e), False
                self.section.entries.append(entry)
                self.progress.scoped(f"race {name}")(f"error: {entry.detail}")
                self.save()
                continue
            p = self._prepare(self._entry(name, (*path, name), new, base, "rung"), new)
            if not p.entry.ok:
                p.entry.built_upon = False
                continue
            if base is None:  # the baseline: every later stage is measured from it
                p.entry.built_upon = True
                spec, base, path = new, p, (*path, name)
                self.calibrate()
                continue
            self._stage([base, p], base)
            judge(self.section)
            pays = p.entry.built_upon = self.cfg.stack_all or builds_upon(p.entry)
            self.progress.scoped(f"race {p.entry.name}")(built_upon_line(p.entry, base.entry.name, pays))
            if pays:
                self._release(base)
                spec, base, path = new, p, (*path, name)
            else:
                self._release(p)
            self.save()
        if base is not None and not base.entry.runs:  # a ladder of one: the baseline raced alone
            self._stage([base], base)

    def run(self) -> Results:
        """Calibrate, race the stages, then judge; saved after every run."""
        try:
            if self.meter is not None and self.machine is None:  # before anything of ours runs
                self.machine = self.results.machine = read_machine_load(self.meter, self.progress.scoped("machine"))
            if self._ladder is not None:
                self._run_ladder(self._ladder)
            else:
                ready = [p for p in self.prepared if p.entry.ok and p.step is not None]
                if ready:
                    self.calibrate()
                    self._stage(ready, ready[0])
            judge(self.section)
            self.results.status = "complete"
        except KeyboardInterrupt:
            self.results.status = "interrupted"
            judge(self.section)
            raise
        finally:
            self.save()
        return self.results
