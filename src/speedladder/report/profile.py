"""The profile in words and tables: categories, regime, roofline, and each prediction against its measurement."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from speedladder.records import ProfileSummary, Results
from speedladder.report.common import console, label, model_label, pct, times


def category_line(b: ProfileSummary) -> str:
    return ", ".join(f"{c} {pct(v['share'])}" for c, v in b.categories.items() if v["share"] >= 0.005)


def roofline_line(results: Results) -> str | None:
    """Each measured rung's achieved TFLOP/s against a peak: the datasheet's, else the ceiling measured here."""
    b = results.profile or ProfileSummary()
    ceiling = b.matmuls.get("ceiling_tflops") or {}
    parts = []
    for r in results.rungs:
        if not r.ok or r.role == "control" or r.tflops is None:
            continue
        prec = r.precision if r.precision != "tf32" else "fp32"  # TF32 keeps fp32 storage: its ceiling is fp32's
        if r.peak_tflops:
            parts.append(f"{r.name} {r.tflops:.3g} of {r.peak_tflops:.0f} datasheet ({pct(r.mfu or 0.0)})")
        elif ceiling.get(prec):
            parts.append(f"{r.name} {r.tflops:.3g} of {ceiling[prec]:.3g} ({pct(r.tflops / ceiling[prec])})")
    if not parts:
        return None
    source = ("datasheet peak" if any(r.peak_tflops for r in results.rungs) else
              f"the {b.matmuls.get('ceiling_n')}³ matmul ceiling measured here at the rung's precision")
    return f"roofline, achieved TFLOP/s of {source}: " + "; ".join(parts) + "."


def profile_notes(results: Results) -> list[str]:
    """The profile's verdict and each prediction against its measurement."""
    b = results.profile
    if b is None:
        return []
    if b.error:
        return [f"profile: failed ({b.error}); no predictions."]
    out = [f"profile of the baseline ({b.steps} steps, {b.time_basis}): {category_line(b)}.",
           f"regime: {b.regime} — {b.evidence}."]
    if b.memory_gbps:
        out.append(f"memory-bound operators moved {b.memory_gbps:.1f} GB/s (counted from shapes for "
                   f"{pct(b.memory_counted_share or 0.0)} of their time); a large copy runs at "
                   f"{b.copy_gbps or 0.0:.1f} GB/s here.")
    line = roofline_line(results)
    if line:
        out.append(line)
    for r in results.rungs:
        p = r.predicted
        if r.role == "control" or p is None or p.speedup is None or r.built_on is None:
            continue
        measured = "not measured" if not r.ok or r.speedup_prev is None else (
            f"measured {r.speedup_prev:.2f}× ({100 * (r.prediction_error or 0.0):+.0f}%)")
        out.append(f"predicted {label(r).lstrip('┊◆ ')}: {p.reason}; {measured}.")
    return out


def _facts_line(b: ProfileSummary) -> str:
    m = b.matmuls
    ceil = m.get("ceiling_tflops") or {}
    facts = [(f"measured here: {m.get('ceiling_n')}³ matmul {ceil.get('fp32', 0):.3g} TFLOP/s fp32, "
              f"{ceil.get('bf16', 0):.3g} bf16")]
    if b.matmul_tflops:
        facts.append(f"the step's matmuls achieved {b.matmul_tflops:.3g} TFLOP/s")
    if m.get("bf16_speedup"):
        facts.append(f"bf16 runs this model's matmuls at {m['bf16_speedup']:.2f}× their fp32 speed")
    gain = (m.get("batch_gain") or {}).get("fp32")
    if gain:
        facts.append(f"{gain:.2f}× as efficient at {m['multiplier']}× the batch (fp32)")
    if b.memory_gbps:
        facts.append(f"memory-bound ops {b.memory_gbps:.1f} GB/s vs a large copy's {b.copy_gbps or 0.0:.1f} GB/s")
    return "roofline: " + "; ".join(facts) + "."


def category_table(b: ProfileSummary) -> Table:
    t = Table(title=escape(f"one step, {b.wall_step_ms or 0.0:.2f} ms under the profiler: {b.time_basis}"),
              title_justify="left")
    for col in ("category", "ms/step", "share", "of which per-op floor"):
        t.add_column(col, justify="left" if col == "category" else "right")
    for c, v in b.categories.items():
        t.add_row(escape(c), f"{v['ms']:.3f}", pct(v["share"]), f"{v['floor_ms']:.3f}" if v["floor_ms"] else "—")
    t.add_row("total", f"{sum(v['ms'] for v in b.categories.values()):.3f}",
              pct(sum(v["share"] for v in b.categories.values())), "")
    return t


def print_profile(saved: Results, out: Console | None = None) -> None:
    """`speedladder profile`'s output: top operators, categories, regime, roofline, predictions."""
    out = out or console()
    b = saved.profile or ProfileSummary()
    spec = b.spec
    out.print(escape(f"speedladder profile · {model_label(saved.config, saved.model)} on {saved.environment['device_name']} · "
                     f"B={spec['batch_size']} T={spec['seq_len']} · {'+'.join(b.rungs) or 'baseline (eager fp32)'} · "
                     f"{b.steps} steps"))
    out.print(escape(f"top operators by {'CUDA' if b.device_type == 'cuda' else 'CPU'} self time "
                     "(torch.profiler, all profiled steps):"))
    out.print(escape(b.top_table.rstrip()), soft_wrap=True)
    out.print(category_table(b))
    out.print(escape(f"regime: {b.regime} — {b.evidence}"), soft_wrap=True)
    out.print(escape(_facts_line(b)), soft_wrap=True)
    t = Table(title="predictions (each on the rung before it)", title_justify="left")
    for col in ("rung", "pred ×", "why"):
        t.add_column(col, justify="right" if col == "pred ×" else "left")
    for p in saved.predictions or []:
        t.add_row(escape(p["rung"]), times(p["speedup"]), escape(p["reason"]))
    out.print(t)
