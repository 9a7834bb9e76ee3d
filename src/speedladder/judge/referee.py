"""One decision: the candidate gated, raced against its base seed by seed, kept, reverted or left undecided.

The referee owns the clock, the data and the evaluation: each side's code runs in a worker process of its own
(remote.py), stopped whenever it is off the clock; the race (racing/) draws every batch here, times every stretch
here and evaluates every side here, in eager fp32 on the held-out split. In order (Referee.decide):

1. both workers started together, each building its side (rung files imported under the guard);
2. both warmed up, compiled where they compile, off the clock;
3. the candidate's gaming probes and gates (a gamed candidate, a failed gate or a broken causality is reverted
   here, unraced);
4. the target: the base's val loss after --calibrate-steps steps on a seed of its own (or --target-loss,
   --target-from);
5. seeds, one at a time, the two runs of a seed taking turns (racing.engine), each followed by the guard's
   reading of both workers and the sequential rule (rule.py), until it decides, or the seeds or the budget end.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from dataclasses import dataclass
from typing import Any

import torch

from speedladder import codec
from speedladder.config.judge import FIRST_LOOK
from speedladder.config.settings import CONFIG_FILE, Settings
from speedladder.config.settings import write as write_settings
from speedladder.judge import record as rec
from speedladder.judge import rule, sides
from speedladder.judge.remote import (
    Buffer,
    Evaluator,
    JudgeRace,
    RemoteStep,
    SideFailed,
    Worker,
    WorkerMeter,
    copy_tokens,
    protected_paths,
)
from speedladder.judge.wire import WireError
from speedladder.judge.worker import Hello
from speedladder.measure import stats
from speedladder.meta import __version__
from speedladder.progress import Progress
from speedladder.racing import target
from speedladder.racing.runs import Entrant
from speedladder.racing.verdicts import changes_learning, judge, pairs, time_of
from speedladder.records import Gate, RaceEntry, from_dict
from speedladder.records.storage import new_run_dir
from speedladder.spec import StepSpec
from speedladder.step.workload import Workload, new_results, prepare

JUDGE_FILE = "judge.json"  # beside the race's results.json: the printed object


@dataclass(frozen=True)
class Outcome:
    decision: str
    why: str
    detail: str


def _look_dict(look: rule.Look) -> dict[str, Any]:
    return {"seeds": look.seeds, "p_win": look.p_win, "p_loss": look.p_loss, "p_short": look.p_short,
            "speedup": look.speedup, "decision": look.decision}


class SideError(Exception):
    """A side's worker failed (its code raised, it found bad input, or it stopped answering)."""

    def __init__(self, which: str, error: Exception) -> None:
        super().__init__(str(error))
        self.which, self.error = which, error
        self.problems = error.problems if isinstance(error, SideFailed) else []
        self.usage = isinstance(error, SideFailed) and error.usage


