"""The table, the notes and the waterfall: drawn from a saved results.json alone."""

from __future__ import annotations

import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

WATERFALL = "waterfall.png"

COLOURS = {"baseline": "#8c8c8c", "win": "#1f6fb4", "loss": "#d62728", "noise": "#9bb7d4"}
PREDICTED = "#ff7f0e"
STATUS_LABEL = {"skipped": "skipped", "oom": "OOM", "error": "error", "interrupted": "interrupted",
                "pending": "interrupted"}


def gib(n: int | None) -> str:
    return "n/a" if n is None else f"{n / 2**30:.2f} GiB"


def _x(v: float | None) -> str:
    return "—" if v is None else f"{v:.2f}×"


def _gate(r: dict) -> str:
    gate = r.get("gate")
    if r["status"] != "ok" or gate is None:
        return "—"
    if gate.get("reference"):
        return "ref"
    return "pass" if gate["passed"] else "FAIL"


def _compile(r: dict) -> str:
    if r["compile_s"] is None:
        return "—"
    return f"{r['compile_s']:.1f}" + (" (cache)" if r["timing"].get("cache_hits") else "")


def label(r: dict) -> str:
    if r["role"] == "control":
        return f"└ {r['rung']} fp32 control"
    if r["role"] == "beside" and r["status"] == "ok":
        return f"┊ {r['name']} beside {r['built_on'] or 'the top'}"
    if r["role"] == "candidate":
        return f"◆ {r['name']}"
    return r["name"]


def rows(results: dict) -> list[dict[str, str]]:
    """One row of display strings per rung or control, in ladder order."""
    out = []
    for r in results["rungs"]:
        label_ = label(r)
        pred = (r.get("predicted") or {}).get("speedup")
        row = {"rung": label_, "tokens/s": "—", "min–max": "—", "× prev": "—", "pred ×": _x(pred), "err": "—",
               "× cum": "—", "step ms": "—",
               "peak mem": "—", "MFU": "—", "TFLOP/s": "—", "compile s": "—", "gate": _gate(r),
               "verdict": STATUS_LABEL.get(r["status"], "")}
        if r["status"] == "ok":
            t = r["tokens_per_s"]
            row.update({
                "tokens/s": f"{t['median']:,.0f}", "min–max": f"{t['min']:,.0f}–{t['max']:,.0f}",
                "× prev": _x(r["speedup_prev"]), "× cum": _x(r["speedup_cum"]),
                "err": "—" if r.get("prediction_error") is None else f"{100 * r['prediction_error']:+.0f}%",
                "step ms": f"{r['step_ms']:.1f}", "peak mem": gib(r["peak_memory_bytes"]),
                "MFU": "n/a" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%",
                "TFLOP/s": f"{r['tflops']:.2f}" if r["tflops"] >= 0.1 else f"{r['tflops']:.3f}",
                "compile s": _compile(r),
                "verdict": r["verdict"] if r["gate"]["passed"] else f"failed ({r['verdict']})",
            })
        out.append(row)
    return out


def title(results: dict) -> str:
    c, e = results["config"], results["environment"]
    return (f"speedladder · {c['preset']} on {e['device_name']} ({e['device_type']}) · "
            f"{results['corpus']['source']} · B={c['batch_size']} T={c['seq_len']} · torch {e['torch']}")


def table(results: dict) -> Table:
    t = Table(title=escape(title(results)), title_justify="left")
    data = rows(results)
    for col in data[0] if data else ["rung"]:
        t.add_column(col, justify="left" if col in ("rung", "gate", "verdict") else "right", no_wrap=True)
    for r, row in zip(results["rungs"], data):
        style = "bold" if r["name"] == results.get("fastest") else None
        t.add_row(*(escape(v) for v in row.values()), style=style)
    return t


def _control_note(rung: dict, control: dict) -> str:
    b = rung["spec"]["batch_size"]
    if control["status"] == "oom":
        return f"fp32 at B={b} ran out of memory: bf16 bought the headroom for this batch."
    if control["status"] != "ok":
        return f"fp32 control at B={b}: {control['status']} ({control['detail']})."
    ratio = rung["tokens_per_s"]["median"] / control["tokens_per_s"]["median"]
    text = (f"at B={b}, {rung['precision']} runs {ratio:.2f}× the fp32 control's tokens/s "
            f"({rung['tokens_per_s']['median']:,.0f} vs {control['tokens_per_s']['median']:,.0f})")
    if rung["peak_memory_bytes"] and control["peak_memory_bytes"]:
        text += (f", peak memory {gib(rung['peak_memory_bytes'])} vs {gib(control['peak_memory_bytes'])} "
                 f"({control['peak_memory_bytes'] / rung['peak_memory_bytes']:.2f}× more in fp32)")
    return text + "."


