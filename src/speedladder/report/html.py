"""report.html: one self-contained page drawn from a saved results.json alone.

`build(results)` is a pure function from the saved dict to an HTML string; `write` puts it beside
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
from pathlib import Path

from speedladder.records import Results, Role, RungResult, from_dict, to_dict
from speedladder.report import machine, summary
from speedladder.report import parallel as parallel_report
from speedladder.report.common import label, model_label
from speedladder.report.explained import explanation_html
from speedladder.report.gates import divergence_html, gates_html
from speedladder.report.htmlkit import (
    _figure,
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
from speedladder.report.memory import field_of, memory_chart, memory_fields
from speedladder.report.profile import roofline_line
from speedladder.report.race_charts import race_figure, race_html
from speedladder.report.text import NOT_BUILT_UPON
from speedladder.report.text import notes as text_notes
from speedladder.report.text import rows as text_rows
from speedladder.report.tune import tune_lines
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


# -- what kind of run ------------------------------------------------------------------------------

def kind(results: dict) -> str:
    """run, tune, race, predict or ddp: which command wrote the file."""
    if results.get("parallel"):
        return results["parallel"]["command"]
    if results.get("race"):
        return "race"
    if results.get("tune"):
        return "tune"
    return "run"


def _ok(r: dict) -> bool:
    return r.get("status") == "ok"


# -- sections -------------------------------------------------------------------------------------

def header(results: dict) -> str:
    typed = _typed(results)
    e, c = results.get("environment") or {}, typed.config
    model = results.get("model") or {}
    corpus = results.get("corpus") or {}
    command = results.get("command")
    cuda = e.get("cuda") or "none (a CPU build of torch)"
    pairs = [
        ("command", shlex.join(command) if isinstance(command, list) else command),
        ("kind", kind(results)), ("status", results.get("status")),
        ("model", f"{model_label(c, model)} · {model.get('params', 0):,} parameters"
                  + (f" · {model['convention_means']}; FLOPs {model['flops_method']}; dropout {model['dropout']}"
                     if "convention_means" in model else "")),
        ("shape", f"B={c.batch_size} T={c.seq_len} (batch-up ×{c.batch_multiplier})"),
        ("recipe", c.run.recipe.describe() + (f"; schedule: {results['schedule']}" if results.get("schedule") else "")),
        ("corpus", f"{corpus.get('source')} · {corpus.get('tokenizer')} tokenizer · {corpus.get('tokens', 0):,} tokens"),
        ("device", f"{e.get('device_name')} ({e.get('device')})" + (
            f" · {c.run.threads} threads (--threads)" if c.run.threads is not None else "")),
        ("torch / CUDA", f"{e.get('torch')} / {cuda}"),
        ("date", f"{results.get('created')} (last written {results.get('updated')})"),
        ("git commit", e.get("git_commit") or "unknown (not run from a speedladder checkout)"),
    ]
    load = machine.html_value(typed)  # other processes before and during the windows, when read
    if load is not None:
        pairs.append(("machine", load))
    title = f"speedladder {kind(results)} · {model_label(c, model)} on {e.get('device_name')}"
    shared = machine.header_line(typed)  # said where the reader starts, as the console says it first
    warning = f'<p class="missing" id="machine-not-alone">{esc(shared)}</p>\n' if shared else ""
    return f'<header id="header">\n<h1>{esc(title)}</h1>\n{warning}{kv(pairs)}\n</header>'


def rungs_section(results: dict) -> str:
    recs = results.get("rungs") or []
    if not recs:
        p = results.get("parallel")
        why = ("no ladder in a race: its configurations, times to the target and p-values are in the race section."
               if results.get("race") else
               f"no ladder in this {p['command']} run: it measures one configuration "
               f"({'+'.join(p['rungs'])}); see the data-parallel section." if p else
               "no rung was recorded: the run stopped before its first rung.")
        return missing(why)
    rows = text_rows(_typed(results))
    headers = list(rows[0])
    classes, attrs = [], []
    for r, row in zip(recs, rows):
        cls = []
        if r["name"] == results.get("fastest"):
            cls.append("fastest")
        if r["status"] in _NOT_RUN_STATUSES:
            cls.append("not-run")
        if row["gate"] == "FAIL":
            cls.append("gate-fail")
        classes.append(" ".join(cls))
        verdict = r.get("verdict") if _ok(r) else None
        colour = CONTROL_COLOUR if verdict == "control" else COLOURS.get(verdict or "")
        a = {headers.index("gate"): ("gate", "")}
        if colour:
            a[headers.index("verdict")] = ("verdict", f"background:{colour}")
        attrs.append(a)
    rung_table = table(headers, [list(r.values()) for r in rows], left=("rung", "gate", "verdict", NOT_BUILT_UPON),
                       row_classes=classes, cell_attrs=attrs)
    legend = ("verdict colours as in the waterfall: " + ", ".join(
        f'<span style="color:{c}">■</span> {esc(k)}' for k, c in COLOURS.items()))
    return f"{rung_table}\n<p>{legend}</p>\n{notes(text_notes(_typed(results)))}\n{notes(tune_lines(_typed(results)))}"


def waterfall_section(results: dict) -> str:
    if results.get("race"):
        return svg(race_figure(_typed(results)), "waterfall")
    recs = results.get("rungs") or []
    if not any(_ok(r) for r in recs if r["role"] in (Role.RUNG, Role.BESIDE)):
        why = ("no waterfall for a data-parallel run: see tokens/s against k below." if results.get("parallel")
               else "no rung was measured, so there is no bar to draw.")
        return missing(why)
    return svg(waterfall_figure(_typed(results)), "waterfall")


def _numbers(value: object) -> list[float] | None:
    """A curve: a list of at least two numbers (null points of a diverged loss kept as gaps)."""
    if isinstance(value, list) and len(value) > 1 and all(v is None or isinstance(v, (int, float)) for v in value):
        return [math.nan if v is None else float(v) for v in value]
    return None


def learns_curves(lc: dict | None) -> list[tuple[str, list[float]]]:
    """Every loss curve under learns_check, wherever it sits: the checked rung's own, and any other (an eager one)."""
    out: list[tuple[str, list[float]]] = []

    def walk(d: dict, path: str) -> None:
        for key, value in d.items():
            curve = _numbers(value)
            name = f"{path}{key}" if path else key
            if curve is not None:
                # The checked rung's own curve is named by its rung; another by where it sits ("eager").
                label = (d.get("rung") or path.rstrip(".") or "learns-check") if key == "losses" \
                    else name.removesuffix("_losses")
                out.append((label, curve))
            elif isinstance(value, dict):
                walk(value, f"{name}.")

    if lc:
        walk(lc, "")
    return out


