"""One rung's gates again, alone, on a saved run: `speedladder gates RUN_DIR RUNG`.

The saved run's configuration rebuilds the workload (its model, corpus, seed and rung files, checked against their
recorded hashes); the rungs below the named one are gated again in order, as the ladder gated them, so that it is
judged against the same base; then the named rung's gates run, with the explanation of a failure
(verify/bisection.py). Nothing is timed and nothing in the run folder is changed.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from speedladder.config.settings import run_from_results
from speedladder.errors import UsageError
from speedladder.progress import Progress
from speedladder.records import Gate, Results, storage, to_dict
from speedladder.spec import StepSpec
from speedladder.step.train_step import matmul_precision
from speedladder.step.workload import prepare
from speedladder.verify.gates import Gates


def command(run_dir: str | Path, rung: str) -> str:
    """The one line that re-runs a rung's gates on a saved run."""
    return f"speedladder gates {run_dir} {rung}"


def _chain(saved: Results, name: str) -> list[tuple[str, StepSpec]]:
    """The named rung and the rungs it built on, bottom first: each one's name and spec."""
    by_name = {r.name: r for r in saved.rungs}
    if name not in by_name:
        known = ", ".join(r.name for r in saved.rungs if r.spec is not None) or "none"
        raise UsageError(f"no rung {name!r} in this run (its rungs: {known})")
    chain: list[tuple[str, StepSpec]] = []
    r = by_name.get(name)
    while r is not None:
        if r.spec is None:
            raise UsageError(f"rung {r.name} was not measured in this run ({r.status}): it has no gates to run")
        chain.append((r.name, r.spec))
        r = by_name.get(r.built_on) if r.built_on else None
    return chain[::-1]


def regate(run_dir: str | Path, name: str, device: str | None = None, progress: Progress | None = None) -> Gate:
    """The named rung's gate, run again on the saved run's workload (the module's docstring)."""
    saved = storage.load(run_dir)
    if saved.config is None or not saved.rungs:
        raise UsageError(f"{run_dir} holds no ladder whose gates can run again")
    chain = _chain(saved, name)
    work = prepare(run_from_results(to_dict(saved.config), device))
    gates = Gates(work, progress or Progress())
    probe, base_name = None, None
    gate = Gate(passed=False, detail="not run")
    for rung, spec in chain:
        say = (progress or Progress()).scoped(rung)
        with matmul_precision(spec):
            step = work.step(spec)
            gate, mine = gates.check(step, None, probe, base_name, say)
        del step
        gates.release()
        if rung != name and not gate.passed:
            say(f"the rung below, {rung}, fails its gate here: {gate.detail}")
        probe, base_name = mine, rung
    if gate.explanation is not None:
        gate.explanation = dataclasses.replace(gate.explanation, command=command(run_dir, name))
    return gate
