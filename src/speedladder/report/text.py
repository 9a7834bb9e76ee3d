"""The rung table and the notes under it: drawn from saved results alone."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table

from speedladder.ladder.builds_on import judged_by_race
from speedladder.measure.judging import SHORT
from speedladder.records import LearnsCheck, Results, Role, RungResult, SavedModel
from speedladder.report import conclusion, machine_notes, trust
from speedladder.report.common import (
    STATUS_LABEL,
    console,
    gib,
    label,
    model_label,
    not_built_upon,
    recipe_line,
    recipe_part,
    times,
)
from speedladder.report.explained import explanation_notes, explanation_tables
from speedladder.report.memory_notes import memory_notes, peak_cell, saved_cell, short_bytes
from speedladder.report.mfu import DevicePeak, device_mfu_cell, device_note, device_peak, mfu_cell, mfu_notes
from speedladder.report.profile_notes import profile_notes


def _gate(r: RungResult) -> str:
    if not r.ok or r.gate is None:
        return "—"
    if r.gate.reference:
        return "ref"
    return "pass" if r.gate.passed else "FAIL"


def _compile(r: RungResult) -> str:
    if r.compile_s is None:
        return "—"
    return f"{r.compile_s:.1f}" + (" (cache)" if r.timing and r.timing.cache_hits else "")


def prev_range(r: RungResult) -> tuple[float, float] | None:
    """The range of × prev its windows allow: its slowest window over its base's fastest, its fastest over its
    base's slowest (the base re-timed beside it). The verdict reads it: a win only when the range lies wholly above
    1, a loss only wholly below (measure/judging.verdict); None when the base was not timed beside it."""
    t, b = r.tokens_per_s, r.base_tokens_per_s
    if t is None or b is None or not b.min or not b.max:
        return None
    return t.min / b.max, t.max / b.min


def _prev(r: RungResult, spread: bool) -> str:
    """× prev, with the range its windows allow in brackets (spread) and the drift mark."""
    text = times(r.speedup_prev)
    # One short window a side has no range: the verdict column says `short`.
    span = prev_range(r) if spread and r.speedup_prev is not None and r.verdict != SHORT else None
    if span is not None:
        text += f" ({span[0]:.2f}–{span[1]:.2f})"
    return text + (DRIFT_MARK if drifted(r) else "")


def drifted(r: RungResult) -> bool:
    """Whether a rung's base, re-timed beside it, drifted from its own measurement by the trust line's threshold."""
    return r.base_drift is not None and abs(r.base_drift) >= trust.DRIFT


def rows(results: Results, spread: bool = True) -> list[dict[str, str]]:
    """One row of display strings per rung or control, in ladder order: every column (the wide table, report.html,
    bench/summary.py); the compact table picks COMPACT from them. spread: × prev with its range in brackets."""
    out = []
    peak = device_peak(results)
    for r in results.rungs:
        pred = r.predicted.speedup if r.predicted else None
        row = {"rung": label(r), "on": r.built_on or "—", "tokens/s": "—", "min–max": "—", "× prev": "—",
               "pred ×": times(pred), "err": "—", "× cum": "—", "step ms": "—", "peak mem": "—", "saved act": "—",
               "pred act": "—", MFU: "—", MFU_OWN: "—", "TFLOP/s": "—", "compile s": "—",
               "gate": _gate(r), "verdict": STATUS_LABEL.get(r.status, ""), NOT_BUILT_UPON: not_built_upon(r)}
        if r.ok and r.tokens_per_s is not None:  # gated, or stopped short (not gated: `—`)
            t = r.tokens_per_s
            row.update({
                "tokens/s": f"{t.median:,.0f}", "min–max": f"{t.min:,.0f}–{t.max:,.0f}",
                "× prev": _prev(r, spread),
                "× cum": times(r.speedup_cum),
                "err": "—" if r.prediction_error is None else f"{100 * r.prediction_error:+.0f}%",
                "step ms": f"{r.step_ms:.1f}", "peak mem": peak_cell(r), "saved act": saved_cell(r),
                "pred act": short_bytes(r.predicted_activation_bytes),
                MFU: device_mfu_cell(r, peak), MFU_OWN: mfu_cell(r),
                "TFLOP/s": "—" if r.tflops is None else f"{r.tflops:.2f}" if r.tflops >= 0.1 else f"{r.tflops:.3f}",
                "compile s": _compile(r),
                "verdict": r.verdict or "",  # the speed's verdict alone: the gate has its own column
            })
        out.append(row)
    if not any(r.saved_activation_bytes is not None or r.predicted_activation_bytes is not None
               for r in results.rungs):  # a file from before the memory meters: no empty columns
        for row in out:
            del row["saved act"], row["pred act"]
    return out


def title(results: Results) -> str:
    c, e = results.config, results.environment
    return (f"speedladder · {model_label(c, results.model)} on {e.device_name} ({e.device_type}) · "
            f"{results.corpus.source if results.corpus else None} · B={c.batch_size} T={c.seq_len}{recipe_part(results)} · "
            f"torch {e.torch}")


NOT_BUILT_UPON = "not built upon"  # the column: why the rungs above do not build on this one, in a word
MFU, MFU_OWN = "MFU", "MFU at its precision"  # against the device's one peak (its header names it); the row's own


def header(col: str, peak: DevicePeak | None) -> str:
    """A column's header as shown: MFU's names the peak it is taken against."""
    return peak.header if col == MFU and peak is not None else col
# The compact table: what a rung did to the speed, and whether it may be trusted and built upon. It fits
# COMPACT_WIDTH columns; the gate, the verdict and why a rung is not built upon are never shortened.
COMPACT = ("rung", "on", "tokens/s", "× prev", "× cum", "gate", "verdict", NOT_BUILT_UPON)
NEVER_SHORTENED = ("gate", "verdict", NOT_BUILT_UPON)
COMPACT_WIDTH = 100  # a file or a pipe has no width of its own: the compact table fits this many columns
SHORTENED_FIRST = (("rung", 6), ("on", 4))  # what gives way, in order, at a narrow terminal, and how far
LEFT = ("rung", "on", "gate", "verdict", NOT_BUILT_UPON)


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[:max(width - 1, 1)] + "…"


def _draw(results: Results, data: list[dict[str, str]], columns: tuple[str, ...], compact: bool) -> Table:
    # No outer border and no padding at the edges: 4 columns more for the cells than rich's default box.
    t = Table(box=box.MINIMAL_HEAVY_HEAD, show_edge=False, pad_edge=False)
    peak = device_peak(results)
    for col in columns:
        # The compact table's last header in two lines: its words are longer than any of its cells.
        shown = "not built\nupon" if compact and col == NOT_BUILT_UPON else header(col, peak)
        t.add_column(shown, justify="left" if col in LEFT else "right", no_wrap=True)
    for r, row in zip(results.rungs, data):
        t.add_row(*(escape(row[col]) for col in columns), style="bold" if r.name == results.fastest else None)
    return t


_MEASURE = Console(width=10_000, highlight=False)  # wide enough to measure any table at its natural width


def natural_width(t: Table) -> int:
    """The width a table takes when nothing squeezes it."""
    return Measurement.get(_MEASURE, _MEASURE.options, t).maximum


def table(results: Results, width: int | None = COMPACT_WIDTH) -> Table:
    """The rung table. width None: every column (--wide; report.html has the same rows). Otherwise the compact
    table, fitted to `width` columns: first × prev loses its range, then the rung and `on` columns are shortened
    with "…"; the gate, the verdict and why a rung is not built upon are never shortened. A table that still does
    not fit (below 80 columns) is drawn at its narrowest, and the terminal wraps its lines."""
    if width is None:
        data = rows(results)
        return _draw(results, data, tuple(data[0]) if data else ("rung",), compact=False)
    data = rows(results)
    t = _draw(results, data, COMPACT, compact=True)
    if natural_width(t) <= width:
        return t
    data = rows(results, spread=False)
    t = _draw(results, data, COMPACT, compact=True)
    for col, least in SHORTENED_FIRST:
        excess = natural_width(t) - width
        if excess <= 0:
            break
        widest = max(len(row[col]) for row in data) if data else 0
        fit = max(least, widest - excess, len(col))
        data = [{**row, col: _clip(row[col], fit)} for row in data]
        t = _draw(results, data, COMPACT, compact=True)
    return t


DRIFT_MARK = " †"  # on a × prev whose base ran at another speed beside it than as its own rung


def drift_lines(results: Results) -> list[str]:
    """Each rung whose base drifted between its own measurement and the one beside the rung, with both figures,
    and once the rule: the ratios hold, the absolute tokens/s across rows do not."""
    by_name = {r.name: r for r in results.rungs}
    out = []
    for r in results.rungs:
        base = by_name.get(r.built_on or "")
        if not drifted(r) or r.base_drift is None or base is None or base.tokens_per_s is None or r.base_tokens_per_s is None:
            continue
        out.append(f"{r.name}: † drift — {base.name} ran at {r.base_tokens_per_s.median:,.0f} tokens/s re-timed beside "
                   f"it, {abs(r.base_drift):.0%} {'below' if r.base_drift < 0 else 'above'} its own "
                   f"{base.tokens_per_s.median:,.0f} as a rung (the ranges do not overlap): the machine's speed moved.")
    if out:
        out.append("† drift: × prev and × cum are ratios measured side by side and hold; the tokens/s of rows measured "
                   "at different times are not comparable with each other.")
    return out


def _control_note(rung: RungResult, control: RungResult) -> str:
    b = rung.spec.batch_size if rung.spec else None
    if control.status == "oom":
        return f"fp32 at B={b} ran out of memory: bf16 bought the headroom for this batch."
    if not control.ok or control.tokens_per_s is None or rung.tokens_per_s is None:
        return f"fp32 control at B={b}: {control.status} ({control.detail})."
    ratio = rung.tokens_per_s.median / control.tokens_per_s.median
    text = (f"at B={b}, {rung.precision} runs {ratio:.2f}× the fp32 control's tokens/s "
            f"({rung.tokens_per_s.median:,.0f} vs {control.tokens_per_s.median:,.0f})")
    if rung.peak_memory_bytes and control.peak_memory_bytes:
        text += (f", peak memory {gib(rung.peak_memory_bytes)} vs {gib(control.peak_memory_bytes)} "
                 f"({control.peak_memory_bytes / rung.peak_memory_bytes:.2f}× more in fp32)")
    elif rung.resident_rise and control.resident_rise:  # a CPU: the step's resident rise, in a child process
        text += (f", the step's resident rise {short_bytes(rung.resident_rise)} vs "
                 f"{short_bytes(control.resident_rise)} ({control.resident_rise / rung.resident_rise:.2f}× more in fp32)")
    return text + "."


def _rung_notes(r: RungResult, by_name: dict[str, RungResult]) -> list[str]:
    """What a rung of the ladder beyond needs said beside its row."""
    out = []
    if r.not_built_upon:  # its reason word first (slower, race); a file from before it has the sentence alone
        colour = {"loss": "red", SHORT: "pale red"}.get(r.verdict or "", "pale")
        drawn = "an outline on the waterfall" if judged_by_race(r) else f"{colour} on the waterfall"
        out.append(f"{r.name}: not built upon — {r.not_built_upon} ({drawn}; --stack-all builds on it).")
    above = [x.name for x in by_name.values() if x.built_on == r.name and x.role == Role.RUNG]
    if judged_by_race(r) and r.ok and above and not r.not_built_upon:  # a file from before such rungs were left out
        out.append(f"{r.name}: built upon here ({', '.join(above)} on it), as the ladder did before an {r.kind} rung "
                   "was left out of the climb for speed; the race judges it, and the ladder now builds on its base.")
    if r.role == Role.BESIDE and r.ok:
        out.append(f"{r.name}: measured beside {r.built_on or 'the top'}, the top of the ladder, "
                   f"and not built upon ({r.kind} rung).")
    base = by_name.get(r.built_on or "")
    opt = r.spec.optimizer if r.spec else None
    if r.ok and opt and base is not None and base.spec is not None and opt != base.spec.optimizer:
        out.append(f"{r.name}: optimizer {opt}.")
    out.extend(_recipe_notes(r, base))
    gate = r.gate
    band = gate.loss_band if gate else None
    if band is not None and not band.applies:
        out.append(f"{r.name}: loss band {band.detail}.")
    t = gate.tokens_to_target if gate else None
    if t is not None and t.target_loss is not None and r.tokens_per_s is not None:
        ours = "never" if t.tokens is None else f"{t.tokens:,} tokens"
        theirs = "never" if t.adamw_tokens is None else f"{t.adamw_tokens:,} tokens"
        out.append(f"{r.name}: to reach AdamW's loss {t.target_loss:.3f} over the same {t.steps} batches: "
                   f"{ours} vs AdamW {theirs}" + (f" ({t.token_ratio:.2f}× fewer)" if t.token_ratio else "")
                   + f"; tokens/s {r.tokens_per_s.median:,.0f}.")
    return out


def _recipe_notes(r: RungResult, base: RungResult | None) -> list[str]:
    """fp16's skipped updates; an accumulating rung's speed and memory beside the rung it built on at its batch."""
    out = []
    if r.scaler_skipped is not None:
        out.append(f"{r.name}: the gradient scaler skipped {r.scaler_skipped} of {r.scaler_updates} updates while it "
                   "was measured (inf or NaN gradients: the scale halves and the update is not made).")
    if r.spec is not None and r.spec.accum > 1 and r.ok:
        accum, batch = r.spec.accum, r.spec.batch_size
        text = f"{r.name}: B={batch} in {accum} micro-steps of {batch // accum}"
        same = base is not None and base.spec is not None and base.spec.batch_size == batch and base.ok
        if same and base is not None and base.tokens_per_s is not None and r.speedup_prev is not None:
            text += f", {r.speedup_prev:.2f}× {base.name}'s tokens/s (one batch of {batch})"
            if r.peak_memory_bytes and base.peak_memory_bytes:
                text += f", peak memory {gib(r.peak_memory_bytes)} vs {gib(base.peak_memory_bytes)}"
            elif r.resident_rise and base.resident_rise:
                text += (f", the step's resident rise {short_bytes(r.resident_rise)} vs "
                         f"{short_bytes(base.resident_rise)}")
        out.append(text + ".")
    return out


def _window_note(ok: list[RungResult]) -> list[str]:
    """On CUDA the steps per window come from a timed step: say so, and how many each rung's windows ran."""
    sized = [(r.name, r.timing) for r in ok if r.timing and r.timing.sized_from_step_s]
    if not sized:
        return []
    least = sized[0][1].min_window_s
    return [f"windows: steps per window sized from a timed warm-up step so that a window lasts at least {least:g} s: "
            + ", ".join(f"{name} {timing.window_steps}" for name, timing in sized) + "."]


