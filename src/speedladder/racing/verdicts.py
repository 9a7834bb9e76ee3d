"""A race's verdicts: pure functions of its saved section (records.RaceSection), so a saved race can be judged
again and the rule tested on synthetic times (docs/race.md).

A configuration is judged against its base from the runs of its own stage, where both ran afresh from the same
seeds: per seed, the log of its time over the base's, a one-sided t-test each way (stats.paired), censored runs
counted at the bound that works against the verdict. Every derived field is cleared before it is judged again,
so a re-judge that takes another path leaves nothing of the last one behind.
"""

from __future__ import annotations

import dataclasses
import math
import statistics

from speedladder.measure import judging, stats
from speedladder.records import BudgetCheck, EqualTokens, PairedTest, RaceEntry, RaceRun, RaceSection
from speedladder.rungs import ADAMW_VARIANTS, architecture
from speedladder.spec import StepSpec

DID_NOT_REACH, NOT_A_WIN, BASELINE = "did not reach", "not a win", "baseline"
PAYS = (stats.WIN, stats.NOISE)  # the verdicts a cumulative ladder can build on: noise only above 1.0x (builds_upon)

# Everything judge() derives: cleared first, so that nothing of an earlier judgement survives.
DERIVED = ("time", "tokens", "steps", "tokens_per_s", "speedup_prev", "speedup_bound", "speedup_cum", "speedup_cum_bound",
           "tokens_per_s_prev", "tokens_per_s_cum", "token_ratio", "verdict", "verdict_detail", "p_win", "p_loss",
           "detectable", "paired", "equal_tokens", "budget")
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(RaceEntry) if f.name in DERIVED}


def changes_learning(spec: StepSpec, base: StepSpec) -> bool:
    """Batch, optimizer, learning rate or architecture differ: the rung changes how the model learns, not only how
    fast."""
    return (spec.batch_size != base.batch_size or spec.lr_scale != base.lr_scale
            or (spec.optimizer in ADAMW_VARIANTS) != (base.optimizer in ADAMW_VARIANTS)
            or architecture(spec) != architecture(base))


def builds_upon(entry: RaceEntry) -> bool:
    """Whether the next stage builds on a judged rung: its best estimate (× prev, the geometric mean of the per-seed
    ratios) above its base, a win or noise above 1.0x; the claims keep their test (p < alpha). A rung that is not a
    win, did not reach or lost is not built upon (judging.builds_on)."""
    return judging.builds_on(entry.verdict, entry.speedup_prev)


def built_upon_line(entry: RaceEntry, base: str, built_upon: bool) -> str:
    """The progress line of a judged stage: the verdict, its ratio, and what the next stage builds on."""
    ratio = f", {entry.speedup_prev:.2f}x {base}" if entry.speedup_prev is not None else ""
    detail = f" ({entry.verdict_detail})" if entry.verdict_detail else ""
    return (f"{entry.verdict}{detail}{ratio}; " + ("the next stage builds on it" if built_upon else
            f"not built upon ({judging.why_not_built(entry.verdict)}): the next stage builds on {base}"))


def time_of(run: RaceRun) -> stats.Time:
    """A run's time to the target: exact where it reached, else at least its clock when it stopped."""
    if run.reached and run.seconds is not None:
        return stats.Time(run.seconds)
    return stats.Time(run.train_seconds, censored=True)


def pairs(entry: RaceEntry, base: RaceEntry, stage: int | None = None) -> list[tuple[RaceRun, RaceRun]]:
    """The entry's runs and its base's of the same stage (the entry's own, by default), matched by seed."""
    stage = entry.stage if stage is None else stage
    mine = {r.seed: r for r in (entry.runs_in(stage) if stage is not None else entry.runs)}
    theirs = {r.seed: r for r in (base.runs_in(stage) if stage is not None else base.runs)}
    return [(mine[s], theirs[s]) for s in sorted(mine) if s in theirs]


def capped_out(entry: RaceEntry, base: RaceEntry, factor: float | None, least: int = 2) -> bool:
    """Whether every run of the entry's own (at least `least`) was stopped at its cap of `factor` times its base's
    time in the same seed, the base having reached: slower than `factor` x in every seed it ran."""
    if not factor:
        return False
    ps = pairs(entry, base)
    return len(ps) >= least and len(ps) == len(entry.own_runs) and all(
        r.stopped == "time cap" and b.reached and b.seconds is not None and r.cap_s is not None
        and r.cap_s >= factor * b.seconds * (1 - 1e-9) and r.train_seconds >= r.cap_s for r, b in ps)


