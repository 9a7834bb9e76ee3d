"""The profile in words and tables: categories, regime, roofline, and each prediction against its measurement."""

from __future__ import annotations

import statistics

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from speedladder.profile.quartiles import iqr
from speedladder.records import CategoryTime, ProfileSummary, Results, Role
from speedladder.records.profile_summary import BF16, FP32
from speedladder.report.common import console, label, model_label, pct, times
from speedladder.report.mfu import tflops_text


def share_of(categories: dict[str, CategoryTime], name: str) -> float:
    """A category's share of the median step, from the profile's categories as saved."""
    return categories[name].share


def ms_of(categories: dict[str, CategoryTime], name: str) -> float:
    """A category's milliseconds in the median step."""
    return categories[name].ms


def share_range(v: CategoryTime) -> str:
    """A category's share of the median step, and the quartiles of each step's own share where kept."""
    rng = v.share_iqr
    return pct(v.share) + (f" (steps {pct(rng[0])}–{pct(rng[1])})" if rng else "")


def iqr_text(xs: list[float]) -> str:
    lo, hi = iqr(xs)
    return f"{lo:.1f}–{hi:.1f}"


def category_line(b: ProfileSummary) -> str:
    return ", ".join(f"{c} {share_range(v)}" for c, v in b.categories.items() if v.share >= 0.005)


def host_device_line(b: ProfileSummary) -> str | None:
    """Where host and device are apart (CUDA): each one's time a step, the unprofiled step, and which bounds it."""
    if not b.apart:
        return None
    host, device = b.host_ms or 0.0, b.device_ms or 0.0
    step = f", the unprofiled step {b.timed_step_ms:.1f} ms" if b.timed_step_ms is not None else ""
    serial = f" ({b.serial_ms:.1f} ms of it did not overlap)" if b.serial_ms else ""
    why = ("the device waits on the host: faster kernels buy nothing until the host's part shrinks (CUDA graphs, "
           "compile, a bigger batch)" if b.bound == "host" else
           "the host keeps ahead of the device: the kernels set the pace")
    return (f"host and device: the host takes {host:.1f} ms a step to issue its work (timed without the profiler), "
            f"the device is busy {device:.1f} ms (the union of its kernels){step}{serial}: {b.bound}-bound, {why}.")


def doubled_line(b: ProfileSummary) -> str | None:
    """A CUDA profile saved before host and device were timed apart: what its figures are."""
    if b.device_type != "cuda" or b.apart:
        return None
    return ("this CUDA profile was saved before host and device were timed apart: each step's range was counted on "
            "the host and again on the device, so its steps are half-steps, its idle share is the host's waits, and "
            "its regime and predictions rest on them (docs/profile.md, \"Host and device\").")


def spread_lines(b: ProfileSummary) -> list[str]:
    """What the steps' spread says: a borderline regime, and the steps far outside the others."""
    out = []
    if b.borderline:
        first, second = (k.removesuffix("-bound") for k in b.borderline)
        iqr = b.bucket_iqr
        ranges = "; ".join(f"{k} {pct(b.buckets[k])} ({pct(iqr[k][0])}–{pct(iqr[k][1])})" for k in (first, second)
                           if k in iqr and k in b.buckets)
        out.append(f"regime {b.label}: the margin between {first} and {second} is inside their spread across the "
                   f"steps ({ranges or 'no per-step spread kept'}), so the predictions that rest on their shares are "
                   "uncertain by as much; each prediction gives its range.")
    walls = [s.wall_ms for s in b.per_step]
    if b.unsteady and walls:
        out.append(f"unsteady steps: wall times {min(walls):.1f}–{max(walls):.1f} ms, interquartile range "
                   f"{iqr_text(walls)} ms around a median of {statistics.median(walls):.1f} ms: the machine was busy "
                   "while profiling; the median of each category leaves out what landed in single steps.")
    waits = [s.wait_share for s in b.per_step if s.wait_share is not None]
    if b.starved and waits:
        out.append(f"starved: the {b.threads} threads waited for a core another process held for "
                   f"{pct(statistics.median(waits))} of the core time the median step asked for; a parallel operator "
                   "waits for its missing thread, so the shares show the contention more than the workload.")
    if b.outlier_steps and walls:
        median = statistics.median(walls)
        steps = ", ".join(f"#{i} {b.per_step[i].wall_ms:.1f} ms" for i in b.outlier_steps if i < len(b.per_step))
        out.append(f"outlier steps (median {median:.1f} ms; {b.outlier_rule}): {steps}; the median step ignores them.")
    return out