def _rung_notes(r: dict, by_name: dict[str, dict]) -> list[str]:
    """What a rung of the ladder beyond needs said beside its row."""
    out = []
    if r["role"] == "beside" and r["status"] == "ok":
        out.append(f"{r['name']}: measured beside {r['built_on'] or 'the top'}, the top of the ladder, "
                   f"and not built upon ({r['kind']} rung).")
    base = by_name.get(r.get("built_on") or "")
    opt = (r.get("spec") or {}).get("optimizer")
    if r["status"] == "ok" and opt and base is not None and opt != (base.get("spec") or {}).get("optimizer"):
        out.append(f"{r['name']}: optimizer {opt}.")
    gate = r.get("gate") or {}
    band = gate.get("loss_band") or {}
    if band.get("applies") is False:
        out.append(f"{r['name']}: loss band {band['detail']}.")
    t = gate.get("tokens_to_target")
    if t:
        ours = "never" if t["tokens"] is None else f"{t['tokens']:,} tokens"
        theirs = "never" if t["adamw_tokens"] is None else f"{t['adamw_tokens']:,} tokens"
        out.append(f"{r['name']}: to reach AdamW's loss {t['target_loss']:.3f} over the same {t['steps']} batches: "
                   f"{ours} vs AdamW {theirs}" + (f" ({t['token_ratio']:.2f}× fewer)" if t["token_ratio"] else "")
                   + f"; tokens/s {r['tokens_per_s']['median']:,.0f}.")
    return out


def notes(results: dict) -> list[str]:
    """Plain sentences under the table: what was skipped and why, gates, controls, learns-check, winner."""
    out = []
    c = results["config"]
    if c.get("preset_note"):
        out.append(c["preset_note"] + ".")
    by_name = {r["name"]: r for r in results["rungs"]}
    for r in results["rungs"]:
        if r["status"] != "ok":
            out.append(f"{r['name']}: {STATUS_LABEL.get(r['status'], r['status'])} — {r['detail']}")
        elif not r["gate"]["passed"]:
            out.append(f"{r['name']}: gate failed — {r['gate']['detail']}")
        for w in r.get("warnings") or []:
            out.append(f"{r['name']}: warning — {w}")
        out.extend(_rung_notes(r, by_name))
        if r["role"] == "control":
            out.append(f"{r['rung']}: " + _control_note(by_name[r["rung"]], r))
    ok = [r for r in results["rungs"] if r["status"] == "ok"]
    if any(r["compile_s"] is not None and r["timing"].get("cache_hits") for r in ok):
        out.append("compile s marked (cache): graphs came from the compile caches of an earlier run; "
                   "a cold compile takes longer.")
    if ok and all(r["mfu"] is None for r in ok):
        out.append("MFU n/a: no peak FLOP/s is known for this device; --peak-tflops sets one.")
    lc = results.get("learns_check")
    if lc and lc.get("skipped"):
        out.append(f"learns-check skipped ({lc['detail']}).")
    elif lc and "drop" in lc:
        out.append(f"learns-check ({lc['rung']}, {lc['steps']} steps): loss {lc['first_loss']:.3f} → "
                   f"{lc['final_loss']:.3f} ({-100 * lc['drop']:.0f}%): {'passed' if lc['passed'] else 'FAILED'}.")
    elif lc:
        out.append(f"learns-check ({lc['rung']}): FAILED — {lc['detail']}")
    out.extend(profile_notes(results))
    fastest = results.get("fastest")
    if fastest:
        f = by_name[fastest]
        base = next(r["name"] for r in results["rungs"] if r["role"] == "rung" and r["status"] == "ok")
        out.append(f"fastest rung that passed every gate: {fastest}, {f['speedup_cum']:.2f}× {base} "
                   f"({f['tokens_per_s']['median']:,.0f} tokens/s).")
    elif results.get("status") == "complete":
        out.append("no rung passed every gate.")
    if results.get("status") == "interrupted":
        out.append("run interrupted: the rungs above were measured before the stop.")
    return out


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def category_line(b: dict) -> str:
    return ", ".join(f"{c} {_pct(v['share'])}" for c, v in b["categories"].items() if v["share"] >= 0.005)