def versus(a: RaceEntry, b: RaceEntry, alpha: float, stage: int | None = None) -> stats.Paired:
    """a's times against b's, paired by seed, from a stage both ran in (a's own by default)."""
    ps = pairs(a, b, stage)
    return stats.paired([time_of(r) for r, _ in ps], [time_of(x) for _, x in ps], alpha)


def at_tokens(run: RaceRun, tokens: float) -> float | None:
    """A run's val loss at a token count, linear between its evaluations; inf once it diverged, None past its
    last evaluation."""
    import numpy as np

    if not run.curve_tokens or tokens > run.curve_tokens[-1]:
        return None
    vals = [math.inf if v is None else v for v in run.curve_val]
    if any(math.isinf(v) for v, t in zip(vals, run.curve_tokens) if t <= tokens):
        return math.inf
    return float(np.interp(tokens, run.curve_tokens, vals))


def _known(v: float | None) -> float:
    return math.inf if v is None else v


def equal_tokens(entry: RaceEntry, base: RaceEntry, alpha: float) -> EqualTokens:
    """Per seed, both val losses at the tokens where the shorter of the two runs stopped; a one-sided t-test
    paired by seed that the entry is worse there."""
    ps = [(r, b) for r, b in pairs(entry, base) if r.curve_tokens and b.curve_tokens]
    at = [min(r.curve_tokens[-1], b.curve_tokens[-1]) for r, b in ps]
    loss = [_known(at_tokens(r, t)) for (r, _), t in zip(ps, at)]
    base_loss = [_known(at_tokens(b, t)) for (_, b), t in zip(ps, at)]
    if any(math.isinf(v) for v in loss):
        return EqualTokens(at, loss, base_loss, None, True, "its loss diverged")
    if len(ps) < 2 or any(math.isinf(v) for v in base_loss):
        return EqualTokens(at, loss, base_loss, None, False, "not comparable: too few runs, or the base diverged")
    p = stats.one_sided([a - b for a, b in zip(loss, base_loss)], "greater")
    worse = p < alpha
    return EqualTokens(at, loss, base_loss, p, worse,
                       (f"worse at equal tokens: val {statistics.fmean(loss):.4f} vs {statistics.fmean(base_loss):.4f}"
                        f" (p={p:.3g})") if worse else "")


def budget_check(entry: RaceEntry, section: RaceSection) -> BudgetCheck | None:
    """modded-nanogpt's criterion on the entry's own runs: the val loss at the token budget, its mean below the
    target at p < alpha (a one-sample t-test)."""
    if not section.budget_tokens or section.target_loss is None or not entry.own_runs:
        return None
    losses = [r.budget_loss for r in entry.own_runs]
    have = [v for v in losses if v is not None]
    p = stats.below(have, section.target_loss)
    passed = p is not None and p < section.alpha and len(have) == len(losses)
    missing = len(losses) - len(have)
    detail = (f"{missing} of {len(losses)} runs stopped before the budget" if missing else
              "fewer than 2 runs: no test" if p is None else "")
    return BudgetCheck(section.budget_tokens, losses, statistics.fmean(have) if have else None, p, passed, detail)


def _summaries(e: RaceEntry) -> None:
    own = e.own_runs
    done = [r for r in own if r.reached]
    e.time = stats.summary([r.seconds for r in done if r.seconds is not None])
    e.tokens = stats.summary([float(r.tokens) for r in done if r.tokens is not None])
    e.steps = stats.summary([float(r.steps) for r in done if r.steps is not None])
    e.tokens_per_s = _rate(own)


