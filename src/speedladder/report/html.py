"""report.html: one self-contained page drawn from a saved results.json alone.

`build(results)` is a pure function from the saved records to an HTML string; `write` puts it beside
results.json. Every chart is a matplotlib figure inlined as SVG: no script, no stylesheet or font
fetched from anywhere, text drawn as glyph paths, so the page opens from disk with no network and
looks the same everywhere (docs/report.md says why this and not a JavaScript plotting library).

Each section has a stable id (SECTIONS) and, when the run holds no data for it, says why instead
of vanishing.
"""

from __future__ import annotations

import math
import shlex
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

from speedladder.records import CorpusRecord, LearnsCheck, LossBand, Results, Role, RungResult, from_dict, to_dict
from speedladder.report import conclusion, machine_notes, summary, trust
from speedladder.report import scaling as parallel_report
from speedladder.report.common import label, model_label
from speedladder.report.explained import explanation_html
from speedladder.report.gate_details import divergence_html, gates_html
from speedladder.report.htmlkit import (
    _figure,
    chip_text,
    esc,
    flatten,
    human_bytes,
    inline_svg,
    kv,
    missing,
    notes,
    page,
    section,
    svg,
    svg_settings,
    table,
)
from speedladder.report.memory_notes import field_of, memory_chart, memory_fields
from speedladder.report.mfu import device_peak
from speedladder.report.profile_notes import ms_of, roofline_line, share_of
from speedladder.report.race_charts import race_figure, race_html
from speedladder.report.text import MFU, MFU_OWN, NOT_BUILT_UPON
from speedladder.report.text import header as header_of
from speedladder.report.text import notes as text_notes
from speedladder.report.text import rows as text_rows
from speedladder.report.tune_outcome import tune_lines
from speedladder.report.waterfall import COLOURS, PREDICTED, waterfall_figure

FILENAME = "report.html"
SECTIONS: tuple[tuple[str, str], ...] = (
    ("header", "Run"), ("summary", "Summary"), ("rungs", "Rungs"), ("waterfall", "Waterfall"),
    ("race", "Race to a target loss"), ("loss-curves", "Loss curves"), ("gates", "Gates in detail"),
    ("memory", "Memory"), ("profile", "Profile and predictions"), ("parallel", "Data parallelism"),
    ("environment", "Environment"))

REF_STYLES = ("--", ":", "-.")  # the eager fp32 reference curves, black, told apart by dash
CONTROL_COLOUR = "#999999"  # a control is not a step of the ladder: no verdict colour of its own
_NOT_RUN_STATUSES = ("skipped", "oom", "error", "interrupted", "pending")
# The rung table's columns, read at any width: what a rung did to the speed and whether it may be trusted and built
# upon (the terminal's compact table); every other column is in the details table below it.
MAIN = ("rung", "on", "tokens/s", "× prev", "× cum", "gate", "verdict", NOT_BUILT_UPON)
# The details table below it, by what is read first: the windows' range, the step, MFU (the device's one peak, then
# the row's own precision's), memory, compile seconds, the prediction.
DETAILS = ("min–max", "step ms", MFU, MFU_OWN, "TFLOP/s", "peak mem", "saved act", "pred act", "compile s", "pred ×",
           "err")


# -- sections -------------------------------------------------------------------------------------

