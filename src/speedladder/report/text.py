"""The rung table and the notes under it: drawn from saved results alone."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from speedladder.records import LearnsCheck, Results, Role, RungResult
from speedladder.report import machine
from speedladder.report.common import STATUS_LABEL, console, gib, label, model_label, times
from speedladder.report.memory import (
    explanation_notes,
    explanation_tables,
    memory_notes,
    peak_cell,
    saved_cell,
    short_bytes,
)
from speedladder.report.profile import profile_notes


def _gate(r: RungResult) -> str:
    if not r.ok or r.gate is None:
        return "—"
    if r.gate.reference:
        return "ref"
    return "pass" if r.gate.passed else "FAIL"


def _compile(r: RungResult) -> str:
    if r.compile_s is None:
        return "—"
    return f"{r.compile_s:.1f}" + (" (cache)" if (r.timing or {}).get("cache_hits") else "")


def rows(results: Results) -> list[dict[str, str]]:
    """One row of display strings per rung or control, in ladder order."""
    out = []
    for r in results.rungs:
        pred = r.predicted.speedup if r.predicted else None
        row = {"rung": label(r), "on": r.built_on or "—", "tokens/s": "—", "min–max": "—", "× prev": "—", "pred ×": times(pred), "err": "—",
               "× cum": "—", "step ms": "—", "peak mem": "—", "saved act": "—", "pred act": "—", "MFU": "—",
               "TFLOP/s": "—", "compile s": "—",
               "gate": _gate(r), "verdict": STATUS_LABEL.get(r.status, "")}
        if r.ok and r.tokens_per_s is not None and r.gate is not None:
            t = r.tokens_per_s
            row.update({
                "tokens/s": f"{t.median:,.0f}", "min–max": f"{t.min:,.0f}–{t.max:,.0f}",
                "× prev": times(r.speedup_prev) + (DRIFT_MARK if r.base_drift is not None else ""),
                "× cum": times(r.speedup_cum),
                "err": "—" if r.prediction_error is None else f"{100 * r.prediction_error:+.0f}%",
                "step ms": f"{r.step_ms:.1f}", "peak mem": peak_cell(r), "saved act": saved_cell(r),
                "pred act": short_bytes(r.predicted_activation_bytes),
                "MFU": "n/a" if r.mfu is None else f"{100 * r.mfu:.1f}%",
                "TFLOP/s": "—" if r.tflops is None else f"{r.tflops:.2f}" if r.tflops >= 0.1 else f"{r.tflops:.3f}",
                "compile s": _compile(r),
                "verdict": (r.verdict or "") if r.gate.passed else f"failed ({r.verdict})",
            })
        out.append(row)
    if not any(r.saved_activation_bytes is not None or r.predicted_activation_bytes is not None
               for r in results.rungs):  # a file from before the memory meters: no empty columns
        for row in out:
            del row["saved act"], row["pred act"]
    return out


def title(results: Results) -> str:
    c, e = results.config, results.environment
    return (f"speedladder · {model_label(c, results.model)} on {e['device_name']} ({e['device_type']}) · "
            f"{(results.corpus or {}).get('source')} · B={c.batch_size} T={c.seq_len} · torch {e['torch']}")


def table(results: Results) -> Table:
    t = Table(title=escape(title(results)), title_justify="left")
    data = rows(results)
    for col in data[0] if data else ["rung"]:
        t.add_column(col, justify="left" if col in ("rung", "gate", "verdict") else "right", no_wrap=True)
    for r, row in zip(results.rungs, data):
        t.add_row(*(escape(v) for v in row.values()), style="bold" if r.name == results.fastest else None)
    return t


DRIFT_MARK = " †"  # on a × prev whose base ran at another speed beside it than as its own rung


def drift_lines(results: Results) -> list[str]:
    """Each rung whose base drifted between its own measurement and the one beside the rung, with both figures,
    and once the rule: the ratios hold, the absolute tokens/s across rows do not."""
    by_name = {r.name: r for r in results.rungs}
    out = []
    for r in results.rungs:
        base = by_name.get(r.built_on or "")
        if r.base_drift is None or base is None or base.tokens_per_s is None or r.base_tokens_per_s is None:
            continue
        out.append(f"{r.name}: † drift — {base.name} ran at {r.base_tokens_per_s.median:,.0f} tokens/s re-timed beside "
                   f"it, {abs(r.base_drift):.0%} {'below' if r.base_drift < 0 else 'above'} its own "
                   f"{base.tokens_per_s.median:,.0f} as a rung (the ranges do not overlap): the machine's speed moved.")
    if out:
        out.append("† drift: × prev and × cum are ratios measured side by side and hold; the tokens/s of rows measured "
                   "at different times are not comparable with each other.")
    return out


def _control_note(rung: RungResult, control: RungResult) -> str:
    b = rung.spec["batch_size"]
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
    if r.not_built_upon:  # its reason word first (slower); a file from before it has the sentence alone
        colour = "red" if r.verdict == "loss" else "pale"
        out.append(f"{r.name}: not built upon — {r.not_built_upon} ({colour} on the waterfall; --stack-all builds "
                   "on it).")
    if r.role == Role.BESIDE and r.ok:
        out.append(f"{r.name}: measured beside {r.built_on or 'the top'}, the top of the ladder, "
                   f"and not built upon ({r.kind} rung).")
    base = by_name.get(r.built_on or "")
    opt = r.spec.get("optimizer")
    if r.ok and opt and base is not None and opt != base.spec.get("optimizer"):
        out.append(f"{r.name}: optimizer {opt}.")
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


def _window_note(ok: list[RungResult]) -> list[str]:
    """On CUDA the steps per window come from a timed step: say so, and how many each rung's windows ran."""
    sized = [(r.name, r.timing) for r in ok if r.timing and r.timing.get("sized_from_step_s")]
    if not sized:
        return []
    least = sized[0][1]["min_window_s"]
    return [f"windows: steps per window sized from a timed warm-up step so that a window lasts at least {least:g} s: "
            + ", ".join(f"{name} {timing['window_steps']}" for name, timing in sized) + "."]


