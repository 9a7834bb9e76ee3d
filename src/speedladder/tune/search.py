"""`speedladder tune`: the fastest configuration that still passes every gate, within a time budget.

1. Climb the full ladder (the same windows and gates as `speedladder run`).
2. Keep the rungs that won (their windows wholly above the rung they built on,
   gates passed); drop those whose verdict was loss or noise, that failed a
   gate, or that could not run. (`survivors`, `dropped`: pure, on saved results.)
3. Measure the survivors together, then, budget permitting, the survivors with
   each one left out in turn, smallest gain first (`candidates`).
4. The tokens/s judge's winner is the fastest measured configuration (ladder rung or
   candidate) that passed every gate and then the learns-check (`Ladder._learns_check`).
5. Unless `--judge tokens`, the fastest passing configurations are raced beside eager
   to a target val loss over seeds (`race_configs`: the batch rung among them under
   each --batch-lr-scale rule), and the winner is the fastest to the target that
   beats eager at p < alpha (`judge_by_time`). Both judges' answers are kept.
Everything lands in the run folder's results.json, with a "tune" section (its race
in tune.race).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from speedladder.config.run import RunConfig
from speedladder.config.settings import WINNER_FILE, Settings
from speedladder.ladder.climb import Ladder
from speedladder.measure.judging import SHORT
from speedladder.records import RaceSection, Results, Role, RungResult, TuneJudge, TuneSection
from speedladder.records.tune_section import TuneCandidate, TuneCommands
from speedladder.rungs import Env, Rung, compose, kind_of
from speedladder.spec import StepSpec


def _ladder_rungs(results: Results) -> list[RungResult]:
    return [r for r in results.rungs if r.role in (Role.RUNG, Role.BESIDE)]


def dropped(results: Results) -> dict[str, str]:
    """Each ladder rung left out of the combination, with why."""
    out = {}
    for r in _ladder_rungs(results):
        if r.name == "eager":
            continue
        if not r.ok:
            out[r.name] = f"{r.status}: {r.detail}"
        elif r.verdict == SHORT:  # stopped after one window, as predicted far below its base: never gated
            out[r.name] = f"{SHORT}: {r.speedup_prev:.2f}× {r.built_on} in one window, as predicted"
        elif r.gate is None or not r.gate.passed:
            out[r.name] = f"failed a gate: {r.gate.detail if r.gate else 'not run'}"
        elif r.verdict != "win":
            where = "inside the spread of" if r.verdict == "noise" else "below"
            out[r.name] = f"{r.verdict}: {r.speedup_prev:.2f}×, {where} {r.built_on}"
    return out


def survivors(results: Results) -> tuple[str, ...]:
    """The ladder's winning rungs, in ladder order (beside rungs last): what the combination is made of."""
    gone = dropped(results)
    return tuple(r.name for r in _ladder_rungs(results) if r.name != "eager" and r.name not in gone)


def candidates(results: Results, limit: int) -> list[tuple[str, tuple[str, ...]]]:
    """(name, rungs) to measure: the survivors together, then each left out in turn, smallest gain first."""
    keep = survivors(results)
    if not keep:
        return []
    out = [("tuned", keep)]
    gain = {r.name: r.speedup_prev or 0.0 for r in _ladder_rungs(results) if r.name in keep}
    for name in sorted(keep, key=lambda n: gain[n]) if len(keep) > 1 else ():
        out.append((f"tuned-no-{name}", tuple(n for n in keep if n != name)))
    return out[:limit]


def winner(results: Results) -> RungResult | None:
    """The record named fastest (it passed every gate and the learns-check), or None."""
    return results.rung(results.fastest) if results.fastest else None


def rungs_of(record: RungResult, results: Results) -> tuple[str, ...]:
    """The rung names that give a record's spec from eager (Results.chain)."""
    return results.chain(record)