class Referee:
    """One decision, from the arguments to its Judgement (decide); the workers and buffers are always ended.

    Owns: both sides (sides.py), the workload in this process (data, val set, initial weights), the evaluator,
    both workers and their buffers, and the race (a JudgeRace) once both sides are built.
    Leaves behind: the race's folder (results.json after every run, config.toml, judge.json) and the Judgement.
    """

    def __init__(self, s: Settings, candidate: str, progress: Progress) -> None:
        self.t0 = time.perf_counter()
        self.s, self.cfg, self.progress = s, s.judge, progress
        self.say = progress.scoped("judge")
        self.base = sides.read("base", s.judge.base, s.run) if s.judge.base else sides.eager(s.run)
        self.cand = sides.read("candidate", candidate, s.run, self.base if self.base.kind != "eager" else None)
        race = dataclasses.replace(s.race, seeds=self.cfg.max_seeds, alpha=self.cfg.false_keep, rungs=None,
                                   combos=(), run=None, ladder=None)
        self.race_cfg, self.target_note, self.same_ruler = target.fixed(race)
        self.workers: list[Worker] = []
        self.buffers: list[Buffer] = []
        self.cost = rec.Cost(seconds=0.0)
        self.gate: Gate | None = None
        self.gamed: list[str] = []
        self.looks: list[rule.Look] = []
        self.race: JudgeRace | None = None
        self.metas: list[dict[str, Any]] = []
        self.seed_walls: list[float] = []
        self.loadavg = _loadavg()

    # -- the parts -----------------------------------------------------------------------------

    def _prepare(self) -> Workload:
        """The workload in this process: eager fp32, no rung file of either side (their code never runs here)."""
        work = prepare(sides.workload(self.s.run))
        work.val_set(work.cfg.seq_len)
        self.same_ruler(work)
        self.race_cfg = work.raced(self.race_cfg)
        return work

    def _hello(self, work: Workload, side: sides.Side, buffer: Buffer, gate: bool) -> Hello:
        train = dataclasses.replace(work.corpus, tokens=copy_tokens(work.corpus.tokens))
        return Hello(run=side.run, declared_from=side.declared_from, vocab=work.corpus.vocab_size or None,
                     device=str(work.device), train=train, schedule=work.schedule, buffer=buffer.path,
                     layout=buffer.layout, protected=protected_paths(work), gate=gate, quiet=self.s.quiet)

    def _start(self, work: Workload, evaluator: Evaluator) -> None:
        """Both workers started together; each answers what it built."""
        for which, side in (("base", self.base), ("candidate", self.cand)):
            buffer = Buffer(evaluator.step.params)
            self.buffers.append(buffer)
            self.workers.append(Worker(which, self._hello(work, side, buffer, which == "candidate"),
                                       self.cfg.worker_timeout_s, self.s.quiet))
        try:
            for which, worker in zip(("base", "candidate"), self.workers):
                try:
                    self.metas.append(worker.answer())
                except (SideFailed, WireError) as e:
                    raise SideError(which, e) from None
        finally:
            for buffer in self.buffers:  # both sides have it mapped, or never will: no file is left behind
                buffer.close()

    def _ask(self, which: str, op: str) -> dict[str, Any]:
        worker = self.workers[0 if which == "base" else 1]
        try:
            return worker.request(op)
        except (SideFailed, WireError) as e:
            raise SideError(which, e) from None

    def _entry(self, side: sides.Side, meta: dict[str, Any], built_on: RaceEntry | None) -> RaceEntry:
        spec = codec.from_data(StepSpec, meta["spec"], "a worker's spec")
        names = list(meta["rungs"])
        kinds = meta["kinds"]
        name = side.name if built_on is None or side.name != built_on.name else f"{side.name} (candidate)"
        return RaceEntry(name=name, rungs=["eager", *names], role="rung" if built_on is None else "combo",
                         reason=str(meta["reasons"].get(names[-1], "")) if names else "eager fp32",
                         kind=str(kinds.get(names[-1], "speed")) if names else "speed",
                         built_on=built_on.name if built_on else None, spec=spec, precision=spec.precision,
                         status="ok", changes_learning=built_on is not None and changes_learning(spec, built_on.spec))

    def _open_race(self, work: Workload, evaluator: Evaluator) -> JudgeRace:
        """The race's folder and record, with both sides prepared as remote steps."""
        run_dir = new_run_dir(work.cfg.run.out)
        results = new_results(work, kind="race")
        race = JudgeRace(work, run_dir, self.race_cfg, self.progress, role="combo", results_=results,
                         target_note=self.target_note)
        results.race = race.section
        if race.meter is not None:
            race.meter = WorkerMeter(race.meter, self.workers)
        write_settings(run_dir / CONFIG_FILE, dataclasses.replace(self.s, run=work.cfg.run, race=self.race_cfg),
                       f"speedladder judge: the configuration of {run_dir}", ("run", "race", "judge", "quiet"))
        base = self._entry(self.base, self.metas[0], None)
        cand = self._entry(self.cand, self.metas[1], base)
        for entry, worker, buffer in zip((base, cand), self.workers, self.buffers):
            step = RemoteStep(worker, entry.spec, buffer, evaluator, work.init)
            race.prepared.append(Entrant(entry, entry.spec, step))
            race.section.entries.append(entry)
        race.base_step = race.prepared[0].step
        race.save()
        return race

    # -- the phases ----------------------------------------------------------------------------

    def _warm(self) -> None:
        assert self.race is not None
        for which, p in zip(("base", "candidate"), self.race.prepared):
            self.say(f"{which} {p.entry.name}: warming up" + (" and compiling" if p.spec.compile else ""))
            answer = self._ask(which, "warm")
            p.entry.warmup_s, p.entry.compile_s = answer.get("warmup_s"), answer.get("compile_s")

    def _gate(self) -> Outcome | None:
        """The candidate's gaming probes and gates; an outcome when they end the decision here."""
        self.say("the candidate's gaming probes and gates, in its worker")
        answer = self._ask("candidate", "gate")
        self.gamed += [str(f) for f in answer.get("gaming") or []]
        if answer.get("gate") is not None:
            self.gate = from_dict(Gate, answer["gate"])
        return self._guards() or (Outcome(rule.REVERT, f"gamed: {self.gamed[0]}", "; ".join(self.gamed))
                                  if self.gamed else self._gate_outcome())

    def _gate_outcome(self) -> Outcome | None:
        g = self.gate
        if g is None or g.passed:
            return None
        if g.causality is not None and not g.causality.passed:
            return Outcome(rule.REVERT, "broke-causality", g.causality.detail or g.detail)
        checks = (("equivalence", g.equivalence), ("loss band", g.loss_band), ("differential", g.differential),
                  ("tokens to target", g.tokens_to_target))
        failed = next((name for name, c in checks if c is not None and not c.passed), "could not run")
        return Outcome(rule.REVERT, f"failed-gate: {failed}", g.detail)

    def _guards(self) -> Outcome | None:
        """What each worker's guard has found so far: a candidate's attempt is reverted, a base's leaves it open."""
        for which in ("base", "candidate"):
            problems = [str(p) for p in self._ask(which, "check").get("problems") or []]
            if problems and which == "candidate":
                self.gamed += [p for p in problems if p not in self.gamed]
                return Outcome(rule.REVERT, f"gamed: {problems[0]}", "; ".join(problems))
            if problems:
                return Outcome(rule.UNDECIDED, f"error: the base {problems[0]}", "; ".join(problems))
        return None

    def _calibrate(self) -> None:
        """The target on the base: its val loss after --calibrate-steps steps on a seed of its own (unless given)."""
        assert self.race is not None
        race, sec = self.race, self.race.section
        race.calibrate()
        name = race.prepared[0].entry.name
        if sec.calibration is not None:
            sec.target_from = sec.target_from.replace("eager fp32's", f"the base's ({name})")
        sec.cap_from = sec.cap_from.replace("eager fp32's", f"the base's ({name})")
        race.save()

    def _seed_estimate(self, i: int) -> float:
        """What the next seed should take: the slowest seed so far, or twice the calibration run, with a quarter
        more as a margin."""
        assert self.race is not None
        cal = self.race.section.calibration
        first = 2 * (cal.train_seconds + cal.eval_seconds) if cal is not None else 0.0
        return 1.25 * (max(self.seed_walls) if self.seed_walls else first)

    def _over(self, need_s: float) -> bool:
        return time.perf_counter() - self.t0 + need_s > self.cfg.budget_s

    def _seeds(self) -> Outcome:
        """Seed after seed, each followed by the guards and a look of the rule, until one decides."""
        assert self.race is not None
        race = self.race
        base, cand = race.prepared
        stage = race.open_stage([base, cand], base)
        for i in range(self.cfg.max_seeds):
            need = self._seed_estimate(i)
            if self._over(need):
                return Outcome(rule.UNDECIDED, "budget", f"the budget of {self.cfg.budget_s:g} s ended after {i} "
                               f"seeds (the next would take about {need:.0f} s) before the rule decided")
            started = time.perf_counter()
            race.race_seed(stage, [base, cand], base, i)
            judge(race.section)
            race.save()
            self.seed_walls.append(time.perf_counter() - started)
            self.say(f"seed {race.section.seeds[i]} raced in {self.seed_walls[-1]:.1f} s")
            outcome = self._guards() or self._runs_outcome(stage.decided) or self._look()
            if outcome is not None:
                return outcome
        return Outcome(rule.UNDECIDED, "budget", f"{self.cfg.max_seeds} seeds raced (--max-seeds) and the rule did "
                       "not decide: the candidate's gain, if any, is too close to --min-gain for these seeds")

    def _runs_outcome(self, decided: list[str]) -> Outcome | None:
        """A run that failed, diverged or was capped out ends the decision before the rule's look."""
        assert self.race is not None
        base, cand = (p.entry for p in self.race.prepared)
        for entry, which in ((base, "base"), (cand, "candidate")):
            broken = next((r for r in entry.own_runs if r.stopped.startswith("error")), None)
            if broken is not None and which == "base":
                return Outcome(rule.UNDECIDED, f"error: the base's run of seed {broken.seed}: {broken.stopped[7:]}",
                               broken.stopped)
            if broken is not None:
                return Outcome(rule.REVERT, f"error: {broken.stopped[7:]}", f"its run of seed {broken.seed} failed")
            diverged = next((r for r in entry.own_runs if r.stopped == "diverged"), None)
            if diverged is not None:
                return (Outcome(rule.REVERT, "diverged", f"its val loss stopped being finite (seed {diverged.seed})")
                        if which == "candidate" else
                        Outcome(rule.UNDECIDED, "error: the base diverged", f"seed {diverged.seed}"))
        if cand.name in decided:
            return Outcome(rule.REVERT, "loss", cand.verdict_detail or "stopped at the cap in its first two seeds")
        return None

    def _look(self) -> Outcome | None:
        assert self.race is not None
        base, cand = (p.entry for p in self.race.prepared)
        ps = pairs(cand, base)
        test = stats.paired([time_of(r) for r, _ in ps], [time_of(b) for _, b in ps], self.cfg.false_keep)
        look = rule.look(test.low, test.high, self.cfg)
        self.looks.append(look)
        if look.decision is None:
            if look.seeds >= FIRST_LOOK:
                self.say(f"after {look.seeds} seeds: p win {look.p_win:.2g}, p loss {look.p_loss:.2g}, p short of "
                         f"{self.cfg.min_gain:.0%} {look.p_short:.2g}: not decided at {look.level_keep:.2g} / "
                         f"{look.level_revert:.2g}; another seed")
            return None
        ratio = f"{look.speedup:.3f}x" if look.speedup is not None else "an unbounded ratio"
        detail = (f"{ratio} the base's speed to the target over {look.seeds} seeds (interval {_interval(look)} at "
                  f"{look.confidence:.1%})")
        if look.decision == rule.KEEP and cand.equal_tokens is not None and cand.equal_tokens.worse:
            return Outcome(rule.REVERT, "not-a-win", f"{detail}, but {cand.equal_tokens.detail}")
        return Outcome(look.decision, look.why or "", detail)

    # -- the decision --------------------------------------------------------------------------

    def _run(self) -> Outcome:
        """Long because it is the decision's outline, each phase timed: see the module's docstring."""
        t = time.perf_counter()
        work = self._prepare()
        evaluator = Evaluator(work)
        self.say(f"starting the workers: base {self.base.name}, candidate {self.cand.name}")
        self._start(work, evaluator)
        self.race = self._open_race(work, evaluator)
        self.cost.workers_s, t = time.perf_counter() - t, time.perf_counter()
        self._warm()
        self.cost.warmup_s, t = time.perf_counter() - t, time.perf_counter()
        outcome = self._gate()
        self.cost.gates_s, t = time.perf_counter() - t, time.perf_counter()
        if outcome is not None:
            return outcome
        if self._over(0.0):
            return Outcome(rule.UNDECIDED, "budget", f"the budget of {self.cfg.budget_s:g} s ended before the race")
        self._calibrate()
        self.cost.calibration_s, t = time.perf_counter() - t, time.perf_counter()
        try:
            return self._seeds()
        finally:
            self.cost.race_s = time.perf_counter() - t

    def decide(self) -> rec.Judgement:
        """The whole decision. Bad input (found here or by a worker) raises UsageError: nothing is judged."""
        try:
            outcome = self._run()
        except KeyboardInterrupt:
            if self.race is not None:  # what was raced is kept, said to be interrupted
                self.race.results.status = "interrupted"
                self.race.save()
            raise
        except SideError as e:
            if e.usage and not e.problems:
                from speedladder.errors import UsageError

                raise UsageError(f"{e.which}: {e}") from None
            outcome = self._failed(e)
        finally:
            self._close()
        judgement = self._judgement(outcome)
        if self.race is not None:
            sec = self.race.section
            sec.seeds = sec.seeds[:judgement.seeds.used if judgement.seeds else 0]  # the seeds raced, not the most
            self.race.results.status = "complete"
            self.race.save()
            path = self.race.run_dir / JUDGE_FILE
            tmp = path.with_suffix(".json.tmp")
            tmp.write_text(json.dumps(codec.to_data(judgement, json=True), indent=1, allow_nan=False))
            os.replace(tmp, path)
        return judgement

    def _failed(self, e: SideError) -> Outcome:
        if e.which == "base":
            return Outcome(rule.UNDECIDED, f"error: the base: {e}", "the base's worker failed: nothing to judge against")
        if e.problems:
            self.gamed += [p for p in e.problems if p not in self.gamed]
            return Outcome(rule.REVERT, f"gamed: {e.problems[0]}", str(e))
        return Outcome(rule.REVERT, f"error: {e}", "the candidate's code raised in its worker")

    def _close(self) -> None:
        for worker in self.workers:
            worker.bye()
        for worker in self.workers:
            worker.close()
        for buffer in self.buffers:
            buffer.close()

    def _side(self, side: sides.Side, i: int) -> rec.SideRecord:
        out = rec.SideRecord(name=side.name, source=side.source, kind=side.kind)
        if i < len(self.metas):
            meta = self.metas[i]
            out.rungs, out.kinds = list(meta["rungs"]), dict(meta["kinds"])
        if self.race is not None:
            entry = self.race.prepared[i].entry
            out.name, out.spec, out.precision, out.compile_s = entry.name, entry.spec, entry.precision, entry.compile_s
        return out

    def _judgement(self, outcome: Outcome) -> rec.Judgement:
        cfg = self.cfg
        j = rec.Judgement(decision=outcome.decision, why=outcome.why, detail=outcome.detail,
                          candidate=self._side(self.cand, 1), base=self._side(self.base, 0), gate=self.gate,
                          gamed=list(self.gamed), speedladder=__version__, torch=torch.__version__,
                          loadavg=self.loadavg)
        j.rule = rec.Rule(cfg.false_keep, cfg.false_revert, cfg.min_gain, cfg.keep_floor, FIRST_LOOK, cfg.max_seeds,
                          cfg.looks, cfg.false_keep / cfg.looks, cfg.false_revert / cfg.looks, cfg.budget_s)
        if self.race is not None:
            sec = self.race.section
            base, cand = (p.entry for p in self.race.prepared)
            j.run_dir, j.target, j.target_from = str(self.race.run_dir), sec.target_loss, sec.target_from
            raced = sorted({r.seed for r in cand.own_runs} & {r.seed for r in base.own_runs})
            j.seeds = rec.Seeds(used=len(raced), max=cfg.max_seeds, seeds=raced,
                                looks=[_look_dict(k) for k in self.looks])
            j.criterion = rec.Criterion(sec.target_loss, sec.budget_tokens, cand.budget, base.budget)
            j.speed = rec.Speed(cand.tokens_per_s, base.tokens_per_s, cand.tokens_per_s_prev,
                                cand.time.mean if cand.time else None, base.time.mean if base.time else None,
                                cand.token_ratio)
            if self.looks:
                j.effect = _effect(self.looks[-1], cand, base)
        self.cost.seconds = time.perf_counter() - self.t0
        j.cost = self.cost
        return j


def _interval(look: rule.Look) -> str:
    lo, hi = look.interval
    return f"{lo:.3f}-{hi:.3f}" if lo is not None and hi is not None else (
        f"from {lo:.3f}" if lo is not None else f"up to {hi:.3f}" if hi is not None else "unbounded")


def _effect(look: rule.Look, cand: RaceEntry, base: RaceEntry) -> rec.Effect:
    per_seed = [b.seconds / r.seconds if r.reached and b.reached and r.seconds and b.seconds
                else None for r, b in pairs(cand, base)]
    return rec.Effect(look.speedup, look.bound, list(look.interval), look.confidence, look.p_win, look.p_loss,
                      look.p_short, per_seed)


def _loadavg() -> float | None:
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        return None
