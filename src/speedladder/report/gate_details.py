"""The gates in detail, for report.html: every check of every rung, the rule's three distances (eager's at the rung's
precision, the base's, the rung's) from the truth beside what was allowed, what each reference and each gate cost.
Read from saved results."""

from __future__ import annotations

from speedladder.records import Fp64, Gate, Kinks, ReferenceCost, Results, RungResult
from speedladder.report.common import scale_label
from speedladder.report.htmlkit import esc, missing, notes, table


def _num(v: float | None) -> str:
    return "—" if v is None else f"{v:.2e}"


def _rows(r: RungResult, check: str, f: Fp64, device: str | None = None) -> list[list[str]]:
    out = []
    for d in (f.logits, f.loss, f.grad, f.curve):
        if d is None:
            continue
        what = f"gradient of {d.name} (worst of {f.tensors})" if d is f.grad else d.name
        ok = d.rung is not None and d.allowed is not None and d.rung <= d.allowed
        out.append([r.name, check, what, "yes" if ok else "NO", _num(d.rung), _num(d.allowed), _num(d.eager),
                    _num(d.base), scale_label(f.scale, device), f.truth])
    return out


def fp64_rows(results: Results) -> list[list[str]]:
    """One row per judged quantity of every rung's equivalence (trained weights) and differential (probe
    weights) that went by the fp64 rule."""
    rows: list[list[str]] = []
    for r in results.rungs:
        g = r.gate
        if g is None:
            continue
        if g.equivalence is not None and g.equivalence.fp64 is not None:
            rows += _rows(r, "equivalence (trained weights)", g.equivalence.fp64, results.environment.device_type)
        if g.differential is not None and g.differential.fp64 is not None:
            rows += _rows(r, "differential (probe weights)", g.differential.fp64, results.environment.device_type)
    return rows


def _other(r: RungResult) -> list[str]:
    """A rung's checks in one line each, for those judged another way (or not at all)."""
    g = r.gate
    if g is None:
        return []
    out = []
    if g.cut:
        return [f"{r.name}: {g.detail}"]
    if g.reference:
        out.append(f"{r.name}: the reference; causality " + ("passed" if g.passed else f"FAILED: {g.detail}"))
    for name in ("equivalence", "loss_band", "causality", "differential", "tokens_to_target"):
        c = getattr(g, name)
        if c is None or g.reference:
            continue
        rule = getattr(c, "rule", "")
        if getattr(c, "fp64", None) is not None:  # in the table above
            continue
        state = "not applicable" if not c.applies else "passed" if c.passed else "FAILED"
        why = c.detail or (getattr(c, "fp64_why", "") if rule == "table" else "")
        out.append(f"{r.name}: {name.replace('_', ' ')} {state}" + (f" ({rule} rule)" if rule else "")
                   + (f": {why}" if why else ""))
    return out


def gates_html(results: Results) -> str:
    if not results.rungs:
        return missing("no rung was gated in this run.")
    rows = fp64_rows(results)
    parts = []
    if rows:
        # What passed and by how much first, the scale it was judged on last: read at 900 px without scrolling.
        parts.append(table(["rung", "check", "quantity", "passed", "rung's distance", "allowed", "eager's distance",
                            "base's distance", "scale", "measured from"], rows,
                           left=("rung", "check", "quantity", "scale", "measured from", "passed"),
                           short=("check", "quantity", "scale", "measured from")))
        k = next(c.k for r in results.rungs for c in _fp64s(r) if c.k is not None)
        parts.append(f"<p>{esc(_rule_line(k))}</p>")
    else:
        parts.append(missing("no check was judged by distances here (see the checks below)."))
    parts.append(notes(line for r in results.rungs for line in _other(r)))
    parts.append(notes(census_notes(results)))
    parts.append(notes(cost_notes(results)))
    return "\n".join(parts)


def _fp64s(r: RungResult) -> list[Fp64]:
    g = r.gate
    if g is None:
        return []
    return [c.fp64 for c in (g.equivalence, g.differential) if c is not None and c.fp64 is not None]


def _rule_line(k: float) -> str:
    return (f"each distance is relative to the truth's own norm (a gradient that vanishes: the norm the model's mean "
            f"gradient gives a tensor its size); the truth is eager in fp64, or eager fp32 where fp64 could not run "
            f"(its own error then allowed for); allowed = {k:g} × the larger of eager's (at the rung's precision) and "
            "the base's (same precision and shape) + a floor at that precision; the loss curve's multiplier is larger, "
            "as a curve carries every step's rounding (docs/measurement.md, rule 12).")