def _learns_note(lc: LearnsCheck | None) -> list[str]:
    if not lc:
        return []
    if lc.skipped:
        return [f"learns-check not run ({lc.detail})."]
    if lc.eager_final_loss is not None:
        return [(f"learns-check ({lc.rung}, {lc.steps} steps): loss {lc.first_loss:.3f} → "
                 f"{lc.final_loss:.3f}; eager fp32 over the same batches {lc.eager_final_loss:.3f} (band "
                 f"{lc.band:.0%}); unigram entropy {lc.unigram_entropy:.3f}: "
                 f"{'passed' if lc.passed else 'FAILED — ' + lc.detail}.")]
    if lc.drop is not None:  # schema 1: a drop of the loss was the check
        return [(f"learns-check ({lc.rung}, {lc.steps} steps): loss {lc.first_loss:.3f} → "
                 f"{lc.final_loss:.3f} ({-100 * lc.drop:.0f}%): {'passed' if lc.passed else 'FAILED'}.")]
    return [f"learns-check ({lc.rung}): FAILED — {lc.detail}"]


def _model_note(model: SavedModel) -> list[str]:
    """For a model other than ours (docs/models.md): how it was called, FLOPs, dropout."""
    if model.kind == "speedladder":
        return []
    flops = "by formula" if model.flops_method == "formula" else "counted by torch"
    return [(f"model: {model.name}: {model.convention_means}; FLOPs per token {flops}; "
            f"dropout {model.dropout}.")]