def roofline_line(results: dict) -> str | None:
    """Each measured rung's achieved TFLOP/s against a peak: the datasheet's, else the ceiling measured here."""
    b = results.get("profile") or {}
    ceiling = (b.get("matmuls") or {}).get("ceiling_tflops") or {}
    parts = []
    for r in results["rungs"]:
        if r["status"] != "ok" or r["role"] == "control":
            continue
        if r.get("peak_tflops"):
            parts.append(f"{r['name']} {r['tflops']:.3g} of {r['peak_tflops']:.0f} datasheet ({_pct(r['mfu'])})")
        elif ceiling.get(r["precision"] if r["precision"] != "tf32" else "fp32"):
            c = ceiling[r["precision"] if r["precision"] != "tf32" else "fp32"]
            parts.append(f"{r['name']} {r['tflops']:.3g} of {c:.3g} ({_pct(r['tflops'] / c)})")
    if not parts:
        return None
    source = ("datasheet peak" if any(r.get("peak_tflops") for r in results["rungs"]) else
              f"the {b.get('matmuls', {}).get('ceiling_n')}³ matmul ceiling measured here at the rung's precision")
    return f"roofline, achieved TFLOP/s of {source}: " + "; ".join(parts) + "."


def profile_notes(results: dict) -> list[str]:
    """The profile's verdict and each prediction against its measurement."""
    b = results.get("profile")
    if not b:
        return []
    if "error" in b:
        return [f"profile: failed ({b['error']}); no predictions."]
    out = [f"profile of the baseline ({b['steps']} steps, {b['time_basis']}): {category_line(b)}.",
           f"regime: {b['regime']} — {b['evidence']}."]
    mem = b.get("memory_gbps")
    if mem:
        out.append(f"memory-bound operators moved {mem:.1f} GB/s (counted from shapes for "
                   f"{_pct(b['memory_counted_share'])} of their time); a large copy runs at {b['copy_gbps']:.1f} GB/s "
                   "here.")
    line = roofline_line(results)
    if line:
        out.append(line)
    for r in results["rungs"]:
        p = r.get("predicted")
        if r["role"] == "control" or not p or p.get("speedup") is None or r.get("built_on") is None:
            continue
        measured = "not measured" if r["status"] != "ok" else (
            f"measured {r['speedup_prev']:.2f}× ({100 * r['prediction_error']:+.0f}%)")
        out.append(f"predicted {label(r).lstrip('┊◆ ')}: {p['reason']}; {measured}.")
    return out


def print_profile(saved: dict, console: Console | None = None) -> None:
    """`speedladder profile`'s output: top operators, categories, regime, roofline, predictions."""
    console = console or Console(highlight=False, width=None if sys.stdout.isatty() else 160)
    b = saved["profile"]
    spec = b["spec"]
    console.print(escape(f"speedladder profile · {saved['config']['preset']} on "
                         f"{saved['environment']['device_name']} · B={spec['batch_size']} T={spec['seq_len']} · "
                         f"{'+'.join(b['rungs']) or 'baseline (eager fp32)'} · {b['steps']} steps"))
    console.print(escape(f"top operators by {'CUDA' if b['device_type'] == 'cuda' else 'CPU'} self time "
                         "(torch.profiler, all profiled steps):"))
    console.print(escape(b["top_table"].rstrip()), soft_wrap=True)
    t = Table(title=escape(f"one step, {b['wall_step_ms']:.2f} ms under the profiler: {b['time_basis']}"),
              title_justify="left")
    for col in ("category", "ms/step", "share", "of which per-op floor"):
        t.add_column(col, justify="left" if col == "category" else "right")
    for c, v in b["categories"].items():
        t.add_row(escape(c), f"{v['ms']:.3f}", _pct(v["share"]), f"{v['floor_ms']:.3f}" if v["floor_ms"] else "—")
    t.add_row("total", f"{sum(v['ms'] for v in b['categories'].values()):.3f}",
              _pct(sum(v["share"] for v in b["categories"].values())), "")
    console.print(t)
    console.print(escape(f"regime: {b['regime']} — {b['evidence']}"), soft_wrap=True)
    m = b.get("matmuls") or {}
    ceil = m.get("ceiling_tflops") or {}
    facts = [(f"measured here: {m.get('ceiling_n')}³ matmul {ceil.get('fp32', 0):.3g} TFLOP/s fp32, "
              f"{ceil.get('bf16', 0):.3g} bf16")]
    if b.get("matmul_tflops"):
        facts.append(f"the step's matmuls achieved {b['matmul_tflops']:.3g} TFLOP/s")
    if m.get("bf16_speedup"):
        facts.append(f"bf16 runs this model's matmuls at {m['bf16_speedup']:.2f}× their fp32 speed")
    gain = (m.get("batch_gain") or {}).get("fp32")
    if gain:
        facts.append(f"{gain:.2f}× as efficient at {m['multiplier']}× the batch (fp32)")
    if b.get("memory_gbps"):
        facts.append(f"memory-bound ops {b['memory_gbps']:.1f} GB/s vs a large copy's {b['copy_gbps']:.1f} GB/s")
    console.print(escape("roofline: " + "; ".join(facts) + "."), soft_wrap=True)
    t = Table(title="predictions (each on the rung before it)", title_justify="left")
    for col in ("rung", "pred ×", "why"):
        t.add_column(col, justify="right" if col == "pred ×" else "left")
    for p in saved.get("predictions") or []:
        t.add_row(escape(p["rung"]), _x(p["speedup"]), escape(p["reason"]))
    console.print(t)