def roofline_line(results: Results) -> str | None:
    """Each measured rung's achieved TFLOP/s against a peak: its MFU's (the datasheet's, the one given, or the
    ceiling the ladder measured), else, in a file without one, the ceiling the profile measured."""
    b = results.profile or ProfileSummary()
    ceiling = b.matmuls.ceiling_tflops
    parts = []
    for r in results.rungs:
        if not r.ok or r.role == Role.CONTROL or r.tflops is None:
            continue
        prec = r.precision if r.precision != "tf32" else "fp32"  # TF32 keeps fp32 storage: its ceiling is fp32's
        if r.peak_tflops:
            parts.append(f"{r.name} {r.tflops:.3g} of {tflops_text(r.peak_tflops)} ({pct(r.mfu or 0.0)})")
        elif ceiling.get(prec):
            parts.append(f"{r.name} {r.tflops:.3g} of {ceiling[prec]:.3g} ({pct(r.tflops / ceiling[prec])})")
    if not parts:
        return None
    with_peak = any(r.peak_tflops for r in results.rungs)
    source = ("the peak each MFU is taken against (named in the MFU note)" if with_peak else
              f"the {b.matmuls.ceiling_n}³ matmul ceiling measured here at the rung's precision")
    return f"roofline, achieved TFLOP/s of {source}: " + "; ".join(parts) + "."


def profile_notes(results: Results) -> list[str]:
    """The profile's verdict and each prediction against its measurement."""
    b = results.profile
    if b is None:
        return []
    if b.error:
        return [f"profile: failed ({b.error}); no predictions."]
    steps = f"the median of {b.steps} steps" if b.per_step else f"{b.steps} steps"
    out = [f"profile of the baseline ({steps}, {b.time_basis}): {category_line(b)}."]
    line = host_device_line(b) or doubled_line(b)
    if line:
        out.append(line)
    out += [f"regime: {b.label} — {b.evidence}.", *spread_lines(b)]
    if b.memory_gbps:
        out.append(f"memory-bound operators moved {b.memory_gbps:.1f} GB/s (counted from shapes for "
                   f"{pct(b.memory_counted_share or 0.0)} of their time); a large copy runs at "
                   f"{b.copy_gbps or 0.0:.1f} GB/s here.")
    line = roofline_line(results)
    if line:
        out.append(line)
    for r in results.rungs:
        p = r.predicted
        if r.role == Role.CONTROL or p is None or p.speedup is None or r.built_on is None:
            continue
        measured = "not measured" if not r.ok or r.speedup_prev is None else (
            f"measured {r.speedup_prev:.2f}× ({100 * (r.prediction_error or 0.0):+.0f}%)")
        out.append(f"predicted {label(r).lstrip('┊◆★ ')}: {p.reason}; {measured}.")
    return out


def _facts_line(b: ProfileSummary) -> str:
    m = b.matmuls
    ceil = m.ceiling_tflops
    facts = [(f"measured here: {m.ceiling_n}³ matmul {ceil.get(FP32, 0):.3g} TFLOP/s fp32, "
              f"{ceil.get(BF16, 0):.3g} bf16")]
    if b.matmul_tflops:
        facts.append(f"the step's matmuls achieved {b.matmul_tflops:.3g} TFLOP/s")
    if m.bf16_speedup:
        facts.append(f"bf16 runs this model's matmuls at {m.bf16_speedup:.2f}× their fp32 speed")
    gain = m.batch_gain.get(FP32)
    if gain:
        facts.append(f"{gain:.2f}× as efficient at {m.multiplier}× the batch (fp32)")
    if b.memory_gbps:
        facts.append(f"memory-bound ops {b.memory_gbps:.1f} GB/s vs a large copy's {b.copy_gbps or 0.0:.1f} GB/s")
    return "roofline: " + "; ".join(facts) + "."


