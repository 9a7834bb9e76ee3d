"""Every prediction miss explained by measurement: the rung's step and its base's, profiled side by side.

When a rung's measured × misses its prediction by more than
ProfileConfig.explain_miss (±25% by default), its own step and the step it
built on are profiled in a child process, as the baseline is
(docs/measurement.md, rule 5; a profile already taken is reused). The two
breakdowns are set side by side, category by category, and in the prediction
model's parts (profile/predict.py) beside the change the model expected in
each. The note names the part that moved against the prediction most, in the
direction of the miss: "elementwise, norm and softmax tail: +3.3 ms a step
where the model expected -2.0 ms".

`compare` is a pure function of two saved profiles and the predicted parts;
`explain_misses` runs the profiles.
"""

from __future__ import annotations

from collections.abc import Callable

from speedladder.errors import one_line
from speedladder.profile import child
from speedladder.profile.predict import baseline_parts, chain
from speedladder.progress import task_of
from speedladder.records import ProfileSummary, Results, Role, RungResult, from_dict, to_dict
from speedladder.workload import Workload

# The model's parts, merged where two profiles cannot tell them apart (the attention's matmuls are matmuls to the
# profiler; its mask and softmax are tail), each with the words a note uses.
GROUPS: dict[str, tuple[tuple[str, ...], str]] = {
    "matmul": (("matmul", "attn_matmul"), "matmuls"),
    "attention": (("attention",), "fused attention"),
    "tail": (("attn_tail", "tail"), "elementwise, norm and softmax tail"),
    "copies": (("copies",), "copies & H2D"),
    "optimizer": (("optimizer",), "optimizer"),
    "overhead": (("overhead",), "host overhead (between operators, plus each operator's fixed cost)"),
    "other": (("other",), "other operators"),
}


def grouped(parts: dict[str, float]) -> dict[str, float]:
    return {g: sum(parts.get(p, 0.0) for p in names) for g, (names, _) in GROUPS.items()}


def label(group: str, compiled: bool, device_type: str | None) -> str:
    """A group's words; inductor's fused kernels are the tail of a compiled step (C++ loops on a CPU)."""
    words = GROUPS[group][1]
    if group == "tail" and compiled:
        return f"{words} (inductor's fused {'C++ loops' if device_type == 'cpu' else 'kernels'})"
    return words


def compare(base: dict, rung: dict, before: dict[str, float], after: dict[str, float], error: float) -> dict:
    """Two profiles side by side, and the part that moved against the prediction most.

    base, rung: saved profiles (ProfileSummary dicts) of the base's step and the rung's. before, after: the
    model's predicted parts (ms) of the base and the rung, in the baseline profile's ms; they are rescaled to
    the base profile's ms so that predicted and measured changes compare. error: measured x over predicted,
    less 1 (> 0: the rung was faster than predicted).
    """
    b_sum, r_sum = from_dict(ProfileSummary, base), from_dict(ProfileSummary, rung)
    cats = {c: {"base_ms": base["categories"][c]["ms"], "rung_ms": rung["categories"].get(c, {}).get("ms", 0.0)}
            for c in base["categories"]}
    measured_b, measured_r = grouped(baseline_parts(b_sum)), grouped(baseline_parts(r_sum))
    pred_b, pred_a = grouped(before), grouped(after)
    scale = sum(measured_b.values()) / (sum(pred_b.values()) or 1.0)
    parts = {g: {"base_ms": measured_b[g], "rung_ms": measured_r[g], "expected_ms": measured_b[g]
                 + scale * (pred_a[g] - pred_b[g])} for g in GROUPS}
    # Against the prediction: the part that cost most beyond what the model expected when the rung was slower
    # than predicted, the part that saved most beyond it when the rung was faster.
    sign = 1.0 if error < 0 else -1.0
    culprit = max(parts, key=lambda g: sign * (parts[g]["rung_ms"] - parts[g]["expected_ms"]))
    p = parts[culprit]
    compiled = bool(rung.get("spec", {}).get("compile")) and not base.get("spec", {}).get("compile")
    note = (f"{label(culprit, compiled, rung.get('device_type'))}: {p['rung_ms'] - p['base_ms']:+.2f} ms a step "
            f"where the model expected {p['expected_ms'] - p['base_ms']:+.2f} ms")
    return {"categories": cats, "parts": parts, "culprit": culprit, "note": note,
            "base_step_ms": sum(v["ms"] for v in base["categories"].values()),
            "rung_step_ms": sum(v["ms"] for v in rung["categories"].values()),
            "base_tokens_per_step": base.get("tokens_per_step"), "rung_tokens_per_step": rung.get("tokens_per_step")}