def commands(run_dir: str | Path) -> TuneCommands:
    """How the winner leaves the tool: measured again or trained from winner.toml, or put in the user's loop."""
    winner = Path(run_dir) / WINNER_FILE
    return TuneCommands(run=f"speedladder run --config {winner}", train=f"speedladder train --config {winner}",
                        apply=f'model, optimizer, autocast, spec = speedladder.apply(model, "{winner}")')


def winner_settings(s: Settings, run: RunConfig, names: tuple[str, ...], batch_lr_scale: str | None = None) -> Settings:
    """winner.toml: the tuned run's resolved workload with the winner's rungs (and its batch rung's learning-rate
    rule, when the race chose one), for `run` (run.rungs) and `train` (train.rungs) alike."""
    rungs = tuple(n for n in names if n != "eager")
    run = dataclasses.replace(run.with_rungs(("eager", *rungs)),
                              batch_lr_scale=batch_lr_scale or run.batch_lr_scale)
    return dataclasses.replace(s, run=run, train=dataclasses.replace(s.train, rungs=rungs, run=None))


@dataclass
class Budget:
    """A deadline; `reason` says why the next piece of work would not fit, judged by the slowest one so far."""

    seconds: float
    results: Results
    reserve: int = 1  # keep this many more pieces' worth of time for the combination, once a rung has won
    start: float = 0.0

    def __post_init__(self) -> None:
        self.start = time.perf_counter()

    def left(self) -> float:
        return self.seconds - (time.perf_counter() - self.start)

    def estimate(self) -> float:
        walls = [r.wall_s for r in self.results.rungs if r.wall_s and r.ok]
        return max(walls, default=0.0)

    def reason(self) -> str | None:
        # Time for a combination is kept back only once a rung has won: until then there is nothing to combine.
        need = self.estimate() * (1 + (self.reserve if survivors(self.results) else 0))
        if self.left() < need:
            return (f"not started: the tune budget has {max(self.left(), 0):.0f} s left and a rung takes about "
                    f"{self.estimate():.0f} s")
        return None


def _key(spec: dict) -> str:
    """A spec as a comparable key (tuples in memory and lists from JSON compare equal)."""
    return json.dumps(spec, sort_keys=True, default=list)


def combination_rung(name: str, names: tuple[str, ...]) -> Rung:
    """Rungs measured together: judged as the most far-reaching of them is (rungs.kind_of)."""
    return Rung(name, f"the surviving rungs together: {'+'.join(names)}", kind_of(names), lambda s, e: s)


def measure_candidates(ladder: Ladder, budget: Budget, limit: int, say: Callable[[str], None]) -> list[TuneCandidate]:
    """Measure each candidate on the ladder's baseline, within the budget; each gets the ladder's gates."""
    res = ladder.results
    env: Env = ladder.work.env
    base = res.baseline
    measured = {_key(r.spec.to_dict()): r.name for r in res.rungs if r.ok and r.spec is not None}
    out = []
    budget.reserve = 0
    for name, names in candidates(res, limit):
        spec: StepSpec = compose(names, ladder.work.base_spec, env)
        key = _key(spec.to_dict())
        if key in measured:
            say(f"{name} ({'+'.join(names)}) is {measured[key]}'s configuration, measured already")
            out.append(TuneCandidate(name, list(names), same_as=measured[key]))
            continue
        say(f"measuring {name}: {'+'.join(names)}")
        r = ladder.climb(combination_rung(name, names), spec, base, role=Role.CANDIDATE,
                         predicted=ladder.predicted_together(names))
        r.rungs_combined = list(names)
        ladder.save()
        out.append(TuneCandidate(name, list(names), status=r.status, detail=r.detail))
    return out


def finalists(results: Results, n: int) -> list[RungResult]:
    """The n fastest configurations that passed every gate, by x eager: what is measured again before a winner is
    named (picking the largest of several noisy medians favours the luckiest: the winner's curse)."""
    passed = [r for r in results.rungs if r.role in (Role.RUNG, Role.BESIDE, Role.CANDIDATE) and r.passed
              and r.name != "eager" and r.speedup_cum is not None]
    return sorted(passed, key=lambda r: r.speedup_cum or 0.0, reverse=True)[:n]