def loss_section(results: dict) -> str:
    if results.get("race"):
        return missing("no loss-band or learns-check curves in a race: its val-loss curves, against time and against "
                       "tokens, are in the race section.")
    recs = results.get("rungs") or []
    gated = [(r, r["gate"]["loss_band"]) for r in recs if _ok(r) and (r.get("gate") or {}).get("loss_band")
             and _numbers(r["gate"]["loss_band"].get("losses")) and _numbers(r["gate"]["loss_band"].get("ref_losses"))]
    parts = []
    if gated:
        fig, (ax, dx) = _figure(12, 4.2, ncols=2)
        refs_drawn: list[tuple[float, ...]] = []  # one eager fp32 reference per batch shape
        for r, band in gated:
            ref = _numbers(band["ref_losses"]) or []
            if tuple(ref) not in refs_drawn:
                refs_drawn.append(tuple(ref))
                ax.plot(range(1, len(ref) + 1), ref, color="black", linewidth=1.2,
                        linestyle=REF_STYLES[(len(refs_drawn) - 1) % len(REF_STYLES)],
                        label=f"eager fp32, B={r['spec']['batch_size']}")
            losses = _numbers(band["losses"]) or []
            line, = ax.plot(range(1, len(losses) + 1), losses, linewidth=1, label=r["name"])
            rel = [(a - b) / b if b else math.nan for a, b in zip(losses, ref)]
            dx.plot(range(1, len(rel) + 1), rel, color=line.get_color(), linewidth=1, label=r["name"])
        band_width = gated[0][1]["band"]
        dx.axhspan(-band_width, band_width, color="#2ca02c", alpha=0.08, label=f"band ±{band_width:g}")
        ax.set(xlabel="step (the same batches for every rung)", ylabel="training loss",
               title="each rung's loss over eager fp32's")
        dx.set(xlabel="step", ylabel="relative difference from eager fp32", title="loss band gate")
        ax.legend(fontsize=8, frameon=False)
        dx.legend(fontsize=8, frameon=False)
        fig.tight_layout()
        parts.append(svg(fig, "loss-band"))
        parts.append(table(["rung", "steps", "max rel diff", "band", "passed"],
                            [[r["name"], str(b["steps"]), f"{b['max_rel_diff']:.2e}", f"{b['band']:g}",
                              "yes" if b["passed"] else "NO"] for r, b in gated], left=("rung", "passed")))
    else:
        parts.append(missing("no loss-band curves: only eager fp32 itself ran, or no rung reached its gates "
                              "(see the rung table)" if recs else "no loss-band curves: no ladder in this run."))
    lc = results.get("learns_check")
    curves = learns_curves(lc)
    if curves:
        fig, (ax,) = _figure(7, 3.8)
        for label, curve in curves:
            ax.plot(range(1, len(curve) + 1), curve, linewidth=1, label=label)
        ax.set(xlabel="step", ylabel="training loss", title="learns-check")
        ax.legend(fontsize=8, frameon=False)
        fig.tight_layout()
        parts.append(svg(fig, "learns"))
    else:
        why = (f"learns-check skipped ({lc['detail']})." if lc and lc.get("skipped") else
               f"learns-check failed before any loss was recorded: {lc.get('detail')}" if lc else
               "no learns-check in this run.")
        parts.append(missing(why))
    return "\n".join(parts)


