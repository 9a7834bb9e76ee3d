"""`speedladder sweep`: vary one axis of the model or the workload, and find where a rung starts (or stops) paying.

"The width choice is itself a measurement": at width 256 the source's bf16 went
backwards on its GPU (matmuls too small for the tensor cores). At each point of
the axis, eager is measured and every chosen rung is measured beside it (each
on eager alone, not stacked), with the run's windows and gates; the rung's ×
over eager, the spread of its windows and its verdict (measure/judging.verdict, the
ladder's rule) are kept. A crossover is where the verdict turns from loss to
win, or back, between two points; points between them whose verdict is noise
are inconclusive and named. Each point is a ladder folder of its own under the
sweep's folder; the sweep's results.json keeps the axis, the points and the
crossovers.

No profile and no learns-check at a point: the sweep measures × against the
axis; `speedladder run` at a chosen point does the rest.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path

from speedladder.config.resolved import Resolved, resolve
from speedladder.config.run import RunConfig, pick_device
from speedladder.config.settings import SweepConfig
from speedladder.errors import UsageError
from speedladder.ladder.climb import Ladder
from speedladder.progress import Progress
from speedladder.records import Results, RungResult, storage
from speedladder.records.sweep_section import Crossover, SweepPoint, SweepRung, SweepSection, SweepSkip, SweepSummary
from speedladder.rungs import RUNGS
from speedladder.step.workload import Workload, new_results, prepare

AXES: tuple[str, ...] = ("width", "layers", "seq_len", "batch_size")


# -- one point -------------------------------------------------------------------------------


def point_config(base: Resolved, axis: str, value: int, rungs: tuple[str, ...]) -> RunConfig:
    """The RunConfig of one point: eager climbed, the other rungs beside it, the axis set to `value`."""
    m, run = base.model, base.run
    changes: dict[str, int] = dict(run.model_changes or {})
    point: dict = {}
    if axis == "batch_size":
        point["batch_size"] = value
    elif m is None:  # a Hugging Face or user model: its shape is its own
        raise UsageError(f"a {axis} sweep changes our GPT's shape; this model is not ours: sweep --batch-sizes")
    elif axis == "width":
        # Heads scaled to keep the head size; the MLP keeps its ratio to the width.
        if value % m.head_dim or value < m.head_dim:
            raise UsageError(f"width {value} is not a multiple of the preset's head size {m.head_dim}")
        changes.update(n_embd=value, n_head=value // m.head_dim, mlp_hidden=value * m.mlp_hidden // m.n_embd)
    elif axis == "layers":
        changes.update(n_layer=value)
    elif axis == "seq_len":
        changes.update(block_size=max(m.block_size, value))  # the position table grows with a longer sequence
        point["seq_len"] = value
    else:
        raise UsageError(f"unknown sweep axis {axis!r} (choose from {', '.join(AXES)})")
    beside = tuple(r for r in rungs if r != "eager")
    return dataclasses.replace(run.with_rungs(("eager",), beside), model_changes=changes or None,
                               gates=dataclasses.replace(run.gates, learns_steps=0),
                               profile=dataclasses.replace(run.profile, enabled=False), **point)


def times_over_eager(rung: RungResult, eager: RungResult) -> dict:
    """A rung's × over eager at one point: the medians' ratio, and the range its windows and eager's allow."""
    r, e = rung.tokens_per_s, eager.tokens_per_s
    assert r is not None and e is not None
    return {"x": r.median / e.median, "x_lo": r.min / e.max, "x_hi": r.max / e.min}


def point_record(value: int, path: Path, res: Results, work: Workload) -> SweepPoint:
    """What the sweep keeps of one point's ladder: per rung its × over eager, spread, verdict and gate."""
    eager = res.rung("eager")
    model = dataclasses.asdict(work.cfg.model) if work.cfg.model else {"name": work.model.name}
    point = SweepPoint(value=value, dir=path.name, status=res.status, model=model,
                       batch_size=work.cfg.batch_size, seq_len=work.cfg.seq_len)
    for r in res.rungs:
        rec = SweepRung(status=r.status, detail=r.detail, passed=r.passed, tokens_per_s=r.tokens_per_s,
                        saved_activation_bytes=r.saved_activation_bytes)
        if r.passed and r.name != "eager" and eager is not None and eager.ok and r.tokens_per_s is not None:
            x = times_over_eager(r, eager)
            rec.x, rec.x_lo, rec.x_hi, rec.verdict = x["x"], x["x_lo"], x["x_hi"], r.verdict
        elif r.ok and r.gate is not None and not r.gate.passed:
            rec.detail = f"failed a gate: {r.gate.detail}"
        point.rungs[r.name] = rec
    return point


# -- crossovers -------------------------------------------------------------------------------


CONCLUSIVE = ("win", "loss")


def crossovers(values: list[int], verdicts: list[str | None]) -> list[dict]:
    """Where the verdict turns from loss to win or from win to loss along the axis (values in order).

    Only win and loss are conclusive; a turn is placed between the last conclusive point and the next, and the
    points between them (noise, a failed gate, not measured) are listed as inconclusive.
    """
    out: list[dict] = []
    last: int | None = None
    for i, v in enumerate(verdicts):
        if v not in CONCLUSIVE:
            continue
        if last is not None and verdicts[last] != v:
            out.append({"from": verdicts[last], "to": v, "after": values[last], "before": values[i],
                        "inconclusive": values[last + 1:i]})
        last = i
    return out