def notes(results: Results) -> list[str]:
    """Plain sentences under the table: what was skipped and why, gates, controls, learns-check, winner."""
    out = []
    if results.config.preset_note:
        out.append(results.config.preset_note + ".")
    env = results.environment
    if env.device_type == "cpu" and env.cpu_capability:  # what a CPU's verdicts rest on
        native = {True: "native", False: "not native", None: "unknown"}[env.bf16_native]
        out.append(f"processor: {env.cpu_capability}, bf16 {native} ({env.bf16_why}); muon: "
                   f"{env.muon}.")
    out.extend(_model_note(results.model))
    out.extend(recipe_line(results))
    by_name = {r.name: r for r in results.rungs}
    for r in results.rungs:
        if not r.ok:
            out.append(f"{r.name}: {STATUS_LABEL.get(r.status, r.status)} — {r.detail}")
        elif r.gate is not None and not r.gate.passed:
            out.append(f"{r.name}: gate failed, not built upon — {r.gate.detail}")
            e = r.gate.explanation
            if e is not None:
                out.append(f"{r.name}: why — {e.summary}" + (f"; again, alone: {e.command}" if e.command else ""))
        out.extend(f"{r.name}: warning — {w}" for w in r.warnings)
        if r.verdict in ("inconclusive", SHORT):
            out.append(f"{r.name}: verdict {r.verdict} — {r.verdict_detail}")
        out.extend(_rung_notes(r, by_name))
        if r.role == Role.CONTROL:
            out.append(f"{r.rung}: " + _control_note(by_name[r.rung], r))
    ok = [r for r in results.rungs if r.ok]
    if any(r.compile_s is not None and r.timing and r.timing.cache_hits for r in ok):
        out.append("compile s marked (cache): graphs came from the compile caches of an earlier run; "
                   "a cold compile takes longer.")
    out.extend(device_note(device_peak(results)) if ok else [])
    out.extend(mfu_notes(ok))
    out.extend(_window_note(ok))
    out.extend(machine_notes.window_lines(results))
    out.extend(drift_lines(results))
    out.extend(_learns_note(results.learns_check))
    out.extend(memory_notes(results))
    out.extend(profile_notes(results))
    out.extend(explanation_notes(results))
    fastest = by_name.get(results.fastest or "")
    base = results.baseline
    if fastest is not None and fastest.tokens_per_s is not None and base is not None:
        out.append(f"fastest rung that passed every gate: {fastest.name}, {fastest.speedup_cum:.2f}× {base.name} "
                   f"({fastest.tokens_per_s.median:,.0f} tokens/s).")
    elif results.status == "complete":
        out.append("no rung passed every gate.")
    elif results.status == "failed" and results.error:
        out.append(f"run failed: {results.error}.")
    if any(r.base_tokens_per_s is not None for r in results.rungs):
        out.append("× prev: each rung's median tokens/s over the rung it built on, re-timed beside it with windows "
                   "interleaved; in brackets the range its windows allow (its slowest over the base's fastest to its "
                   "fastest over the base's slowest): a win or a loss only when the range excludes 1; × cum is the "
                   "product of the × prev down the rungs it built on.")
    return out