def measure_finalists(ladder: Ladder, budget: Budget, n: int, say: Callable[[str], None]) -> list[str]:
    """Each finalist measured again with eager fp32 timed beside it, windows alternating; the names of the
    re-measurements, fastest first by that ratio (what the learns-check then tries, in that order)."""
    res = ladder.results
    base = res.baseline
    out = []
    for r in finalists(res, n):
        assert r.spec is not None  # a finalist passed its gates: it was measured
        names = rungs_of(r, res)
        names = tuple(x for x in names if x != "eager")
        say(f"final: {r.name} again, eager fp32 re-timed beside it")
        final = ladder.climb(combination_rung(f"final-{r.name}", names), r.spec, base,
                             role=Role.FINAL, predicted=ladder.predicted_together(names))
        final.rungs_combined = list(names)
        ladder.save()
        if final.passed:
            out.append(final)
    out.sort(key=lambda x: x.speedup_prev or 0.0, reverse=True)
    return [x.name for x in out]


def summarize(section: TuneSection, results: Results, run_dir: str | Path) -> None:
    """The tune section once the search is over: who won, its rungs and spec, and how it leaves the tool."""
    best = winner(results)
    names = tuple(n for n in (rungs_of(best, results) if best else ()) if n != "eager")
    section.winner, section.winner_rungs = (best.name if best else None), list(names)
    section.winner_spec = best.spec if best else None
    section.commands = commands(run_dir) if best else None


# -- the race among the finalists: the winner named by the time to the target ---------------------

@dataclass(frozen=True)
class Raced:
    """A configuration tune races: the record it comes from, its rungs above eager, its spec and batch rule."""

    name: str
    rungs: tuple[str, ...]
    spec: StepSpec
    batch_lr_scale: str  # its batch rung's learning-rate rule ("none" without a batch rung)
    source: str  # the measured record it is (or varies), for the notes
    tokens_x: float | None  # that record's × eager tokens/s (None for a variant not measured in windows)


def race_configs(results: Results, n: int, env: Env, base: StepSpec) -> list[Raced]:
    """What tune races beside eager, in the order they are kept when the budget is short (the last dropped first):
    the tokens/s winner; the batch axis, the fastest passing configuration with the batch rung under each
    --batch-lr-scale rule (the one asked for first) and the same without it; then the fastest by tokens/s that
    passed every gate, to n finalists besides the batch axis (distinct specs)."""
    from speedladder.config.run import BATCH_LR_SCALES

    passed = [r for r in results.rungs if r.role in (Role.RUNG, Role.BESIDE, Role.CANDIDATE, Role.FINAL)
              and r.passed and r.name != "eager" and r.speedup_cum is not None]
    ranked = sorted(passed, key=lambda r: r.speedup_cum or 0.0, reverse=True)
    won = winner(results)
    rule = env.batch_lr_scale
    out: list[Raced] = []
    seen: set[str] = {_key(base.to_dict())}

    def add(name: str, names: tuple[str, ...], scale: str, source: str, tokens_x: float | None) -> None:
        names = tuple(x for x in names if x != "eager")
        spec = compose(names, base, dataclasses.replace(env, batch_lr_scale=scale))
        key = _key(spec.to_dict())
        if key not in seen:
            seen.add(key)
            out.append(Raced(name, names, spec, scale if "batch" in names else "none", source, tokens_x))

    if won is not None:
        add(won.name, rungs_of(won, results), rule, won.name, won.speedup_cum)
    batched = next((r for r in ranked if "batch" in rungs_of(r, results)), None)
    if batched is not None:  # the batch axis comes next: what a race is most needed for
        names = rungs_of(batched, results)
        for scale in (rule, *(x for x in BATCH_LR_SCALES if x != rule)):
            add(batched.name if scale == rule else f"{batched.name}@lr-{scale}", names, scale, batched.name,
                batched.speedup_cum if scale == rule else None)
        add(f"{batched.name}-no-batch", tuple(x for x in names if x != "batch"), rule, batched.name, None)
    others = 1 if won is not None else 0
    for r in ranked:  # then the fastest by tokens/s, to n finalists besides the batch axis
        if others >= n:
            break
        before = len(out)
        add(r.name, rungs_of(r, results), rule, r.name, r.speedup_cum)
        others += len(out) > before
    return out