def category_table(b: ProfileSummary) -> Table:
    steps = f"the median of {b.steps} steps" if b.per_step else "one step"
    unprofiled = f" ({b.timed_step_ms:.2f} ms without it)" if b.timed_step_ms is not None else ""
    t = Table(title=escape(f"{steps}, {b.wall_step_ms or 0.0:.2f} ms under the profiler{unprofiled}: {b.time_basis}"),
              title_justify="left")
    spread = any(v.share_iqr for v in b.categories.values())  # a profile saved before the spread was recorded has none
    for col in ("category", "ms/step", "share", *(["steps' IQR"] if spread else []), "of which per-op floor"):
        t.add_column(col, justify="left" if col == "category" else "right")
    for c, v in b.categories.items():
        rng = v.share_iqr
        t.add_row(escape(c), f"{v.ms:.3f}", pct(v.share),
                  *([f"{pct(rng[0])}–{pct(rng[1])}" if rng else "—"] if spread else []),
                  f"{v.floor_ms:.3f}" if v.floor_ms else "—")
    t.add_row("total", f"{sum(v.ms for v in b.categories.values()):.3f}",
              pct(sum(v.share for v in b.categories.values())), *([""] if spread else []), "")
    return t


def print_profile(saved: Results, out: Console | None = None) -> None:
    """`speedladder profile`'s output: top operators, categories, regime, roofline, predictions."""
    out = out or console()
    b = saved.profile or ProfileSummary()
    batch, length = (b.spec.batch_size, b.spec.seq_len) if b.spec is not None else (None, None)
    out.print(escape(f"speedladder profile · {model_label(saved.config, saved.model)} on "
                     f"{saved.environment.device_name} · B={batch} T={length} · "
                     f"{'+'.join(b.rungs) or 'baseline (eager fp32)'} · {b.steps} steps"))
    out.print(escape(f"top operators by {'CUDA' if b.device_type == 'cuda' else 'CPU'} self time "
                     "(torch.profiler, all profiled steps):"))
    out.print(escape(b.top_table.rstrip()), soft_wrap=True)
    out.print(category_table(b))
    if b.per_step:
        out.print(escape(f"steps' IQR: each step's own share, {b.spread_basis}; ops/step: {_ops_line(b)}"),
                  soft_wrap=True)
    sides = host_device_line(b) or doubled_line(b)
    if sides:
        out.print(escape(sides), soft_wrap=True)
    out.print(escape(f"regime: {b.label} — {b.evidence}"), soft_wrap=True)
    for line in spread_lines(b):
        out.print(escape(line), soft_wrap=True)
    out.print(escape(_facts_line(b)), soft_wrap=True)
    t = Table(title="predictions (each on the rung before it)", title_justify="left")
    spread = any(p.speedup_iqr for p in saved.predictions or [])
    bound = any(p.bound for p in saved.predictions or [])  # host and device apart (CUDA): which bounds each step
    for col in ("rung", "pred ×", *(["steps' IQR"] if spread else []), *(["bound"] if bound else []), "why"):
        t.add_column(col, justify="left" if col in ("rung", "why") else "right")
    for p in saved.predictions or []:
        rng = p.speedup_iqr
        t.add_row(escape(p.rung), times(p.speedup),
                  *([f"{rng[0]:.2f}–{rng[1]:.2f}" if rng else "—"] if spread else []),
                  *([p.bound or "—"] if bound else []), escape(p.reason))
    out.print(t)


def _ops_line(b: ProfileSummary) -> str:
    """Operators per step: one number when every step ran the same, else the range (and it is worth a look)."""
    ops = sorted({s.ops for s in b.per_step})
    return f"{ops[0]} in every step" if len(ops) == 1 else f"{ops[0]}–{ops[-1]} (differs between steps)"