def memory_section(results: dict) -> str:
    recs = results.get("rungs") or []
    if not recs:
        return missing("no per-rung memory: a race measures time to a loss, not memory." if results.get("race") else
                       "no per-rung memory: no ladder in this run.")
    main = [r for r in recs if r["role"] != Role.CONTROL]
    control = {r["rung"]: r for r in recs if r["role"] == Role.CONTROL}
    extra = memory_fields(recs)
    headers = ["rung", "status", "peak memory", "fp32 control peak", *extra]
    rows = []
    for r in main:
        c = control.get(r["name"])
        rows.append([r["name"], r["status"], human_bytes(r.get("peak_memory_bytes")),
                     "—" if c is None else human_bytes(c["peak_memory_bytes"]) if _ok(c) else c["status"],
                     *(human_bytes(v) if isinstance(v := field_of(r, k), (int, float)) else "n/a" for k in extra)])
    parts = [table(headers, rows, left=("rung", "status"))]
    measured = [r for r in main if _ok(r) and r.get("peak_memory_bytes")]
    if measured:
        fig, (ax,) = _figure(max(5.0, 1.1 * len(measured) + 2), 3.6)
        xs = range(len(measured))
        ax.bar(xs, [r["peak_memory_bytes"] / 2**30 for r in measured], width=0.6, color="#1f6fb4", label="peak")
        for i, r in enumerate(measured):
            c = control.get(r["name"])
            if c is not None and _ok(c) and c.get("peak_memory_bytes"):
                ax.hlines(c["peak_memory_bytes"] / 2**30, i - 0.4, i + 0.4, colors="black", linestyles="dashed",
                          label="fp32 control")
        ax.set_xticks(list(xs), [r["name"] for r in measured])
        ax.set_ylabel("peak memory, GiB")
        ax.legend(fontsize=8, frameon=False)
        fig.tight_layout()
        parts.append(svg(fig, "memory"))
    else:
        device = (results.get("environment") or {}).get("device_type")
        meters = memory_chart(_typed(results))  # off CUDA: saved activations and the step's resident rise
        parts.append(missing(f"peak memory n/a: this run's device ({device}) does not report peak allocated "
                             "memory (only CUDA does), so results.json holds null rather than an invented number"
                             + ("; measured instead: saved activations, and the step's resident rise in a child "
                                "process." if meters else ".")))
        parts.extend([meters] if meters else [])
    return "\n".join(parts)


def profile_section(results: dict) -> str:
    b = results.get("profile")
    if not b:
        enabled = ((results.get("config") or {}).get("profile") or {}).get("enabled")
        return missing("no profile: " + ("this command does not profile." if results.get("parallel")
                                          or results.get("race") else
                                          "the run was made with --no-profile." if enabled is False else
                                          "the run stopped before its profile was saved."))
    if b.get("error"):
        return missing(f"the profile failed ({b['error']}), so nothing was predicted.")
    cats = b["categories"]
    fig, (ax, px) = _figure(12, 3.8, ncols=2)
    names = list(cats)
    ax.barh(range(len(names)), [100 * cats[n]["share"] for n in names], color="#1f6fb4")
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.set(xlabel="share of one step, %", title=f"where the baseline's time goes ({b.get('regime_label') or b['regime']})")
    preds = [r for r in results.get("rungs") or []
             if r["role"] != Role.CONTROL and (r.get("predicted") or {}).get("speedup") is not None and r.get("built_on")]
    if preds:
        xs = range(len(preds))
        px.bar([x - 0.2 for x in xs], [r["predicted"]["speedup"] for r in preds], width=0.4, color=PREDICTED,
               label="predicted ×")
        px.bar([x + 0.2 for x in xs], [r["speedup_prev"] if _ok(r) else 0.0 for r in preds], width=0.4,
               color="#1f6fb4", label="measured × (median)")
        px.axhline(1.0, color="#444444", linewidth=0.6, linestyle=":")
        px.set_xticks(list(xs), [r["name"] for r in preds])
        px.set(ylabel="× the rung built on", title="predicted against measured gain")
        px.legend(fontsize=8, frameon=False)
    else:
        px.set_axis_off()
        px.text(0.5, 0.5, "no rung with a prediction", ha="center", va="center")
    fig.tight_layout()
    cat_table = table(["category", "ms/step", "share"],
                       [[n, f"{v['ms']:.3f}", f"{100 * v['share']:.1f}%"] for n, v in cats.items()], left=("category",))
    pred_rows = [[label(from_dict(RungResult, r)).lstrip("┊◆★ "), f"{r['predicted']['speedup']:.2f}×",
                  f"{r['speedup_prev']:.2f}×" if _ok(r) else r["status"],
                  f"{100 * r['prediction_error']:+.0f}%" if r.get("prediction_error") is not None else "—",
                  r["predicted"]["reason"]] for r in preds]
    pred_table = (table(["rung", "predicted ×", "measured ×", "error", "why"], pred_rows, left=("rung", "why"),
                        wrap=("why",))
                  if preds else missing("no rung above the baseline carries a prediction."))
    regime = f"regime: {b.get('regime_label') or b['regime']} — {b['evidence']}."
    return "\n".join([f"<p>{esc(regime)}</p>", svg(fig, "profile"),
                      cat_table, pred_table, notes([ln for ln in [roofline_line(_typed(results))] if ln]),
                      *explanation_html(_typed(results))])  # each miss beyond the limit, profiled beside its base


