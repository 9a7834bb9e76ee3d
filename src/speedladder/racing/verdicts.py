"""A race's verdicts: pure functions of its saved section (records.RaceSection), so a saved race can be judged
again and the rule tested on synthetic times (docs/race.md)."""

from __future__ import annotations

import math
import statistics

import numpy as np

from speedladder import stats
from speedladder.records import EqualTokens, RaceEntry, RaceRun, RaceSection

DID_NOT_REACH, NOT_A_WIN, BASELINE = "did not reach", "not a win", "baseline"


def _at_tokens(run: RaceRun, tokens: float) -> float:
    """A run's val loss at a token count, linear between its evaluations (inf once it diverged)."""
    vals = [math.inf if v is None else v for v in run.curve_val]
    if any(math.isinf(v) for v, t in zip(vals, run.curve_tokens) if t <= tokens):
        return math.inf
    return float(np.interp(tokens, run.curve_tokens, vals))


def equal_tokens(entry: RaceEntry, base: RaceEntry, alpha: float) -> EqualTokens:
    """Per seed, both val losses at the tokens where the shorter of the two runs stopped; one-sided Welch test
    that the entry is worse there."""
    pairs = [(r, b) for r in entry.runs for b in base.runs if r.seed == b.seed and r.curve_tokens and b.curve_tokens]
    at = [min(r.curve_tokens[-1], b.curve_tokens[-1]) for r, b in pairs]
    loss = [_at_tokens(r, t) for (r, _), t in zip(pairs, at)]
    base_loss = [_at_tokens(b, t) for (_, b), t in zip(pairs, at)]
    if any(math.isinf(v) for v in loss):
        return EqualTokens(at, loss, base_loss, None, True, "its loss diverged")
    if len(pairs) < 2 or any(math.isinf(v) for v in base_loss):
        return EqualTokens(at, loss, base_loss, None, False, "not comparable: too few runs, or the base diverged")
    w = stats.welch(loss, base_loss, alpha)
    worse = w.p_greater < alpha
    return EqualTokens(at, loss, base_loss, w.p_greater, worse,
                       (f"worse at equal tokens: val {statistics.fmean(loss):.4f} vs {statistics.fmean(base_loss):.4f}"
                        f" (p={w.p_greater:.3g})") if worse else "")


def _summaries(e: RaceEntry) -> None:
    done = [r for r in e.runs if r.reached]
    e.time = stats.summary([r.seconds for r in done])  # type: ignore[misc]
    e.tokens = stats.summary([float(r.tokens) for r in done])  # type: ignore[arg-type]
    e.steps = stats.summary([float(r.steps) for r in done])  # type: ignore[arg-type]
    rates = [r.curve_tokens[-1] / r.train_seconds for r in e.runs if r.curve_tokens and r.train_seconds > 0]
    e.tokens_per_s = statistics.median(rates) if rates else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def judge(section: RaceSection) -> None:
    """Every entry's summaries, ratios and verdict against the entry it builds on; then the fastest."""
    by_name = {e.name: e for e in section.entries}
    for e in section.entries:
        _summaries(e)
    first = next((e for e in section.entries if e.ok and e.built_on is None), None)
    for e in section.entries:
        if not e.ok or not e.runs:
            e.verdict = None
            continue
        base = by_name.get(e.built_on or "")
        e.verdict_detail = ""
        if not e.reached_all:
            n = sum(r.reached for r in e.runs)
            e.verdict = DID_NOT_REACH
            e.verdict_detail = f"reached the target in {n} of {len(e.runs)} seeds"
        elif base is None:
            e.verdict = BASELINE
        elif not base.reached_all:
            e.verdict = stats.WIN
            e.verdict_detail = f"{base.name} did not reach the target in every seed; this did"
        else:
            e.verdict, w = stats.verdict([r.seconds for r in e.runs], [r.seconds for r in base.runs],  # type: ignore[misc]
                                         section.alpha)
            e.p_win, e.p_loss, e.detectable = w.p_less, w.p_greater, w.detectable
        if base is not None and base.runs:
            e.speedup_prev = _ratio(base.time.mean if base.time else None, e.time.mean if e.time else None)
            e.tokens_per_s_prev = _ratio(e.tokens_per_s, base.tokens_per_s)
            e.token_ratio = _ratio(e.tokens.mean if e.tokens else None, base.tokens.mean if base.tokens else None)
            if e.changes_learning:
                e.equal_tokens = equal_tokens(e, base, section.alpha)
                if e.equal_tokens.worse and e.verdict == stats.WIN:
                    e.verdict, e.verdict_detail = NOT_A_WIN, e.equal_tokens.detail
        if first is not None:
            e.speedup_cum = _ratio(first.time.mean if first.time else None, e.time.mean if e.time else None)
            e.tokens_per_s_cum = _ratio(e.tokens_per_s, first.tokens_per_s)
    contenders = [e for e in section.entries if e.ok and e.reached_all and e.time is not None
                  and e.verdict not in (NOT_A_WIN, DID_NOT_REACH)]
    section.fastest = min(contenders, key=lambda e: e.time.mean).name if contenders else None  # type: ignore[union-attr]
