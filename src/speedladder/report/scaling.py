"""Prediction against measurement for data parallelism: table, notes and plot, from a saved results.json."""

from __future__ import annotations

import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from speedladder.measure.judging import Spread
from speedladder.records import ParallelSection, Probe, Results
from speedladder.report.common import recipe_part

SCALING_PLOT = "scaling.png"


def section(saved: Results) -> ParallelSection:
    """The parallel section of a predict or ddp folder (the only folders these views are called for)."""
    if saved.parallel is None:
        raise ValueError("not a predict or ddp folder: no parallel section")
    return saved.parallel


def k_rows(p: ParallelSection) -> list[list[str]]:
    """Each k's predicted floor, overlap-aware tokens/s and efficiency, and what was measured there: report.html's
    table of k."""
    m = p.measured
    rows = []
    for r in p.predictions:
        meas = ""
        if m and r.k == m.k:
            t = m.tokens_per_s
            meas = f"{t.median:,.0f} ({t.min:,.0f}–{t.max:,.0f})"
        elif r.k == 1 and p.single:
            meas = f"{p.single.tokens_per_s.median:,.0f}"
        rows.append([str(r.k), f"{r.floor_tokens_per_s:,.0f}", f"{r.overlap_tokens_per_s:,.0f}",
                     f"{100 * r.overlap_efficiency:.0f}%", meas or "—"])
    return rows


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:+.0f}%"


def title(saved: Results) -> str:
    """The printed table's title: the command, strategy, model, machine, configuration and shape per process."""
    c, e, p = saved.config, saved.environment, section(saved)
    return (f"speedladder {p.command} · {p.strategy} · {c.preset} on {e.device_name} "
            f"({e.device_type}) · {'+'.join(p.rungs)} · B={p.spec.batch_size} "
            f"T={p.spec.seq_len} per process{recipe_part(saved)} · torch {e.torch}")


def probe_table(probe: Probe) -> Table:
    """One allreduce probe: each message size's time and bandwidths."""
    t = Table(title=escape(f"allreduce probe · k={probe.k} · {probe.backend}"), title_justify="left")
    for col in ("bytes", "iters", "time", "algbw GB/s", "busbw GB/s"):
        t.add_column(col, justify="right", no_wrap=True)
    for r in probe.sizes:
        t.add_row(f"{r.bytes:,}", str(r.iters), f"{r.seconds * 1e6:,.0f} µs", f"{r.algbw_GBps:.3f}",
                  "—" if r.busbw_GBps is None else f"{r.busbw_GBps:.3f}")
    return t


def prediction_table(saved: Results) -> Table:
    """Every k priced, and beside the measured k (and k = 1) what was measured."""
    p = section(saved)
    m = p.measured
    t = Table(title=escape(title(saved)), title_justify="left")
    cols = ["k", "comm MB", "msgs", "t_compute ms", "t_comm ms", "exposed ms", "floor tok/s", "overlap tok/s",
            "eff floor", "eff overlap"]
    if m:
        cols += ["measured tok/s", "min–max", "eff", "vs floor", "vs overlap"]
    for col in cols:
        t.add_column(col, justify="right", no_wrap=True)
    for r in p.predictions:
        row = [str(r.k), f"{r.comm_bytes / 1e6:.2f}", str(r.messages), f"{r.t_compute_s * 1e3:.1f}",
               f"{r.t_comm_s * 1e3:.2f}", f"{r.t_exposed_s * 1e3:.2f}", f"{r.floor_tokens_per_s:,.0f}",
               f"{r.overlap_tokens_per_s:,.0f}", f"{100 * r.floor_efficiency:.0f}%",
               f"{100 * r.overlap_efficiency:.0f}%"]
        if m:
            if r.k == m.k:
                tps = m.tokens_per_s
                row += [f"{tps.median:,.0f}", f"{tps.min:,.0f}–{tps.max:,.0f}", f"{100 * m.efficiency:.0f}%",
                        _pct(m.floor_error), _pct(m.overlap_error)]
            elif r.k == 1 and p.single is not None:
                s = p.single.tokens_per_s
                row += [f"{s.median:,.0f}", f"{s.min:,.0f}–{s.max:,.0f}", "100%", "", ""]
            else:
                row += ["", "", "", "", ""]
        t.add_row(*row, style="bold" if m and r.k == m.k else None)
    return t