def header(saved: Results) -> str:
    """The run's header: the command, the model, the shape, the machine and when."""
    e, c, model, corpus = saved.environment, saved.config, saved.model, saved.corpus or CorpusRecord()
    kind = saved.run_kind.value
    cuda = e.cuda or "none (a CPU build of torch)"
    pairs = [
        ("command", shlex.join(saved.command)),
        ("kind", kind), ("status", saved.status),
        ("model", f"{model_label(c, model)} · {model.params:,} parameters"
                  + (f" · {model.convention_means}; FLOPs {model.flops_method}; "
                     f"dropout {model.dropout}" if model.convention_means else "")),
        ("shape", f"B={c.batch_size} T={c.seq_len} (batch-up ×{c.batch_multiplier})"),
        ("recipe", c.run.recipe.describe() + (f"; schedule: {saved.schedule}" if saved.schedule else "")),
        ("corpus", f"{corpus.source} · {corpus.tokenizer} tokenizer · {corpus.tokens:,} tokens"),
        ("device", f"{e.device_name} ({e.device})" + (
            f" · {c.run.threads} threads (--threads)" if c.run.threads is not None else "")),
        ("torch / CUDA", f"{e.torch} / {cuda}"),
        ("date", f"{saved.created} (last written {saved.updated})"),
        ("git commit", e.git_commit or "unknown (not run from a speedladder checkout)"),
    ]
    load = machine_notes.html_value(saved)  # other processes before and during the windows, when read
    if load is not None:
        pairs.append(("machine", load))
    title = f"speedladder {kind} · {model_label(c, model)} on {e.device_name}"
    glance = " · ".join([saved.status, f"{model.params:,} parameters", f"B={c.batch_size} T={c.seq_len}",
                         f"{e.device_name} ({e.device_type})", f"torch {e.torch}", saved.created[:10],
                         f"commit {e.git_commit[:10]}" if e.git_commit else "commit unknown"])
    said = conclusion.of(saved)
    banner = (f'<p class="banner" id="interrupted">{esc(said.banner)}</p>\n' if said is not None and said.banner
              else "")
    shared = machine_notes.header_line(saved)  # other processes' load, where worth saying: where the reader starts
    warning = f'<p class="missing" id="machine-not-alone">{esc(shared)}</p>\n' if shared else ""
    return (f'<header id="header">\n<h1>{esc(title)}</h1>\n<p class="glance">{esc(glance)}</p>\n'
            f"{trust_html(saved)}{warning}{banner}"
            f"<details><summary>the run: command, model, shape, recipe, corpus, device, date, commit, machine</summary>"
            f"{kv(pairs)}</details>\n</header>")


def trust_html(saved: Results) -> str:
    """The trust line (report/trust.py): each item in a word where it is within its threshold, marked where not."""
    found = trust.items(saved)
    if not found:
        return ""
    spans = " · ".join(f'<span class="trust-{i.level}">{"⚠ " if i.level == trust.WARN else ""}{esc(i)}</span>'
                       for i in found)
    return f'<p class="trust" id="trust"><strong>trust:</strong> {spans}</p>\n'


def rungs_section(saved: Results) -> str:
    """The rung table as the terminal prints it, rows marked fastest, not run or failing a gate."""
    recs = saved.rungs
    if not recs:
        p = saved.parallel
        why = ("no ladder in a race: its configurations, times to the target and p-values are in the race section."
               if saved.race is not None else
               f"no ladder in this {p.command} run: it measures one configuration "
               f"({'+'.join(p.rungs)}); see the data-parallel section." if p is not None else
               "no rung was recorded: the run stopped before its first rung.")
        return missing(why)
    rows = text_rows(saved)
    peak = device_peak(saved)
    classes, attrs = [], []
    for r, row in zip(recs, rows):
        cls = []
        if r.name == saved.fastest:
            cls.append("fastest")
        if r.status in _NOT_RUN_STATUSES:
            cls.append("not-run")
        if row["gate"] == "FAIL":
            cls.append("gate-fail")
        classes.append(" ".join(cls))
        verdict = r.verdict if r.ok else None
        colour = CONTROL_COLOUR if verdict == "control" else COLOURS.get(verdict or "")
        a = {MAIN.index("gate"): ("gate", "")}
        a[MAIN.index("verdict")] = (("verdict", f"background:{colour};color:{chip_text(colour)}") if colour
                                    else ("verdict none", ""))
        attrs.append(a)
    main = table(list(MAIN), [[row[h] for h in MAIN] for row in rows], left=("rung", "on", "gate", "verdict",
                                                                            NOT_BUILT_UPON),
                 row_classes=classes, cell_attrs=attrs, css="rungs")
    legend = ("verdict colours as in the waterfall: " + ", ".join(
        f'<span class="swatch" style="background:{c}"></span> {esc(k)}' for k, c in COLOURS.items()))
    extra = ["rung", *(h for h in DETAILS if h in rows[0]), *(h for h in rows[0] if h not in (*MAIN, *DETAILS))]
    details = table([header_of(h, peak) for h in extra], [[row[h] for h in extra] for row in rows],
                    left=("rung",), css="details")
    return (f"{main}\n<p class=\"legend\">{legend}</p>\n<h3>details: the windows' range, predictions, step time, "
            f"memory, MFU, compile</h3>\n{details}\n<h3>notes</h3>\n{notes(text_notes(saved))}\n"
            f"{notes(tune_lines(saved))}")


def waterfall_section(saved: Results) -> str:
    """The ladder's waterfall, or a race's bars."""
    if saved.race is not None:
        return svg(race_figure(saved), "waterfall")
    if not any(r.ok for r in saved.rungs if r.role in (Role.RUNG, Role.BESIDE)):
        why = ("no waterfall for a data-parallel run: see tokens/s against k below." if saved.parallel is not None
               else "no rung was measured, so there is no bar to draw.")
        return missing(why)
    return svg(waterfall_figure(saved), "waterfall")