def _rate(runs: list[RaceRun]) -> float | None:
    """Median over runs of tokens trained over the training clock (a file from before train_tokens: the tokens of
    the last evaluation)."""
    rates = [(r.train_tokens if r.train_tokens is not None else r.curve_tokens[-1]) / r.train_seconds
             for r in runs if (r.curve_tokens or r.train_tokens) and r.train_seconds > 0]
    return statistics.median(rates) if rates else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _judge_pair(e: RaceEntry, base: RaceEntry, alpha: float, factor: float | None = None) -> None:
    ps = pairs(e, base)
    test = stats.paired([time_of(r) for r, _ in ps], [time_of(b) for _, b in ps], alpha)
    e.paired = PairedTest([r.seed for r, _ in ps], list(test.low), list(test.high), test.p_less, test.p_greater,
                          test.ratio, test.bound, test.sd, test.detectable)
    e.p_win, e.p_loss, e.detectable = test.p_less, test.p_greater, test.detectable
    reached = sum(r.reached for r, _ in ps)
    base_missed = sum(not b.reached for _, b in ps)
    v = stats.verdict_of(test, alpha)
    if capped_out(e, base, factor):
        e.verdict = stats.LOSS
        e.verdict_detail = (f"it needed more than {factor:g}x {base.name}'s time in each of its {len(ps)} seeds, and "
                            "was stopped there")
    elif len(ps) < 2:
        e.verdict = stats.NOISE if ps and reached == len(ps) else DID_NOT_REACH
        e.verdict_detail = f"{len(ps)} seed(s) paired with {base.name}: no test with fewer than 2"
    elif v == stats.LOSS:
        e.verdict = stats.LOSS
        if reached < len(ps):
            e.verdict_detail = (f"stopped before the target in {len(ps) - reached} of {len(ps)} seeds, each counted "
                                "as its clock when stopped: slower even so")
    elif v == stats.WIN:
        e.verdict = stats.WIN
        if base_missed:
            e.verdict_detail = (f"{base.name} did not reach in {base_missed} of {len(ps)} seeds, each counted as its "
                                "clock when stopped: faster even so")
    elif reached < len(ps):
        e.verdict = DID_NOT_REACH
        e.verdict_detail = (f"reached the target in {reached} of {len(ps)} seeds; a run that stopped first counts as "
                            f"at least its clock: neither faster nor slower than {base.name} at p < {alpha:g}")
    else:
        e.verdict = stats.NOISE
        if base_missed:
            e.verdict_detail = (f"{base.name} did not reach in {base_missed} of {len(ps)} seeds: no win can be "
                                "claimed past its clock when stopped")
    if test.ratio is not None:
        e.speedup_prev = 1 / test.ratio
        e.speedup_bound = {"at least": "at most", "at most": "at least"}.get(test.bound or "")
    base_runs = [b for _, b in ps]
    e.tokens_per_s_prev = _ratio(_rate([r for r, _ in ps]), _rate(base_runs))
    e.token_ratio = _ratio(_mean([float(r.tokens) for r, _ in ps if r.reached and r.tokens is not None]),
                           _mean([float(b.tokens) for b in base_runs if b.reached and b.tokens is not None]))
    if e.changes_learning:
        e.equal_tokens = equal_tokens(e, base, alpha)
        if e.equal_tokens.worse and e.verdict == stats.WIN:
            e.verdict, e.verdict_detail = NOT_A_WIN, e.equal_tokens.detail


def _chained(base: RaceEntry, e: RaceEntry) -> tuple[float | None, str | None]:
    """× cum down to the baseline, and whether it is a bound: a link that is one makes the chain one, on its side;
    links bounded on opposite sides give no figure at all."""
    if base.speedup_cum is None or e.speedup_prev is None:
        return None, None
    sides = {b for b in (base.speedup_cum_bound, e.speedup_bound) if b}
    if len(sides) > 1:
        return None, None
    return base.speedup_cum * e.speedup_prev, next(iter(sides), None)


def judge(section: RaceSection) -> None:
    """Every entry's summaries, its paired verdict against the entry it builds on, the chained ratios down to the
    baseline, modded-nanogpt's criterion, then the fastest. Never raises on a partial race (a Ctrl-C's)."""
    by_name = {e.name: e for e in section.entries}
    for e in section.entries:
        for name, default in _DEFAULTS.items():
            setattr(e, name, default)
        _summaries(e)
    for e in section.entries:
        if not e.ok or not e.own_runs:
            continue
        base = by_name.get(e.built_on or "")
        if base is None:
            e.verdict = BASELINE if e.reached_all else DID_NOT_REACH
            if not e.reached_all:
                n = sum(r.reached for r in e.own_runs)
                e.verdict_detail = f"reached the target in {n} of {len(e.own_runs)} seeds"
            e.speedup_cum = e.tokens_per_s_cum = 1.0
        else:
            _judge_pair(e, base, section.alpha, section.cap_factor)
            # Entries come after their bases: the chain of paired ratios down to the baseline.
            e.speedup_cum, e.speedup_cum_bound = _chained(base, e)
            e.tokens_per_s_cum = (base.tokens_per_s_cum * e.tokens_per_s_prev if base.tokens_per_s_cum is not None
                                  and e.tokens_per_s_prev is not None else None)
        e.budget = budget_check(e, section)
    # A chain with a bound is a bound: "at least" ranks safely (the true value is above it), "at most" does not.
    contenders = [e for e in section.entries if e.ok and e.reached_all and e.speedup_cum is not None
                  and e.speedup_cum_bound != "at most" and e.verdict in (BASELINE, stats.WIN, stats.NOISE)]
    section.fastest = max(contenders, key=lambda e: e.speedup_cum or 0.0).name if contenders else None
