"""tune's outcome: the winning configuration, what was kept and dropped, and the commands that reproduce it."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from speedladder.records import Results
from speedladder.report.common import console, times

OLD_TRAIN = "train_rungs"  # a command a file from before winner.toml saved, no longer written: in `extra`


def tune_lines(results: Results) -> list[str]:
    """tune's outcome in sentences: survivors, dropped rungs, candidates, the winner and its commands."""
    t = results.tune
    if not t:
        return []
    out = []
    if t.survivors is not None:
        out.append(f"tune: survivors (won their rung, passed every gate): {', '.join(t.survivors) or 'none'}.")
        for name, why in t.dropped.items():
            out.append(f"tune: dropped {name} — {why}")
        for c in t.candidates:
            if c.same_as:
                out.append(f"tune: {c.name} ({'+'.join(c.rungs)}) is the configuration of {c.same_as}, "
                           "already measured.")
    else:
        out.append("tune: stopped before the survivors were combined.")
    if t.winner and t.commands:
        out.append(f"tune: winner {t.winner}: eager + {' + '.join(t.winner_rungs) or 'nothing'}"
                   + (f" (its batch rung's learning rate by the {t.winner_batch_lr_scale} rule)"
                      if t.winner_batch_lr_scale else "") + (f", named by {t.judged_by}." if t.judged_by else "."))
        out.extend(judge_lines(t))
        cmds = t.commands
        out.append(f"measure it: {cmds.run}")
        out.append(f"train it:   {cmds.train}")
        if OLD_TRAIN in cmds.extra:  # a file from before winner.toml: the command line that trained the winner
            out.append(f"       or:  {cmds.extra[OLD_TRAIN]}")
        if cmds.apply is not None:
            out.extend(paste_lines(results, cmds.apply))
    else:
        out.append("tune: no configuration passed every gate.")
    if t.seconds is not None:
        out.append(f"tune: {t.seconds:.0f} s of a {t.budget_minutes if t.budget_minutes is not None else '?'}-minute "
                   "budget.")
    return out


def judge_lines(t) -> list[str]:
    """Both judges' answers, side by side: tokens/s in timed windows, and the time to the target."""
    out = []
    for j in (t.tokens_judge, t.time_judge):
        if j is None:
            continue
        figures = [f"{j.tokens_per_s_x:.2f}× eager's tokens/s" if j.tokens_per_s_x else "",
                   f"{j.time_x:.2f}× faster than eager to the target" if j.time_x is not None else "",
                   f"p={j.p_vs_eager:.2g} that it is faster than eager" if j.p_vs_eager is not None else "",
                   f"p={j.p_vs_other:.2g} that it is faster than the tokens/s judge's" if j.p_vs_other is not None
                   else ""]
        shown = "; ".join(f for f in figures if f)
        out.append(f"tune: the {j.judge} judge names {j.winner} (eager + {' + '.join(j.rungs) or 'nothing'})"
                   + (f": {shown}" if shown else "") + (f"; {j.detail}" if j.detail else "") + ".")
    return out


def paste_lines(results: Results, apply: str) -> list[str]:
    """The lines to paste into a nanoGPT-style loop, and what they apply (the batch size stays the loop's own)."""
    spec = results.tune.winner_spec if results.tune else None
    if spec is None:
        return []
    mode, autocast = spec.compile_mode, spec.autocast
    applied = [f"torch.compile (mode {mode or 'default'})" if spec.compile else "",
               f"{autocast} autocast" if autocast else "", "TF32" if spec.tf32 else "", *spec.transforms, spec.optimizer]
    out = ["in your own loop: " + apply,
           "                  with autocast: logits, loss = model(X, Y)  # then loss.backward(); optimizer.step()",
           (f"                  applies {', '.join(a for a in applied if a)}; the batch is yours to set "
           f"(the winner trained B={spec.batch_size}, T={spec.seq_len})")]
    if mode in ("max-autotune", "reduce-overhead"):
        out.append("                  CUDA graphs: call torch.compiler.cudagraph_mark_step_begin() before each step")
    return out


def winner_table(results: Results) -> Table | None:
    """The winning configuration, field by field."""
    t = results.tune
    spec = t.winner_spec if t else None
    if not t or not spec or not t.winner:
        return None
    w = results.rung(t.winner)
    table = Table(title="tune: the winning configuration", title_justify="left")
    table.add_column("field", no_wrap=True)
    table.add_column("value")
    compiled = "no" if not spec.compile else (spec.compile_mode or "default")
    rows_ = [("rungs", ",".join(["eager", *t.winner_rungs])),
             ("batch × length", f"{spec.batch_size} × {spec.seq_len}"),
             ("compile", compiled), ("precision", spec.precision), ("optimizer", spec.optimizer),
             ("learning rate", f"× {spec.lr_scale:g}" + (f" (the {t.winner_batch_lr_scale} rule)"
                                                        if t.winner_batch_lr_scale else "")),
             ("model transforms", ", ".join(spec.transforms) or "none")]
    if w is not None and w.tokens_per_s is not None:
        tps = w.tokens_per_s
        rows_ += [("tokens/s", f"{tps.median:,.0f} ({tps.min:,.0f}–{tps.max:,.0f})"), ("× eager", times(w.speedup_cum))]
    j = t.time_judge if t.judge == "time" else None
    if j is not None and j.time_x is not None:
        rows_.append(("× eager to the target", f"{j.time_x:.2f}×" + (f" (p={j.p_vs_eager:.2g})"
                                                                      if j.p_vs_eager is not None else "")))
    for k, v in rows_:
        table.add_row(escape(k), escape(v))
    return table


def print_tune(results: Results, out: Console | None = None) -> None:
    from speedladder.report.race_table import print_race

    out = out or console()
    if results.tune is not None and results.tune.race is not None:
        print_race(results, out, results.tune.race)
    table = winner_table(results)
    if table is not None:
        out.print(table)
    for line in tune_lines(results):
        out.print(escape(line), soft_wrap=True)