def parallel_section(results: dict) -> str:
    p = results.get("parallel")
    if not p:
        return missing("not a data-parallel run: tokens/s against the number of processes k comes from "
                        "`speedladder predict` and `speedladder ddp`.")

    # plot() writes a file (scaling.png for the CLI); the .svg suffix makes matplotlib write SVG instead.
    with tempfile.TemporaryDirectory() as tmp, svg_settings():
        chart = inline_svg(parallel_report.plot(_typed(results), Path(tmp) / "scaling.svg").read_text(), "scaling")
    m = p.get("measured")
    rows = []
    for r in p["predictions"]:
        meas = ""
        if m and r["k"] == m["k"]:
            t = m["tokens_per_s"]
            meas = f"{t['median']:,.0f} ({t['min']:,.0f}–{t['max']:,.0f})"
        elif r["k"] == 1 and p.get("single"):
            meas = f"{p['single']['tokens_per_s']['median']:,.0f}"
        rows.append([str(r["k"]), f"{r['floor_tokens_per_s']:,.0f}", f"{r['overlap_tokens_per_s']:,.0f}",
                     f"{100 * r['overlap_efficiency']:.0f}%", meas or "—"])
    k_table = table(["k", "predicted floor tok/s", "predicted overlap tok/s", "predicted eff", "measured tok/s"], rows)
    return "\n".join([chart, k_table, notes(parallel_report.notes(_typed(results)))])


def environment_section(results: dict) -> str:
    env = results.get("environment")
    if not env:
        return missing("no environment recorded in this results.json.")
    parts = [kv(env.items())]
    if results.get("corpus"):
        parts.append("<h3>corpus</h3>" + kv(results["corpus"].items()))
    if results.get("config"):
        fields = flatten(results["config"])
        # Folded (a <details> element opens without any script): long, and the header already names the key values.
        parts.append(f"<details><summary>resolved configuration ({len(fields)} fields)</summary>{kv(fields)}</details>")
    return "\n".join(parts)


BUILDERS = {"rungs": rungs_section, "waterfall": waterfall_section,
            "race": lambda results: _race(_typed(results)), "loss-curves": loss_section,
            "gates": lambda results: divergence_html(_typed(results)) + gates_html(_typed(results)),
            "memory": memory_section, "profile": profile_section, "parallel": parallel_section,
            "environment": environment_section}


def _race(typed: Results) -> str:
    """A race's section: a race's own, or the race tune ran among its finalists."""
    return race_html(typed, typed.race or (typed.tune.race if typed.tune else None))


def _typed(results: dict) -> Results:
    """The records of the saved dict, for the reports that read records (table, notes, waterfall)."""
    return from_dict(Results, results)


def build(saved: Results | dict) -> str:
    """The whole page for saved results: a pure function of them. The sections read the file's own fields
    (docs/results.md), as the page is a view of the file."""
    results = saved if isinstance(saved, dict) else to_dict(saved)
    body = [header(results), section("summary", "Summary", summary.html(_typed(results)))]
    for sid, title in SECTIONS[2:]:
        body.append(section(sid, title, BUILDERS[sid](results)))
    label_ = model_label(_typed(results).config, results.get("model"))
    e = results.get("environment") or {}
    return page(f"speedladder {kind(results)} · {label_} · {e.get('device_name')}", body)


def write(results: Results | dict, run_dir: Path) -> Path:
    """report.html beside results.json."""
    path = Path(run_dir) / FILENAME
    path.write_text(build(results), encoding="utf-8")
    return path
