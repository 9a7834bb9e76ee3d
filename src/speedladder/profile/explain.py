"""Every loss and every prediction miss explained by measurement: the rung's step and its base's, profiled side by
side.

A rung is explained when it lost (a speed rung whose × prev is below 1.0), or when its measured × misses its
prediction by more than ProfileConfig.explain_miss (±25% by default); a rung stopped short (one window, as
predicted far below its base) is explained by its prediction. Its own step and the step it built on are profiled
in a child process, as the baseline is (docs/measurement.md, rule 5), one after the other, each with a
Perfetto-readable trace beside results.json. The two breakdowns are set side by side against the timed
figures (profile/side_by_side.py): category by category, and in the prediction model's parts beside the change the model
expected in each; the note names the part that moved against the prediction most, in the direction of the miss,
and for a compiled rung what the compiler did.

`to_explain` and `timed` are pure functions of the saved results; `explain_misses` runs the profiles.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable
from pathlib import Path

from speedladder.errors import one_line
from speedladder.measure.judging import SHORT
from speedladder.profile import side_by_side, step_profile
from speedladder.profile.predict import baseline_parts, chain
from speedladder.progress import task_of
from speedladder.records import ProfiledExplanation, Results, Role, RungResult, TimedSteps
from speedladder.step.workload import Workload


def lost(r: RungResult) -> bool:
    """A speed rung measured slower than its base (its best estimate, × prev, below 1.0)."""
    return r.kind == "speed" and r.speedup_prev is not None and r.speedup_prev < 1.0


def to_explain(results: Results, limit: float) -> list[RungResult]:
    """The measured rungs that lost, or whose × missed the prediction by more than `limit`, in ladder order; not a
    control, nor a rung stopped short (its prediction already said it would lose, and it did)."""
    return [r for r in results.rungs if r.ok and r.role != Role.CONTROL and r.verdict != SHORT and r.built_on
            and (lost(r) or (r.prediction_error is not None and abs(r.prediction_error) > limit))]


def timed(r: RungResult) -> TimedSteps | None:
    """A rung's step and its base's as the windows timed them beside each other (ms), with its measured x prev."""
    if r.base_timing is None or r.step_ms is None or r.speedup_prev is None:
        return None
    steps = [w.seconds / w.steps for w in r.base_timing.windows if not w.recompiles]
    if not steps:
        return None
    return TimedSteps(base_ms=1e3 * statistics.median(steps), rung_ms=r.step_ms, x=r.speedup_prev)


def trace_name(key: tuple[str, ...]) -> str:
    """The trace file of a spec profiled to explain a rung (the baseline's own profile's is child.TRACE)."""
    return f"trace-{'+'.join(key) or 'eager'}.json"


def names_of(results: Results, r: RungResult) -> list[str]:
    """The rungs that compose a record's spec from eager (eager first), as the ladder chained them."""
    if r.rungs_combined is not None:
        return ["eager", *r.rungs_combined]
    out: list[str] = []
    rec: RungResult | None = r
    while rec is not None:
        out.append(rec.rung)
        rec = results.rung(rec.built_on) if rec.built_on else None
    return list(reversed(out))


def explain_misses(results: Results, work: Workload, save: Callable[[], None], say: Callable[[str], None],
                   budget: Callable[[], str | None] | None = None, profile_s: float | None = None,
                   run_dir: Path | None = None) -> None:
    """Profile each rung that lost or missed and its base (each spec once, all of them in one child process, one
    after the other, each spec's trace into run_dir), and compare. The baseline is profiled again beside the others
    rather than its profile reused: taken minutes earlier, on a machine whose load has moved since, it would not be
    like with like. profile_s: what the baseline's profile took in its child, to estimate each."""
    limit = work.cfg.run.profile.explain_miss
    b = results.profile
    if not limit or b is None or b.error:
        return
    missed = to_explain(results, limit)
    why = budget() if budget and missed else None
    if why:
        for r in missed:
            r.explanation = ProfiledExplanation(error=why)
        return
    pairs = [(r, names_of(results, r), _base_names(results, r)) for r in missed]
    # Each profile takes about what the baseline's did, and a compiled one compiles cold again in the child.
    compile_s = {_key(names): rec.compile_s or 0.0 for rec in results.rungs if rec.ok
                 for names in [names_of(results, rec)]}
    profiles = _profiles(pairs, work, say, lambda key: profile_s + compile_s.get(key, 0.0) if profile_s else None,
                         run_dir)
    for r, names, base_names in pairs:
        base, mine = profiles[_key(base_names)], profiles[_key(names)]
        failed = base.get("error") or mine.get("error")
        if failed:
            why = f"profiling failed: {failed}"
            r.explanation = ProfiledExplanation(error=why)
            say(why)
            continue
        preds = chain(b, names, work.base_spec, work.env)
        before = preds[-2].parts_ms if len(preds) > 1 else baseline_parts(b)
        e = side_by_side.compare(base, mine, before, preds[-1].parts_ms, r.prediction_error or 0.0, timed(r))
        r.explanation = dataclasses.replace(e, rungs=names, base_rungs=base_names, trace=mine.get("trace"),
                                            base_trace=base.get("trace"))
        say(f"{r.name}: {side_by_side.sums(r.explanation)}; {r.explanation.note}")
    save()


def _base_names(results: Results, r: RungResult) -> list[str]:
    base = results.rung(r.built_on) if r.built_on else None
    return names_of(results, base) if base else []


def _key(names: list[str]) -> tuple[str, ...]:
    return tuple(n for n in names if n != "eager")


def _profiles(pairs: list, work: Workload, say: Callable[[str], None],
              estimate: Callable[[tuple[str, ...]], float | None], run_dir: Path | None) -> dict[tuple, dict]:
    """The profile of every key the explanations need, each base before its rungs, all taken in one child (each with
    its trace in run_dir), shown as a task while it runs (each key's `estimate` summed)."""
    todo = list(dict.fromkeys(_key(n) for _, names, base in pairs for n in (base, names)))
    if not todo:
        return {}
    run = work.cfg.run.with_rungs(("eager",))
    each = [estimate(k) for k in todo]
    try:
        names = ", ".join("+".join(k) or "eager" for k in todo)
        with task_of(say, f"profiling {names} in a child process, one after the other",
                     estimate_s=sum(e for e in each if e is not None) if None not in each else None):
            taken = step_profile.profiles_in_child(run, todo, work.cfg.run.profile.timeout_s, facts=False,
                                            traces=[run_dir / trace_name(k) if run_dir else None for k in todo])
    except Exception as e:  # noqa: BLE001 -- the misses stay unexplained, and say why
        taken = [{"error": one_line(e)}] * len(todo)
    return dict(zip(todo, taken, strict=True))
