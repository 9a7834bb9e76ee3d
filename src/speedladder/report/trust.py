"""The trust line: whether a run's figures can be trusted, in one line at the top of the table and of report.html.

Five items, each read from the saved file and held to a threshold, so that what is within it is said in a word and
only what is beyond it is a warning: the noise of the timed windows, the worst drift of a base re-timed beside a
rung, the gates passed and failed, the learns-check's state, and other processes' load on the machine.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from speedladder.config.settings import DRIFT_LIMIT
from speedladder.measure.judging import SHORT
from speedladder.records import Results, Role
from speedladder.report import machine_notes

# A rung whose windows spread (max - min over the median) more than this: its verdict can hardly be a win or a loss.
NOISY = 0.10
# A base re-timed beside a rung that ran this much away from its own measurement: tokens/s across rows stop being
# comparable (× prev still holds). `check` and `compare` warn at the same limit (--drift-limit).
DRIFT = DRIFT_LIMIT

OK, NOTE, WARN = "ok", "note", "warn"  # within its threshold; a state worth knowing; beyond its threshold


@dataclass(frozen=True)
class Item:
    """One item of the trust line."""

    name: str  # windows, drift, gates, learns-check, machine
    text: str
    level: str  # OK, NOTE or WARN

    def __str__(self) -> str:
        return f"{self.name}: {self.text}"


def _windows(results: Results) -> Item | None:
    spreads = [(r.name, r.tokens_per_s.rel_spread) for r in results.rungs  # the rungs' own (a control is none)
               if r.ok and r.tokens_per_s is not None and r.verdict != SHORT and r.role != Role.CONTROL]
    if not spreads:
        return None
    name, worst = max(spreads, key=lambda s: s[1])
    typical = statistics.median(s for _, s in spreads)
    if worst > NOISY:
        return Item("windows", f"{name}'s spread {worst:.0%} (beyond {NOISY:.0%}; median {typical:.1%})", WARN)
    return Item("windows", f"spread {typical:.1%} median, {worst:.1%} at most ({name})", OK)


def _drift(results: Results) -> Item | None:
    drifted = [(r, r.base_drift) for r in results.rungs if r.base_drift is not None]
    if not any(r.ok for r in results.rungs if r.built_on):
        return None
    beyond = [(r, d) for r, d in drifted if abs(d) >= DRIFT]
    if not beyond:
        return Item("drift", f"none beyond {DRIFT:.0%}", OK)
    r, d = max(beyond, key=lambda x: abs(x[1]))
    return Item("drift", f"{r.built_on}, re-timed beside {r.name}, ran {abs(d):.0%} {'below' if d < 0 else 'above'} "
                         f"its own speed (beyond {DRIFT:.0%}): × prev holds, tokens/s across rows do not", WARN)


def _gates(results: Results) -> Item | None:
    gated = [r for r in results.rungs if r.ok and r.gate is not None]
    if not gated:
        return None
    failed = [r.name for r in gated if not r.gate or not r.gate.passed]
    short = [r.name for r in results.rungs if r.ok and r.gate is None and r.verdict == SHORT]
    text = f"{len(gated) - len(failed)} passed, {len(failed)} failed" + (f" ({', '.join(failed)})" if failed else "")
    text += f"; not gated: {', '.join(short)} (one short window)" if short else ""
    return Item("gates", text, WARN if failed else OK)


def _learns(results: Results) -> Item | None:
    if not any(r.role == Role.RUNG and r.ok for r in results.rungs):
        return None
    lc = results.learns_check
    if lc is None:
        why = ("the run stopped before it" if results.status == "interrupted" else
               "no configuration passed every gate" if results.status == "complete" else results.status)
        return Item("learns-check", f"not checked ({why})", NOTE)
    if lc.skipped:
        return Item("learns-check", f"not checked ({lc.detail})" if lc.detail else "not checked", NOTE)
    if lc.passed:
        return Item("learns-check", f"passed ({lc.rung})", OK)
    return Item("learns-check", f"FAILED ({lc.rung})", WARN)


def _machine(results: Results) -> Item | None:
    m = results.machine
    if m is None:
        return None
    most = max(m.most, m.before or 0.0)
    # The hypervisor's steal slows every core of ours alike and is no process here: said apart, at the same threshold.
    steal = max(m.steal_most or 0.0, m.steal_before or 0.0)
    stolen = f"; the hypervisor stole up to {steal:.2f} cores" if steal >= machine_notes.threshold(m) else ""
    if machine_notes.worth_saying(m):
        during = f" in {m.shared_windows} of {m.windows} windows" if m.shared_windows else ""
        during += f" in {m.shared_runs} of {m.runs} race runs" if m.shared_runs else ""
        return Item("machine", f"others used up to {most:.2f} of {m.cores} cores{during or ' before the first window'}"
                    + stolen, WARN)
    text = "alone" if m.alone else f"others at most {most:.2f} of {m.cores} cores (under {machine_notes.threshold(m):.2f})"
    return Item("machine", text + stolen, WARN if stolen else OK)


def items(results: Results) -> list[Item]:
    """The trust line's items that the file holds, in their order."""
    return [i for f in (_windows, _drift, _gates, _learns, _machine) if (i := f(results)) is not None]


def line(results: Results) -> str:
    """The trust line as one line of text; "" for a file with nothing to judge (no rung measured)."""
    found = items(results)
    if not found:
        return ""
    return "trust: " + " · ".join(("⚠ " if i.level == WARN else "") + str(i) for i in found)