def race_seconds(configs: list[Raced], results: Results, calibrate_steps: int, seeds: int,
                 cap_factor: float) -> float | None:
    """What racing these configurations beside eager should take, from the ladder's own measurements: eager's
    calibration and runs at about its calibration time R each, every other run at R over its × eager tokens/s
    (half as long again for the tokens it may need, and never past its cap), 15% more for the evaluations, and
    each configuration that compiles compiled once, as slowly as the slowest compile of the climb; None without an
    eager measurement."""
    eager = results.baseline
    if eager is None or eager.tokens_per_s is None or eager.spec is None:
        return None
    base = eager.spec
    r = calibrate_steps * base.tokens_per_step / eager.tokens_per_s.median
    runs = (1 + seeds) * r + seeds * sum(min(cap_factor, 1.5 / (c.tokens_x or 1.0)) * r for c in configs)
    compile_s = max((x.compile_s or 0.0 for x in results.rungs if x.ok), default=0.0)
    return 1.15 * runs + compile_s * sum(c.spec.compile for c in configs)


def judge_by_time(section: TuneSection, race: RaceSection, configs: list[Raced], results: Results,
                  against_tokens: Callable[[str], float | None] = lambda name: None) -> None:
    """The time judge's winner: the fastest raced configuration that beats eager to the target at p < alpha
    (its × eager is the paired ratio of the one stage they all ran in); eager itself when none does. Its answer
    and the tokens/s judge's are both kept; this one names the winner."""
    by_name = {c.name: c for c in configs}
    won = [e for e in race.entries if e.name in by_name and e.verdict == "win" and e.speedup_cum is not None]
    best = max(won, key=lambda e: e.speedup_cum or 0.0) if won else None
    tokens = section.tokens_judge
    if best is None:
        chosen = Raced("eager", (), race.entries[0].spec, "none", "eager", 1.0)
        detail = f"no raced configuration reached the target faster than eager at p < {race.alpha:g}"
    else:
        chosen = by_name[best.name]
        detail = ""
    other = against_tokens(chosen.name) if tokens is not None and tokens.winner != chosen.name else None
    section.time_judge = TuneJudge("time", chosen.name, list(chosen.rungs), chosen.spec,
                                   chosen.batch_lr_scale if "batch" in chosen.rungs else None, chosen.tokens_x,
                                   best.speedup_cum if best else 1.0, best.p_win if best else None, other, detail)
    if tokens is not None:
        entry = race.entry(tokens.winner or "")
        tokens.time_x = entry.speedup_cum if entry is not None else None
        tokens.p_vs_eager = entry.p_win if entry is not None else None
    section.judge, section.judged_by = "time", "the time to the target val loss (--judge time)"
    section.winner, section.winner_rungs = chosen.name, list(chosen.rungs)
    section.winner_spec = chosen.spec
    section.winner_batch_lr_scale = chosen.batch_lr_scale if "batch" in chosen.rungs else None


def tokens_judge(section: TuneSection, results: Results) -> None:
    """The tokens/s judge's answer (summarize's winner), kept beside the other judge's."""
    best = winner(results)
    if best is None:
        return
    rule = results.config.run.batch_lr_scale
    section.tokens_judge = TuneJudge("tokens", best.name, list(section.winner_rungs),
                                     best.spec,
                                     rule if "batch" in section.winner_rungs else None, best.speedup_cum)