def print_report(results: dict, console: Console | None = None) -> None:
    # Wide enough for every column when the output is piped to a file (rich would assume 80).
    console = console or Console(highlight=False, width=None if sys.stdout.isatty() else 160)
    console.print(table(results))
    for line in notes(results):
        console.print(escape(line), soft_wrap=True)


def waterfall(results: dict, path: Path) -> Path:
    """Draw the waterfall of a results dict into a PNG file."""
    import matplotlib.pyplot as plt

    fig = waterfall_figure(results)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def waterfall_figure(results: dict):
    """One bar per rung from the level it built on to its own cumulative ×; colour by verdict."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    rungs = [r for r in results["rungs"] if r["role"] in ("rung", "beside")]
    by_name = {r["name"]: r for r in results["rungs"]}
    ok = [r for r in results["rungs"] if r["status"] == "ok"]
    top = max([r["tokens_per_s"]["max"] / _baseline_median(results) for r in ok]
              + [_predicted_level(r, by_name) or 0.0 for r in rungs if r["status"] == "ok"] + [1.0])
    fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * len(rungs) + 2), 4.8))
    for i, r in enumerate(rungs):
        if r["status"] != "ok":
            ax.text(i, 0.05 * top, STATUS_LABEL.get(r["status"], r["status"]), rotation=90, ha="center",
                    va="bottom", color="#555555", fontsize=9)
            continue
        level = r["speedup_cum"]
        start = by_name[r["built_on"]]["speedup_cum"] if r["built_on"] else 0.0
        verdict = r["verdict"]
        failed = not r["gate"]["passed"]
        lo, hi = sorted((start, level))
        ax.bar(i, hi - lo, bottom=lo, width=0.6, color=COLOURS.get(verdict, "#cccccc"),
               hatch="///" if failed else None, edgecolor="black" if failed else "none", linewidth=0.8,
               gid=r["name"])
        base_med = _baseline_median(results)
        ax.errorbar(i, level, yerr=[[level - r["tokens_per_s"]["min"] / base_med],
                                    [r["tokens_per_s"]["max"] / base_med - level]],
                    color="black", capsize=3, linewidth=1)
        label = f"{level:.2f}×"
        if r["peak_memory_bytes"] is not None:
            label += f"\n{gib(r['peak_memory_bytes'])}"
        ax.text(i, hi + 0.03 * top, label, ha="center", va="bottom", fontsize=9)
        pred_level = _predicted_level(r, by_name)
        if pred_level is not None:
            ax.plot([i - 0.3, i + 0.3], [pred_level] * 2, color=PREDICTED, linewidth=2.5,
                    solid_capstyle="butt", gid=f"predicted-{r['name']}")
        control = next((c for c in results["rungs"] if c["role"] == "control" and c["rung"] == r["name"]), None)
        if control is not None and control["status"] == "ok":
            ax.hlines(control["speedup_cum"], i - 0.4, i + 0.4, colors="black", linestyles="dashed", linewidth=1)
            ax.text(i + 0.42, control["speedup_cum"], "fp32\ncontrol", fontsize=7, va="center")
    ax.axhline(1.0, color="#444444", linewidth=0.6, linestyle=":")
    ax.set_xticks(range(len(rungs)), [r["name"] + ("\n(beside)" if r["role"] == "beside" else "") for r in rungs])
    ax.set_xlim(-0.6, len(rungs) - 0.2)
    ax.set_ylim(0, top * 1.3)
    ax.set_ylabel("cumulative speed-up (× baseline tokens/s)")
    c, e = results["config"], results["environment"]
    ax.set_title(f"{c['preset']} · B={c['batch_size']} T={c['seq_len']} · {e['device_name']}", fontsize=10)
    handles = [Patch(color=COLOURS[k], label=k) for k in ("baseline", "win", "noise", "loss")]
    handles.append(Patch(facecolor="white", edgecolor="black", hatch="///", label="failed a gate"))
    if any((r.get("predicted") or {}).get("speedup") for r in rungs):
        handles.append(Line2D([], [], color=PREDICTED, linewidth=2.5, label="predicted"))
    ax.legend(handles=handles, loc="upper left", fontsize=8, frameon=False)
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    return fig


def _predicted_level(r: dict, by_name: dict[str, dict]) -> float | None:
    """Where the bar would end if the prediction were right: the level it built on times the predicted ×."""
    pred = (r.get("predicted") or {}).get("speedup")
    if pred is None or not r.get("built_on"):
        return None
    return by_name[r["built_on"]]["speedup_cum"] * pred


def _baseline_median(results: dict) -> float:
    for r in results["rungs"]:
        if r["role"] == "rung" and r["status"] == "ok":
            return r["tokens_per_s"]["median"]
    return 1.0


def tune_lines(results: dict) -> list[str]:
    """tune's outcome in sentences: survivors, dropped rungs, candidates, the winner and its commands."""
    t = results.get("tune")
    if not t:
        return []
    out = []
    if "survivors" in t:
        out.append(f"tune: survivors (won their rung, passed every gate): {', '.join(t['survivors']) or 'none'}.")
        for name, why in t.get("dropped", {}).items():
            out.append(f"tune: dropped {name} — {why}")
        for c in t.get("candidates", []):
            if c.get("same_as"):
                out.append(f"tune: {c['name']} ({'+'.join(c['rungs'])}) is the configuration of {c['same_as']}, "
                           "already measured.")
    else:
        out.append("tune: stopped before the survivors were combined.")
    if t.get("winner"):
        out.append(f"tune: winner {t['winner']}: eager + {' + '.join(t['winner_rungs']) or 'nothing'}.")
        out.append(f"measure it: {t['commands']['run']}")
        out.append(f"train it:   {t['commands']['train']}")
        out.append(f"       or:  {t['commands']['train_rungs']}")
    else:
        out.append("tune: no configuration passed every gate.")
    if "seconds" in t:
        out.append(f"tune: {t['seconds']:.0f} s of a {t.get('budget_minutes', '?')}-minute "
                   "budget.")
    return out