def _numbers(value: object) -> list[float] | None:
    """A curve: a list of at least two numbers (null points of a diverged loss kept as gaps)."""
    if isinstance(value, (list, tuple)) and len(value) > 1 and all(
            v is None or isinstance(v, (int, float)) for v in value):
        return [math.nan if v is None else float(v) for v in value]
    return None


def learns_curves(lc: LearnsCheck | None) -> list[tuple[str, list[float]]]:
    """Every loss curve of the learns-check: the checked rung's own, eager's, and any a file of another version
    keeps under it (its record's extra), named by where it sits."""
    if lc is None:
        return []
    out = [(name, curve) for name, values in ((lc.rung or "learns-check", lc.losses), ("eager", lc.eager_losses))
           if (curve := _numbers(values)) is not None]

    def walk(d: Mapping[str, object], path: str) -> None:
        for key, value in d.items():
            name = f"{path}{key}"
            curve = _numbers(value)
            if curve is not None:
                out.append((path.rstrip(".") if key == "losses" and path else name.removesuffix("_losses"), curve))
            elif isinstance(value, Mapping):
                walk(value, f"{name}.")

    walk(lc.extra, "")
    return out


def _band(r: RungResult) -> LossBand | None:
    """A measured rung's loss band, when it has both curves to draw."""
    band = r.gate.loss_band if r.ok and r.gate is not None else None
    if band is None or _numbers(band.losses) is None or _numbers(band.ref_losses) is None:
        return None
    return band


def loss_section(saved: Results) -> str:
    """Each rung's loss over eager fp32's (the loss band), and the learns-check's curves."""
    if saved.race is not None:
        return missing("no loss-band or learns-check curves in a race: its val-loss curves, against time and against "
                       "tokens, are in the race section.")
    recs = saved.rungs
    gated = [(r, band) for r in recs if (band := _band(r)) is not None]
    parts = []
    if gated:
        fig, (ax, dx) = _figure(12, 4.2, ncols=2)
        refs_drawn: list[tuple[float, ...]] = []  # one eager fp32 reference per batch shape
        for r, band in gated:
            ref = _numbers(band.ref_losses) or []
            if tuple(ref) not in refs_drawn:
                refs_drawn.append(tuple(ref))
                ax.plot(range(1, len(ref) + 1), ref, color="black", linewidth=1.2,
                        linestyle=REF_STYLES[(len(refs_drawn) - 1) % len(REF_STYLES)],
                        label=f"eager fp32, B={r.spec.batch_size if r.spec else None}")
            losses = _numbers(band.losses) or []
            line, = ax.plot(range(1, len(losses) + 1), losses, linewidth=1, label=r.name)
            rel = [(a - b) / b if b else math.nan for a, b in zip(losses, ref)]
            dx.plot(range(1, len(rel) + 1), rel, color=line.get_color(), linewidth=1, label=r.name)
        band_width = gated[0][1].band or 0.0
        dx.axhspan(-band_width, band_width, color="#2ca02c", alpha=0.08, label=f"band ±{band_width:g}")
        ax.set(xlabel="step (the same batches for every rung)", ylabel="training loss",
               title="each rung's loss over eager fp32's")
        dx.set(xlabel="step", ylabel="relative difference from eager fp32", title="loss band gate")
        ax.legend(fontsize=8, frameon=False)
        dx.legend(fontsize=8, frameon=False)
        fig.tight_layout()
        parts.append(svg(fig, "loss-band"))
        parts.append(table(["rung", "steps", "max rel diff", "band", "passed"],
                            [[r.name, str(b.steps), f"{b.max_rel_diff:.2e}", f"{b.band:g}",
                              "yes" if b.passed else "NO"] for r, b in gated], left=("rung", "passed")))
    else:
        parts.append(missing("no loss-band curves: only eager fp32 itself ran, or no rung reached its gates "
                              "(see the rung table)" if recs else "no loss-band curves: no ladder in this run."))
    lc = saved.learns_check
    curves = learns_curves(lc)
    if curves:
        fig, (ax,) = _figure(7, 3.8)
        for name, curve in curves:
            ax.plot(range(1, len(curve) + 1), curve, linewidth=1, label=name)
        ax.set(xlabel="step", ylabel="training loss", title="learns-check")
        ax.legend(fontsize=8, frameon=False)
        fig.tight_layout()
        parts.append(svg(fig, "learns"))
    else:
        why = (f"learns-check not run ({lc.detail})." if lc and lc.skipped else
               f"learns-check failed before any loss was recorded: {lc.detail}" if lc else
               "learns-check not run: the run stopped before it." if saved.status == "interrupted" else
               "no learns-check in this run.")
        parts.append(missing(why))
    return "\n".join(parts)


