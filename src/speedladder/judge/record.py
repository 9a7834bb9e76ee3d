"""A judgement as typed records: what was judged, the decision and why, the effect, the criterion, the cost.

`Judgement` is what `speedladder judge` prints as one JSON object (report.py) and saves as judge.json beside the
race's results.json; its JSON Schema ships as judge/schema.json (docs/judge.md says every field).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from speedladder.records import BudgetCheck, Gate
from speedladder.spec import StepSpec

SCHEMA = 1  # the output's version: a field removed or changed in meaning bumps it; a field added does not


@dataclass
class SideRecord:
    """One side: its name, what was given, and the configuration its worker built."""

    name: str
    source: str  # the path given, or "eager fp32"
    kind: str  # "eager", "rung-file", "config" or "run"
    rungs: list[str] = field(default_factory=list)  # composed on eager fp32, in order
    kinds: dict[str, str] = field(default_factory=dict)  # each rung's kind (speed, memory, optimizer)
    spec: StepSpec | None = None  # None: its worker built nothing
    precision: str | None = None
    compile_s: float | None = None  # its compile, off the clock


@dataclass
class Effect:
    """The candidate's time to the target against the base's, paired by seed, as the rule read it last."""

    speedup: float | None  # the base's time over the candidate's: the geometric mean of the per-seed ratios
    bound: str | None  # None: exact; "at least" or "at most" where a run that stopped bounds it
    interval: list[float | None]  # the speedup's, at `confidence`: a keep when its low end is above 1
    confidence: float
    p_win: float | None  # one-sided: faster
    p_loss: float | None  # one-sided: slower
    p_short: float | None  # one-sided: the gain falls short of min_gain
    per_seed: list[float | None] = field(default_factory=list)  # the base's time over the candidate's, each seed


@dataclass
class Criterion:
    """modded-nanogpt's criterion beside the time test: each side's val loss at a fixed token budget, its mean
    below the target at p < false_keep (a one-sample t-test over seeds)."""

    target: float | None
    budget_tokens: int | None
    candidate: BudgetCheck | None
    base: BudgetCheck | None


@dataclass
class Speed:
    """Tokens/s beside the time to the target, each side's, from the same race."""

    candidate_tokens_per_s: float | None
    base_tokens_per_s: float | None
    tokens_per_s_ratio: float | None  # the candidate's over the base's, from the same seeds
    candidate_time_s: float | None  # mean seconds to the target over its seeds that reached it
    base_time_s: float | None
    token_ratio: float | None  # tokens to the target, the candidate's over the base's


@dataclass
class Rule:
    """The sequential rule that decided, with the error rates it holds (docs/judge.md#the-rule)."""

    false_keep: float
    false_revert: float
    min_gain: float
    keep_floor: float  # the gain a keep must be shown to exceed
    first_look: int
    max_seeds: int
    looks: int
    level_keep: float  # false_keep / looks: each look's test
    level_revert: float
    budget_s: float


@dataclass
class Seeds:
    used: int  # seeds both sides raced
    max: int
    seeds: list[int] = field(default_factory=list)
    looks: list[dict[str, Any]] = field(default_factory=list)  # per look: seeds, p_win, p_loss, p_short, decision


@dataclass
class Cost:
    """Where the decision's wall seconds went."""

    seconds: float  # the whole decision, from the command's start to the printed object
    workers_s: float | None = None  # starting both workers and building each side's step
    warmup_s: float | None = None  # warm-up and compile, off the clock
    gates_s: float | None = None  # the gaming probes and the gates, in the candidate's worker
    calibration_s: float | None = None  # the base's calibration run that set the target
    race_s: float | None = None  # the seeds raced, evaluations included


@dataclass
class Judgement:
    """keep, revert or undecided for one candidate against its base, why, how sure and at what cost."""

    decision: str  # "keep", "revert" or "undecided"
    why: str  # win, loss, noise, not-a-win, diverged, broke-causality, failed-gate: ..., gamed: ..., budget, error: ...
    detail: str  # one line in words
    candidate: SideRecord
    base: SideRecord
    schema: int = SCHEMA
    effect: Effect | None = None
    criterion: Criterion | None = None
    speed: Speed | None = None
    target: float | None = None
    target_from: str = ""
    seeds: Seeds | None = None
    rule: Rule | None = None
    gate: Gate | None = None  # the candidate's gate record (None: not gated)
    gamed: list[str] = field(default_factory=list)  # what the guard and the gaming probes found, one line each
    cost: Cost | None = None
    run_dir: str | None = None  # the race's folder: results.json (speedladder report reads it), judge.json
    speedladder: str = ""
    torch: str = ""
    loadavg: float | None = None  # /proc/loadavg's 1-minute figure when the decision began