MORE_COLUMNS = ("columns: the compact table; --wide prints every column in a terminal (the tokens/s range, the "
                "prediction and its error, step time, memory, MFU, TFLOP/s, compile seconds), and report.html has "
                "them all.")


def print_report(results: Results, out: Console | None = None, wide: bool = False, folder: str = "RUN_DIR") -> None:
    """The title, the trust line (and an interrupted run's banner), the rung table and the notes. In a terminal the compact table fits the terminal's width, and
    wide prints every column at its natural width. To a file or a pipe the compact table fits COMPACT_WIDTH columns
    and wide is ignored: report.html and results.json hold every column. rich never squeezes the table: a line
    longer than the terminal wraps there rather than a cell losing its end. Last, the conclusion: what paid, what
    did not and why, and the next two commands, on `folder` (the run's folder or file)."""
    out = out or console()
    wide = wide and out.is_terminal
    c = conclusion.of(results, folder)
    shared = machine_notes.header_line(results)  # other processes' load, where worth saying: before anything else
    if shared:
        out.print(escape(shared), soft_wrap=True)
    out.print(escape(title(results)), soft_wrap=True)
    for line in [trust.line(results), c.banner if c is not None else ""]:  # what to trust, and where a run stopped
        if line:
            out.print(escape(line), soft_wrap=True)
    t = table(results, None if wide else out.width if out.is_terminal else COMPACT_WIDTH)
    width = out.width
    out.width = max(width, natural_width(t))
    try:
        out.print(t)
    finally:
        out.width = width
    for line in notes(results) + ([] if wide or not results.rungs else [MORE_COLUMNS]):
        out.print(escape(line), soft_wrap=True)
    for t in explanation_tables(results):
        out.print(t)
    for line in conclusion.lines(c) if c is not None else []:
        out.print(escape(line), soft_wrap=True)