def notes(saved: Results) -> list[str]:
    """What the prices rest on (t_compute, bandwidth, buckets or units, cores) and what the job measured."""
    p = section(saved)
    out = []
    single = p.single
    if single:
        who = f"one process with {single.threads} thread(s)" if single.threads else f"one {single.device}"
        how = single.via or "in the parent process, no process group"  # schema 1 measured it in the parent
        s = single.tokens_per_s
        out.append(f"t_compute: {who}, {how}: {s.median:,.0f} tokens/s "
                   f"(min {s.min:,.0f}, max {s.max:,.0f}), {single.step_ms:.1f} ms a step.")
    bw = p.bandwidth
    if bw and bw.source == "measured" and len(p.probes) > 1:
        out.append(f"bandwidth (measured): {bw.note}; each k is priced with its own probe's busbw and latency "
                   "(fitted over every message size, the DDP buckets' included): "
                   + ", ".join(f"k={q.k}: {q.busbw_GBps:.3f} GB/s, {q.latency_us:,.0f} µs"
                               for q in p.probes) + ".")
    elif bw and bw.busbw_GBps is not None:
        out.append(f"bandwidth ({bw.source}): busbw {bw.busbw_GBps:.3f} GB/s, latency {bw.latency_us:,.0f} µs"
                   f" — {bw.note}.")
        if bw.source == "measured":
            out.append(f"k other than {bw.probe_k} are priced with the k={bw.probe_k} probe's figures "
                       "(the model's extrapolation).")
    elif bw:
        out.append(bw.note + ".")
    if p.strategy == "ddp":
        out.append(f"DDP: {len(p.ddp_buckets)} bucket(s) of {', '.join(f'{b / 1e6:.2f}' for b in p.ddp_buckets)}"
                   f" MB (first {p.first_bucket_bytes / 2**20:g} MiB, then {p.bucket_cap_bytes / 2**20:g} MiB); "
                   "floor = no overlap; overlap-aware = the last bucket plus whatever does not fit under backward "
                   f"({p.config.backward_fraction:.2f} of compute) is exposed.")
    else:
        out.append(f"FSDP2: {len(p.unit_bytes)} units (root + blocks); all-gather in forward and backward, "
                   "reduce-scatter in backward, each (k-1)/k·bytes/busbw; overlap-aware = the first gather of each "
                   "pass and the last reduce-scatter exposed, plus what does not fit under the compute.")
    cores = p.cpu_cores
    if single and single.threads and cores:
        over = [k for k in p.nproc if k > cores]
        out.append(f"on a CPU the k processes share this machine's {cores} core(s): each process is priced as one "
                   f"device with {single.threads} thread(s)"
                   + (f"; k={','.join(map(str, over))} exceed the cores: those rows price k separate devices like "
                      "it, not this machine" + (", and their probes ran k processes on these cores" if p.probes
                                                else "") + "." if over else "."))
    m = p.measured
    if m:
        tps = m.tokens_per_s.median
        pred = p.prediction(m.k)
        out.append(f"measured k={m.k}: {tps:,.0f} tokens/s for the whole job (every rank's tokens over the slowest "
                   f"rank's window), {100 * m.efficiency:.0f}% scaling efficiency"
                   + (f"; predicted floor {pred.floor_tokens_per_s:,.0f} ({_pct(m.floor_error)}), "
                      f"overlap-aware {pred.overlap_tokens_per_s:,.0f} ({_pct(m.overlap_error)})." if pred else "."))
        c = m.param_check
        out.append(f"parameters after the steps: {'identical on every rank' if c.identical else 'DIFFER'} "
                   f"(largest difference from rank 0: {c.max_abs_diff:.3g} over {c.params:,} values).")
        out.extend(f"measured k={m.k}: FLAG — {flag}" for flag in m.flags)
    return out


def print_parallel(saved: Results, console: Console | None = None) -> None:
    """predict's and ddp's printed view: each probe, the table of k, the notes."""
    console = console or Console(highlight=False, width=None if sys.stdout.isatty() else 200)
    for probe in section(saved).probes:
        console.print(probe_table(probe))
    console.print(prediction_table(saved))
    for line in notes(saved):
        console.print(escape(line), soft_wrap=True)


def plot(saved: Results, path: Path) -> Path:
    """Measured and predicted tokens/s against k, with linear scaling for reference."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    p = section(saved)
    preds = p.predictions
    ks = [r.k for r in preds]
    single = p.single.tokens_per_s if p.single is not None else Spread(0.0, 0.0, 0.0)
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    ax.plot(ks, [k * single.median for k in ks], linestyle=":", color="#888888", label="linear (k × one process)")
    ax.plot(ks, [r.floor_tokens_per_s for r in preds], marker="v", color="#d62728", label="predicted floor (no overlap)")
    ax.plot(ks, [r.overlap_tokens_per_s for r in preds], marker="^", color="#1f6fb4",
            label="predicted, overlap-aware")
    mk = [1]
    med = [single.median]
    lo = [single.median - single.min]
    hi = [single.max - single.median]
    m = p.measured
    if m:
        t = m.tokens_per_s
        mk.append(m.k)
        med.append(t.median)
        lo.append(t.median - t.min)
        hi.append(t.max - t.median)
    ax.errorbar(mk, med, yerr=[lo, hi], fmt="o", color="black", capsize=4, label="measured (median, min–max)")
    ax.set_xlabel("processes k")
    ax.set_ylabel("tokens/s, whole job")
    ax.set_xticks(sorted(set(ks) | set(mk)))
    ax.set_ylim(bottom=0)
    e = saved.environment
    ax.set_title(f"{p.strategy} · {saved.config.preset} · {e.device_name}", fontsize=10)
    ax.legend(fontsize=8, frameon=False)
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