def memory_section(saved: Results) -> str:
    """Each rung's peak memory beside its fp32 control's; off CUDA, the memory meters instead."""
    recs = saved.rungs
    if not recs:
        return missing("no per-rung memory: a race measures time to a loss, not memory." if saved.race is not None
                       else "no per-rung memory: no ladder in this run.")
    main = [r for r in recs if r.role != Role.CONTROL]
    control = {r.rung: r for r in recs if r.role == Role.CONTROL}
    extra = memory_fields(recs)
    headers = ["rung", "status", "peak memory", "fp32 control peak", *extra]
    rows = []
    for r in main:
        c = control.get(r.name)
        rows.append([r.name, r.status, human_bytes(r.peak_memory_bytes),
                     "—" if c is None else human_bytes(c.peak_memory_bytes) if c.ok else c.status,
                     *(human_bytes(v) if isinstance(v := field_of(r, k), (int, float)) else "n/a" for k in extra)])
    parts = [table(headers, rows, left=("rung", "status"))]
    measured = [(r, r.peak_memory_bytes) for r in main if r.ok and r.peak_memory_bytes]
    if measured:
        fig, (ax,) = _figure(max(5.0, 1.1 * len(measured) + 2), 3.6)
        xs = range(len(measured))
        reserved = any(r.peak_reserved_bytes for r, _ in measured)
        width = 0.38 if reserved else 0.6
        ax.bar([x - width / 2 * reserved for x in xs], [peak / 2**30 for _, peak in measured], width=width,
               color="#1f6fb4", label="peak allocated")
        if reserved:  # CUDA graphs' pools are reserved, never allocated again: their own bar, beside
            ax.bar([x + width / 2 for x in xs], [(r.peak_reserved_bytes or 0) / 2**30 for r, _ in measured],
                   width=width, color="#9bb7d4", label="peak reserved")
        for i, (r, peak) in enumerate(measured):
            ax.text(i - width / 2 * reserved, peak / 2**30, f"{peak / 2**30:.1f}", ha="center", va="bottom",
                    fontsize=8)
            c = control.get(r.name)
            if c is not None and c.ok and c.peak_memory_bytes:
                ax.hlines(c.peak_memory_bytes / 2**30, i - 0.4, i + 0.4, colors="black", linestyles="dashed",
                          label="fp32 control")
        ax.set_xticks(list(xs), [r.name for r, _ in measured])
        ax.set_ylabel("peak memory, GiB")
        ax.legend(fontsize=8, frameon=False, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        fig.tight_layout()
        parts.append(svg(fig, "memory"))
    else:
        device = saved.environment.device_type
        meters = memory_chart(saved)  # off CUDA: saved activations and the step's resident rise
        parts.append(missing(f"peak memory n/a: this run's device ({device}) does not report peak allocated "
                             "memory (only CUDA does), so results.json holds null rather than an invented number"
                             + ("; measured instead: saved activations, and the step's resident rise in a child "
                                "process." if meters else ".")))
        parts.extend([meters] if meters else [])
    return "\n".join(parts)


def profile_section(saved: Results) -> str:
    """Where the baseline's time goes, and each rung's predicted gain against its measured one."""
    b = saved.profile
    if b is None:
        enabled = saved.config.run.profile.enabled
        return missing("no profile: " + ("this command does not profile." if saved.parallel is not None
                                          or saved.race is not None else
                                          "the run was made with --no-profile." if enabled is False else
                                          "the run stopped before its profile was saved."))
    if b.error:
        return missing(f"the profile failed ({b.error}), so nothing was predicted.")
    cats = b.categories
    fig, (ax, px) = _figure(12, 3.8, ncols=2)
    names = list(cats)
    ax.barh(range(len(names)), [100 * share_of(cats, n) for n in names], color="#1f6fb4")
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.set(xlabel="share of one step, %", title=f"where the baseline's time goes ({b.label})")
    preds = [(r, r.predicted) for r in saved.rungs
             if r.role != Role.CONTROL and r.predicted is not None and r.predicted.speedup is not None and r.built_on]
    if preds:
        xs = range(len(preds))
        px.bar([x - 0.2 for x in xs], [p.speedup for _, p in preds], width=0.4, color=PREDICTED,
               label="predicted ×")
        px.bar([x + 0.2 for x in xs], [r.speedup_prev if r.ok else 0.0 for r, _ in preds], width=0.4,
               color="#1f6fb4", label="measured × (median)")
        px.axhline(1.0, color="#444444", linewidth=0.6, linestyle=":")
        px.set_xticks(list(xs), [r.name for r, _ in preds])
        px.set(ylabel="× the rung built on", title="predicted against measured gain")
        px.legend(fontsize=8, frameon=False)
    else:
        px.set_axis_off()
        px.text(0.5, 0.5, "no rung with a prediction", ha="center", va="center")
    fig.tight_layout()
    cat_table = table(["category", "ms/step", "share"],
                       [[n, f"{ms_of(cats, n):.3f}", f"{100 * share_of(cats, n):.1f}%"] for n in cats],
                       left=("category",))
    pred_rows = [[label(r).lstrip("┊◆★ "), f"{p.speedup:.2f}×",
                  f"{r.speedup_prev:.2f}×" if r.ok else r.status,
                  f"{100 * r.prediction_error:+.0f}%" if r.prediction_error is not None else "—",
                  p.reason] for r, p in preds]
    pred_table = (table(["rung", "predicted ×", "measured ×", "error", "why"], pred_rows, left=("rung", "why"),
                        wrap=("why",))
                  if preds else missing("no rung above the baseline carries a prediction."))
    regime = f"regime: {b.label} — {b.evidence}."
    return "\n".join([f"<p>{esc(regime)}</p>", svg(fig, "profile"),
                      cat_table, pred_table, notes([ln for ln in [roofline_line(saved)] if ln]),
                      *explanation_html(saved)])  # each miss beyond the limit, profiled beside its base


def parallel_section(saved: Results) -> str:
    """Tokens/s against k: predicted floor and overlap-aware, and what was measured."""
    p = saved.parallel
    if p is None:
        return missing("not a data-parallel run: tokens/s against the number of processes k comes from "
                        "`speedladder predict` and `speedladder ddp`.")

    # plot() writes a file (scaling.png for the CLI); the .svg suffix makes matplotlib write SVG instead.
    with tempfile.TemporaryDirectory() as tmp, svg_settings():
        chart = inline_svg(parallel_report.plot(saved, Path(tmp) / "scaling.svg").read_text(), "scaling")
    k_table = table(["k", "predicted floor tok/s", "predicted overlap tok/s", "predicted eff", "measured tok/s"],
                    parallel_report.k_rows(p))
    return "\n".join([chart, k_table, notes(parallel_report.notes(saved))])


def environment_section(saved: Results) -> str:
    """The environment as saved, the corpus, and the resolved configuration folded."""
    env = to_dict(saved.environment)  # every field as saved, in the file's order
    if not any(v is not None for v in env.values()):
        return missing("no environment recorded in this results.json.")
    parts = [kv(env.items())]
    if saved.corpus:
        parts.append("<h3>corpus</h3>" + kv(to_dict(saved.corpus).items()))
    fields = flatten(to_dict(saved.config))
    # Folded (a <details> element opens without any script): long, and the header already names the key values.
    parts.append(f"<details><summary>resolved configuration ({len(fields)} fields)</summary>{kv(fields)}</details>")
    return "\n".join(parts)


def _race(saved: Results) -> str:
    """A race's section: a race's own, or the race tune ran among its finalists."""
    return race_html(saved, saved.race or (saved.tune.race if saved.tune else None))


BUILDERS: dict[str, Callable[[Results], str]] = {
    "rungs": rungs_section, "waterfall": waterfall_section, "race": _race, "loss-curves": loss_section,
    "gates": lambda saved: divergence_html(saved) + gates_html(saved),
    "memory": memory_section, "profile": profile_section, "parallel": parallel_section,
    "environment": environment_section}


def build(saved: Results | dict) -> str:
    """The whole page for saved results: a pure function of them. The sections read the file's own records
    (docs/results.md), as the page is a view of the file; a dict is read into them first."""
    typed = saved if isinstance(saved, Results) else from_dict(Results, saved)
    body = [header(typed), section("summary", "Summary", summary.html(typed))]
    for sid, title in SECTIONS[2:]:
        body.append(section(sid, title, BUILDERS[sid](typed)))
    label_ = model_label(typed.config, typed.model)
    return page(f"speedladder {typed.run_kind.value} · {label_} · {typed.environment.device_name}", body)


def write(results: Results | dict, run_dir: Path) -> Path:
    """report.html beside results.json."""
    path = Path(run_dir) / FILENAME
    path.write_text(build(results), encoding="utf-8")
    return path