def winner_table(results: dict) -> Table | None:
    """The winning configuration, field by field."""
    t = results.get("tune") or {}
    spec = t.get("winner_spec")
    if not spec:
        return None
    by_name = {r["name"]: r for r in results["rungs"]}
    w = by_name[t["winner"]]
    table = Table(title="tune: the winning configuration", title_justify="left")
    table.add_column("field", no_wrap=True)
    table.add_column("value")
    tps = w["tokens_per_s"]
    compiled = "no" if not spec["compile"] else (spec.get("compile_mode") or "default")
    rows_ = [("rungs", ",".join(["eager", *t["winner_rungs"]])),
             ("batch × length", f"{spec['batch_size']} × {spec['seq_len']}"),
             ("compile", compiled), ("precision", w["precision"]), ("optimizer", spec.get("optimizer", "adamw")),
             ("model transforms", ", ".join(spec["transforms"]) or "none"),
             ("tokens/s", f"{tps['median']:,.0f} ({tps['min']:,.0f}–{tps['max']:,.0f})"),
             ("× eager", _x(w["speedup_cum"]))]
    for k, v in rows_:
        table.add_row(escape(k), escape(v))
    return table


def print_tune(results: dict, console: Console | None = None) -> None:
    console = console or Console(highlight=False, width=None if sys.stdout.isatty() else 160)
    table = winner_table(results)
    if table is not None:
        console.print(table)
    for line in tune_lines(results):
        console.print(escape(line), soft_wrap=True)