def crossover_line(rung: str, axis: str, values: list[int], verdicts: list[str | None]) -> str:
    """The crossover of one rung in words, or why there is none in range."""
    found = crossovers(values, verdicts)
    if found:
        return f"{rung}: " + "; ".join(
            f"turns from {c['from']} to {c['to']} between {axis} {c['after']} and {c['before']}"
            + (f" (inconclusive at {', '.join(map(str, c['inconclusive']))})" if c["inconclusive"] else "")
            for c in found)
    seen = {v for v in verdicts if v is not None}
    if seen == {"win"} or seen == {"loss"}:
        why = f"{seen.pop()} at every point"
    elif not seen & set(CONCLUSIVE):
        why = "no conclusive point (noise, failed or not measured everywhere)"
    else:
        pairs = ", ".join(f"{x}: {v or 'n/a'}" for x, v in zip(values, verdicts))
        why = f"no turn between a loss and a win ({pairs})"
    return f"{rung}: no crossover in range of {axis} {values[0]}–{values[-1]}: {why}"


def summarize(axis: str, points: list[SweepPoint], rungs: tuple[str, ...]) -> dict[str, SweepSummary]:
    """Each rung's verdicts along the axis, its crossovers, and the line that says them."""
    values = [p.value for p in points]
    out = {}
    for name in rungs:
        if name == "eager":
            continue
        verdicts = [rec.verdict if (rec := p.rungs.get(name)) is not None else None for p in points]
        found = [Crossover(start=c["from"], to=c["to"], after=c["after"], before=c["before"],
                           inconclusive=c["inconclusive"]) for c in crossovers(values, verdicts)]
        out[name] = SweepSummary(verdicts=verdicts, crossovers=found,
                                 line=crossover_line(name, axis, values, verdicts) if values
                                 else f"{name}: no point measured")
    return out


# -- the sweep -------------------------------------------------------------------------------


@dataclass
class Budget:
    """The sweep's deadline: a point is started only if its estimate fits in what is left."""

    seconds: float
    start: float = dataclasses.field(default_factory=time.perf_counter)

    def left(self) -> float:
        return self.seconds - (time.perf_counter() - self.start)

    def rung_reason(self) -> str | None:
        return None if self.left() > 0 else "not started: the sweep's time budget is spent"


def estimate(prev: Results, prev_work: Workload, work: Workload) -> float:
    """The next point's seconds from the last one: compilation as it was, everything else scaled by the work.

    Compile time does not grow with the step's FLOPs; the build, windows, gates and memory meters roughly do.
    """
    spec, prev_spec = work.base_spec, prev_work.base_spec
    ratio = (work.flops_per_token(spec) * spec.tokens_per_step) / (
        prev_work.flops_per_token(prev_spec) * prev_spec.tokens_per_step)
    wall = sum(r.wall_s or 0.0 for r in prev.rungs)
    compiling = sum(r.compile_s or 0.0 for r in prev.rungs)
    return compiling + (wall - compiling) * ratio


def run_sweep(run: RunConfig, axis: str, values: list[int], cfg: SweepConfig, run_dir: Path,
              progress: Progress) -> Results:
    """Measure every point that fits the budget; the sweep's results.json is rewritten after each point."""
    device = pick_device(run.device)
    base = resolve(run.with_rungs(("eager",)), device, known_rungs=tuple(RUNGS))
    unknown = [r for r in cfg.rungs if r not in RUNGS]
    if unknown:
        raise UsageError(f"unknown rung {unknown[0]!r} (choose from {', '.join(RUNGS)})")
    rungs = ("eager", *(r for r in cfg.rungs if r != "eager"))
    configs = [point_config(base, axis, v, rungs) for v in values]
    for c in configs:  # every point's shape checked before any is measured
        resolve(c, device, known_rungs=tuple(RUNGS))
    saved = new_results(prepare(base.run.with_rungs(("eager",))), kind="sweep")
    sweep = saved.sweep = SweepSection(axis=axis, values=values, rungs=list(rungs),
                                       budget_minutes=cfg.budget_minutes)
    budget = Budget(cfg.budget_minutes * 60)
    prev: tuple[Results, Workload] | None = None
    say = progress.scoped("sweep")
    try:
        for value, point_run in zip(values, configs):
            work = prepare(point_run)
            need = estimate(*prev, work) if prev else 0.0
            if need > budget.left():
                why = f"not started: about {need:.0f} s needed, {max(budget.left(), 0):.0f} s left of the budget"
                sweep.skipped.append(SweepSkip(value=value, detail=why))
                say(f"{axis} {value}: {why}")
                continue
            say(f"{axis} {value}: {work.params:,} parameters, B={work.cfg.batch_size} T={work.cfg.seq_len}")
            path = run_dir / f"{axis}-{value}"
            path.mkdir()
            ladder = Ladder(work, path, progress, budget=budget.rung_reason)
            res = ladder.run()
            sweep.points.append(point_record(value, path, res, work))
            sweep.summary = summarize(axis, sweep.points, rungs)
            sweep.seconds = cfg.budget_minutes * 60 - budget.left()
            storage.save(saved, run_dir)
            prev = (res, work)
        saved.status = "complete"
    except KeyboardInterrupt:
        saved.status = "interrupted"
        raise
    finally:
        sweep.seconds = cfg.budget_minutes * 60 - budget.left()
        storage.save(saved, run_dir)
    return saved