def _learns_note(lc: LearnsCheck | None) -> list[str]:
    if not lc:
        return []
    if lc.skipped:
        return [f"learns-check skipped ({lc.detail})."]
    if lc.eager_final_loss is not None:
        return [(f"learns-check ({lc.rung}, {lc.steps} steps): loss {lc.first_loss:.3f} → "
                 f"{lc.final_loss:.3f}; eager fp32 over the same batches {lc.eager_final_loss:.3f} (band "
                 f"{lc.band:.0%}); unigram entropy {lc.unigram_entropy:.3f}: "
                 f"{'passed' if lc.passed else 'FAILED — ' + lc.detail}.")]
    if lc.drop is not None:  # schema 1: a drop of the loss was the check
        return [(f"learns-check ({lc.rung}, {lc.steps} steps): loss {lc.first_loss:.3f} → "
                 f"{lc.final_loss:.3f} ({-100 * lc.drop:.0f}%): {'passed' if lc.passed else 'FAILED'}.")]
    return [f"learns-check ({lc.rung}): FAILED — {lc.detail}"]


def _model_note(model: dict) -> list[str]:
    """For a model other than ours (docs/models.md): how it was called, FLOPs, dropout."""
    if model.get("kind", "speedladder") == "speedladder":
        return []
    flops = "by formula" if model["flops_method"] == "formula" else "counted by torch"
    return [(f"model: {model['name']}: {model['convention_means']}; FLOPs per token {flops}; "
            f"dropout {model['dropout']}.")]


def notes(results: Results) -> list[str]:
    """Plain sentences under the table: what was skipped and why, gates, controls, learns-check, winner."""
    out = []
    if results.config.preset_note:
        out.append(results.config.preset_note + ".")
    env = results.environment
    if env.get("device_type") == "cpu" and env.get("cpu_capability"):  # what a CPU's verdicts rest on
        native = {True: "native", False: "not native", None: "unknown"}[env.get("bf16_native")]
        out.append(f"processor: {env['cpu_capability']}, bf16 {native} ({env.get('bf16_why')}); muon: "
                   f"{env.get('muon')}.")
    out.extend(_model_note(results.model))
    by_name = {r.name: r for r in results.rungs}
    for r in results.rungs:
        if not r.ok:
            out.append(f"{r.name}: {STATUS_LABEL.get(r.status, r.status)} — {r.detail}")
        elif r.gate is not None and not r.gate.passed:
            out.append(f"{r.name}: gate failed — {r.gate.detail}")
        out.extend(f"{r.name}: warning — {w}" for w in r.warnings)
        if r.verdict == "inconclusive":
            out.append(f"{r.name}: verdict inconclusive — {r.verdict_detail}")
        out.extend(_rung_notes(r, by_name))
        if r.role == Role.CONTROL:
            out.append(f"{r.rung}: " + _control_note(by_name[r.rung], r))
    ok = [r for r in results.rungs if r.ok]
    if any(r.compile_s is not None and (r.timing or {}).get("cache_hits") for r in ok):
        out.append("compile s marked (cache): graphs came from the compile caches of an earlier run; "
                   "a cold compile takes longer.")
    if ok and all(r.mfu is None for r in ok):
        out.append("MFU n/a: no peak FLOP/s is known for this device; --peak-tflops sets one.")
    out.extend(f"{r.name}: MFU against {r.peak_tflops:,.0f} TFLOP/s, {r.peak_basis}." for r in ok
               if r.peak_basis and r.peak_tflops)
    out.extend(_window_note(ok))
    out.extend(machine.window_lines(results))
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
        out.append("× prev: each rung against the rung it built on, re-timed beside it with windows interleaved; "
                   "× cum is the product of the × prev below it.")
    if results.status == "interrupted":
        out.append("run interrupted: the rungs above were measured before the stop.")
    return out


def print_report(results: Results, out: Console | None = None) -> None:
    out = out or console()
    shared = machine.header_line(results)  # other processes ran beside the windows: said before anything else
    if shared:
        out.print(escape(shared), soft_wrap=True)
    out.print(table(results))
    for line in notes(results):
        out.print(escape(line), soft_wrap=True)
    for t in explanation_tables(results):
        out.print(t)