def misses(results: Results, limit: float) -> list[RungResult]:
    """The measured rungs whose × missed the prediction by more than `limit`, in ladder order."""
    return [r for r in results.rungs if r.ok and r.prediction_error is not None and abs(r.prediction_error) > limit
            and r.role != Role.CONTROL]


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
                   budget: Callable[[], str | None] | None = None, profile_s: float | None = None) -> None:
    """Profile each missed rung and its base (each spec once, the baseline's profile reused, all of them in one
    child process), and compare. profile_s: what the baseline's profile took in its child, to estimate the rest."""
    limit = work.cfg.run.profile.explain_miss
    b = results.profile
    if not limit or b is None or b.error:
        return
    missed = misses(results, limit)
    why = budget() if budget and missed else None
    if why:
        for r in missed:
            r.explanation = {"error": why}
        return
    pairs = [(r, names_of(results, r), _base_names(results, r)) for r in missed]
    # Each profile takes about what the baseline's did, and a compiled one compiles cold again in the child.
    compile_s = {_key(names): rec.compile_s or 0.0 for rec in results.rungs if rec.ok
                 for names in [names_of(results, rec)]}
    profiles = _profiles(pairs, b, work, say, lambda key: profile_s + compile_s.get(key, 0.0) if profile_s else None)
    for r, names, base_names in pairs:
        base, mine = profiles[_key(base_names)], profiles[_key(names)]
        failed = base.get("error") or mine.get("error")
        if failed:
            r.explanation = {"error": f"profiling failed: {failed}"}
            say(r.explanation["error"])
            continue
        preds = chain(b, names, work.base_spec, work.env)
        before = preds[-2].parts_ms if len(preds) > 1 else baseline_parts(b)
        r.explanation = {"rungs": names, "base_rungs": base_names,
                         **compare(base, mine, before, preds[-1].parts_ms, r.prediction_error or 0.0)}
        say(f"{r.name} missed its prediction by {100 * (r.prediction_error or 0.0):+.0f}%: "
            + r.explanation["note"])
    save()


def _base_names(results: Results, r: RungResult) -> list[str]:
    base = results.rung(r.built_on) if r.built_on else None
    return names_of(results, base) if base else []


def _key(names: list[str]) -> tuple[str, ...]:
    return tuple(n for n in names if n != "eager")


def _profiles(pairs: list, b: ProfileSummary, work: Workload, say: Callable[[str], None],
              estimate: Callable[[tuple[str, ...]], float | None]) -> dict[tuple, dict]:
    """The profile of every key the misses need: the baseline's as saved, the others taken in one child, shown as a
    task while it runs (each key's `estimate` summed)."""
    profiles: dict[tuple[str, ...], dict] = {(): to_dict(b)}
    keys = list(dict.fromkeys(_key(n) for _, names, base in pairs for n in (base, names)))
    todo = [k for k in keys if k not in profiles]
    if not todo:
        return profiles
    run = work.cfg.run.with_rungs(("eager",))
    each = [estimate(k) for k in todo]
    try:
        with task_of(say, f"profiling {', '.join('+'.join(k) for k in todo)} in a child process, one after the other",
                     estimate_s=sum(e for e in each if e is not None) if None not in each else None):
            taken = child.profiles_in_child(run, todo, work.cfg.run.profile.timeout_s, facts=False)
    except Exception as e:  # noqa: BLE001 -- the misses stay unexplained, and say why
        taken = [{"error": one_line(e)}] * len(todo)
    profiles.update(zip(todo, taken, strict=True))
    return profiles