def _seconds(seconds: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.2f} s" for k, v in seconds.items())


def reference_line(c: ReferenceCost) -> str:
    """What one reference cost, phase by phase."""
    at = (f", its outputs, census and truth those of B={c.function_at}'s reference" if c.function_at else "")
    micro = f", accumulated over micro-batches of {c.micro}" if c.micro else ""
    return (f"eager fp32 reference at B={c.batch_size}, T={c.seq_len} ({c.steps} curve steps{micro}{at}): "
            f"{c.total_s:.2f} s — {_seconds(c.seconds)}")


def cost_notes(results: Results) -> list[str]:
    """What each reference and each rung's gate cost (docs/measurement.md, rule 16)."""
    out = []
    for r in results.rungs:
        g = r.gate
        if g is None:
            continue
        out += [f"{r.name}'s gate built the {reference_line(c)}" for c in g.references]
        if g.seconds:
            out.append(f"{r.name}: its gate's steps {_seconds(g.seconds)}")
    return out


def census_line(check: str, k: Kinks | None) -> str:
    """One check's kink census in words: how many elements lay within rounding of a kink, where the probe is."""
    if k is None:
        return f"{check}: no kink census (a file from before it)"
    if not k.ran:
        return f"{check}: kink census not taken: {k.detail}"
    at = (f"; {k.near_at_precision:,} within {k.precision}'s own band (eager at {k.precision} crosses such kinks "
          "too)" if k.near_at_precision is not None else "")
    if k.ops == 0:
        return f"{check}: kink census 0: the model has no kink or tie (no relu, clamp, max, comparison, top-k)"
    ops = ", ".join(f"{op} {n}" for op, n in sorted(k.by_op.items()))
    moved = (f"; {k.near_first} in gate batch 0 ({ops}), so the probe is {k.probe}" if k.near_first and k.rows
             else f"; {k.near_first} in gate batch 0 ({ops}), the probe kept there" if k.near_first else "")
    return (f"{check}: kink census {k.near} of {k.elements:,} elements within rounding of a kink at the probe "
            f"({k.ops} kink ops){moved}{at}" + (f" ({k.detail})" if k.detail else ""))


def gate_lines(name: str, g: Gate, run_dir: str | None = None) -> list[str]:
    """A rung's gate in a few lines: the verdict, each numerical check's census, and a failure's explanation."""
    out = [f"{name}: gate " + ("passed" if g.passed else f"FAILED: {g.detail}")]
    for label, c in (("equivalence", g.equivalence), ("differential", g.differential)):
        if c is not None and c.fp64 is not None:
            out.append("  " + census_line(label, c.fp64.kinks))
    out += [f"  built the {reference_line(c)}" for c in g.references]
    if g.seconds:
        out.append(f"  its steps: {_seconds(g.seconds)}")
    e = g.explanation
    if e is not None:
        out.append(f"  why: {e.summary}")
        if e.second_probe:
            out.append(f"  second probe: {e.second_probe}")
        cmd = f"speedladder gates {run_dir} {name}" if run_dir else e.command
        if cmd:
            out.append(f"  again, alone: {cmd}")
    return out


def divergence_html(results: Results, run_dir: str | None = None) -> str:
    """Each failed gate's explanation, for report.html: where the divergence starts, function or kink, and the
    command that re-runs the gates alone (below the table: a path does not wrap in a cell)."""
    rows, commands = [], []
    for r in results.rungs:
        e = r.gate.explanation if r.gate is not None else None
        if e is None:
            continue
        rows.append([r.name, e.check or "—", e.module or "—", e.kind or "—", e.summary])
        cmd = f"speedladder gates {run_dir} {r.name}" if run_dir else e.command
        if cmd:
            commands.append(f"{r.name}, its gates again, alone: {cmd}")
    if not rows:
        return ""
    headers = ["rung", "check", "divergence starts at", "looks like", "why"]
    return ("<h3>Why a gate failed</h3>" + table(headers, rows, left=headers, wrap=("why",)) + notes(commands))


def census_notes(results: Results) -> list[str]:
    """Every gated rung's kink census, one line per check."""
    out = []
    for r in results.rungs:
        g = r.gate
        if g is None or g.reference:
            continue
        for label, c in (("equivalence", g.equivalence), ("differential", g.differential)):
            if c is not None and c.fp64 is not None:
                out.append(f"{r.name}: " + census_line(label, c.fp64.kinks))
    return out
