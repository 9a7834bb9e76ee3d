"""A race in words: its table, its notes and the printed view, drawn from its saved `race` section alone
(records.RaceSection); its charts are in race/charts.py."""

from __future__ import annotations

import statistics

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from speedladder.measure import judging, stats
from speedladder.records import RaceEntry, RaceSection, Results
from speedladder.report import machine_notes
from speedladder.report.common import console, model_label, recipe_line, recipe_part, times

# The race's verdicts, coloured as the ladder's are; two more of its own.
RACE_COLOURS = {"baseline": "#8c8c8c", "win": "#1f6fb4", "loss": "#d62728", "noise": "#9bb7d4",
                "not a win": "#e8a33d", "did not reach": "#555555"}
TOKENS_COLOUR = "#b8b8b8"  # tokens/s in a race carries no verdict of its own
RACE_PLOT = "waterfall.png"


def _p(v: float | None) -> str:
    if v is None:
        return "—"
    return f"{v:.2g}" if v >= 1e-3 else f"{v:.0e}"


def _secs(e: RaceEntry) -> tuple[str, str]:
    if e.time is None:
        return "—", "—"
    return f"{e.time.mean:.2f} ± {e.time.sd:.2f}", f"{e.time.min:.2f}–{e.time.max:.2f}"


def verdict_cell(e: RaceEntry) -> str:
    if e.status != "ok":
        return {"failed": "FAILED"}.get(e.status, e.status)
    return e.verdict or "—"


BOUND_MARK = {"at most": "≤", "at least": "≥"}  # a ratio that runs stopped before the target bound on that side


def prev_cell(e: RaceEntry) -> str:
    """× prev, with ≤ or ≥ where runs that stopped before the target bound it."""
    mark = BOUND_MARK.get(e.speedup_bound or "", "")
    return "—" if e.speedup_prev is None else f"{mark}{e.speedup_prev:.2f}×"


def cum_cell(e: RaceEntry) -> str:
    """× cum, with ≥ or ≤ where a link of its chain is a bound."""
    mark = BOUND_MARK.get(e.speedup_cum_bound or "", "")
    return "—" if e.speedup_cum is None else f"{mark}{e.speedup_cum:.2f}×"


def budget_cell(e: RaceEntry) -> str:
    b = e.budget
    if b is None or b.mean is None:
        return "—"
    return f"{b.mean:.4f} {'✓' if b.passed else '✗'}"


def race_rows(section: RaceSection) -> list[dict[str, str]]:
    """One row of display strings per configuration: the same for the terminal and report.html."""
    out = []
    for e in section.entries:
        mean, rng = _secs(e)
        own = e.own_runs
        reached = sum(r.reached for r in own)
        out.append({
            "config": e.name, "s to target": mean, "min–max": rng, "× prev": prev_cell(e),
            "p win": _p(e.p_win), "p loss": _p(e.p_loss), "× cum": cum_cell(e),
            "tokens": "—" if e.tokens is None else f"{e.tokens.mean:,.0f}",
            "× tokens": "—" if e.token_ratio is None else f"{e.token_ratio:.2f}×",
            "tok/s": "—" if e.tokens_per_s is None else f"{e.tokens_per_s:,.0f}",
            "× tok/s": times(e.tokens_per_s_prev),
            "seeds": f"{reached}/{len(own)}" if own else "—",
            "val @budget": budget_cell(e),
            "compile s": "—" if e.compile_s is None else f"{e.compile_s:.1f}",
            "verdict": verdict_cell(e),
        })
    return out


def title(results: Results, section: RaceSection | None = None) -> str:
    c, e, s = results.config, results.environment, section or results.race
    assert s is not None
    target = "none" if s.target_loss is None else f"{s.target_loss:.4f}"
    return (f"speedladder race · {model_label(c, results.model)} on {e.device_name} ({e.device_type}) · "
            f"{results.corpus.source if results.corpus else None} · B={c.batch_size} T={c.seq_len}{recipe_part(results)} · target val loss "
            f"{target} · {len(s.seeds)} seeds · torch {e.torch}")


# What the short column names mean, said once under the table.
COLUMNS_NOTE = ("columns: s to target (mean ± sd over the seeds that reached it, in its own stage), × prev against "
                "its base in the same stage (the geometric mean of the per-seed ratios; ≤ or ≥ where a run that "
                "stopped bounds it) with the paired test's one-sided p win and p loss, × cum the chain of × prev "
                "down to the first; tokens to the target, × tokens against the base's; tok/s trained during the "
                "race; seeds that reached the target; val @budget the mean val loss at the token budget, ✓ when "
                "below the target at p < alpha (modded-nanogpt's criterion).")


def race_table(results: Results, section: RaceSection | None = None) -> Table:
    s = section or results.race
    assert s is not None
    t = Table(title=escape(title(results, s)), title_justify="left")
    rows = race_rows(s)
    for col in rows[0] if rows else ["config"]:
        t.add_column(col, justify="left" if col in ("config", "verdict") else "right", no_wrap=True)
    for e, row in zip(s.entries, rows):
        t.add_row(*(escape(v) for v in row.values()), style="bold" if e.name == s.fastest else None)
    return t


def _entry_lines(e: RaceEntry, s: RaceSection) -> list[str]:
    out = []
    if e.status != "ok":
        out.append(f"{e.name}: {e.status} — {e.detail}")
        return out
    for r in e.own_runs:
        if not r.reached:
            best = ("" if r.best_loss is None else f"; its best val loss {r.best_loss:.4f} at {r.best_seconds:.2f} s "
                    f"({r.best_tokens:,} tokens)")
            cap = f" at {r.cap_s:.2f} s, {r.cap_from}" if r.stopped == "time cap" and r.cap_s is not None else ""
            out.append(f"{e.name}: seed {r.seed} did not reach {s.target_loss:.4f} ({r.stopped}{cap}){best}.")
        if r.recompiles:
            out.append(f"{e.name}: seed {r.seed}: {r.recompiles} graph(s) compiled while the clock ran: its time "
                       "includes compiling.")
    if e.verdict_detail and e.verdict not in ("win", "loss", "noise"):
        out.append(f"{e.name}: {e.verdict} — {e.verdict_detail}.")
    elif e.verdict_detail:
        out.append(f"{e.name}: {e.verdict_detail}.")
    eq = e.equal_tokens
    if eq is not None and eq.loss:
        mean = sum(eq.loss) / len(eq.loss)
        base = sum(eq.base_loss) / len(eq.base_loss)
        p = "" if eq.p_worse is None else f", one-sided paired p={_p(eq.p_worse)} that it is worse"
        out.append(f"{e.name}: changes how the model learns, so it is also compared with {e.built_on} at equal tokens "
                   f"(where the shorter run of each seed stopped, mean {sum(eq.tokens) / len(eq.tokens):,.0f}): "
                   f"val {mean:.4f} vs {base:.4f}{p}: " + ("WORSE" if eq.worse else "no worse")
                   + (f" ({eq.detail})" if eq.detail and not eq.worse else "") + ".")
    tps, prev = e.tokens_per_s_prev, e.speedup_prev
    if tps is not None and prev is not None and tps > 1 and (e.verdict in ("loss", "not a win") or prev < 1):
        more = f"; it needs {e.token_ratio:.2f}× the tokens" if e.token_ratio and e.token_ratio > 1 else ""
        out.append(f"{e.name}: {tps:.2f}× {e.built_on}'s tokens/s, but {prev_cell(e)} to the target{more}: "
                   "tokens/s alone would have praised it.")
    if e.built_upon is False and e.role == "rung" and e.verdict is not None:
        nxt = next((x for x in s.entries[s.entries.index(e) + 1:] if x.built_on), None)
        # The claim and the choice are two questions: noise claims nothing, but its best estimate decides.
        estimate = (f": no loss at p < {s.alpha:g}, but its best estimate is not above 1.0×"
                    if e.verdict == stats.NOISE else "")
        out.append(f"{e.name}: not built upon ({judging.why_not_built(e.verdict)}) — {e.verdict}, {prev_cell(e)} "
                   f"{e.built_on}{estimate}" + (f"; {nxt.name} is built on {nxt.built_on}." if nxt is not None else "."))
    return out


def _stage_lines(s: RaceSection) -> list[str]:
    if not s.stages:
        return []
    seeds = f"seeds {s.seeds[0]}–{s.seeds[-1]}" if len(s.seeds) > 1 else f"seed {s.seeds[0]}"
    if len(s.stages) == 1 and len(s.stages[0].names) > 2:
        st = s.stages[0]
        orders = ", ".join("-".join(o) for o in st.orders[:len(st.names)])
        return [(f"one stage: {', '.join(st.names)}, each over {seeds}, the runs of a seed taking turns a stretch at "
                 f"a time, the order rotated from seed to seed (a Latin square: {orders}, ...); each judged against "
                 f"{st.base}.")]
    parts = []
    for st in s.stages:
        rungs = [n for n in st.names if n != st.base]
        parts.append(f"{st.index} {', '.join(rungs) or st.base}" + (f" against {st.base}" if rungs else " alone"))
    first = s.stages[0]
    starts = ", ".join(o[0] for o in first.orders[:2])
    balance = ("a first-mover effect cancels in the mean" if len(s.seeds) % 2 == 0 else
               "an odd number of seeds lets one side start once more than the other")
    return [f"stages: {'; '.join(parts)}. Each stage trains both afresh over {seeds}, the two runs of a seed taking "
            f"turns a stretch at a time (the one with less training time next); who starts alternates ({starts}, "
            f"...): {balance}."
            + (" Every rung that ran was built upon (--stack-all)." if s.stack_all else
               " The next stage builds on the rung only if it won, or was noise above 1.0× (its best estimate).")]


def power_lines(section: RaceSection) -> list[str]:
    """What these seeds can find, at 80% power: per verdict of noise, and at the race's median spread, with the
    seeds a change of section.detect would need (stats.detectable, stats.seeds_for)."""
    out = []
    alpha, n = section.alpha, len(section.seeds)
    spreads = []
    for e in section.entries:
        t = e.paired
        if t is None or t.sd is None:
            continue
        spreads.append(t.sd)
        if e.verdict != stats.NOISE or e.detectable is None or e.detectable <= section.detect:
            continue
        need = stats.seeds_for(t.sd, section.detect, alpha)
        out.append(f"{e.name}: noise; its per-seed log time ratios against {e.built_on} spread by "
                   f"{100 * t.sd:.1f}%, at which {len(t.seeds)} seeds find a change of {100 * e.detectable:.0f}% with "
                   f"{100 * stats.POWER:.0f}% power at p < {alpha:g}; "
                   + (f"--seeds {need} would find {100 * section.detect:.0f}%." if need else
                      f"more than 64 seeds would be needed for {100 * section.detect:.0f}%."))
    if spreads:
        sd = statistics.median(spreads)
        d = stats.detectable(sd, n, alpha)
        need = stats.seeds_for(sd, section.detect, alpha)
        out.append(f"power: at the median spread of the per-seed log time ratios here ({100 * sd:.1f}%), {n} seeds "
                   f"find a change of {100 * (d or 0):.0f}% with {100 * stats.POWER:.0f}% power at p < {alpha:g}"
                   + (f"; {100 * section.detect:.0f}% needs --seeds {need}." if need and need > n else "."))
    return out


def budget_line(section: RaceSection) -> str | None:
    """modded-nanogpt's criterion for every configuration, in one sentence."""
    judged = [e for e in section.entries if e.budget is not None and e.budget.mean is not None]
    if not judged or not section.budget_tokens:
        return None
    steps = f", {section.budget_steps} base steps' worth" if section.budget_steps else ""
    parts = [f"{e.name} {b.mean:.4f} (p={_p(b.p_below)}{', ' + b.detail if b.detail else ''})"
             f" {'meets it' if b.passed else 'does not'}" for e in judged if (b := e.budget) is not None]
    return (f"modded-nanogpt's criterion: the mean val loss at a fixed budget of {section.budget_tokens:,} tokens"
            f"{steps}, below the target at p < {section.alpha:g} (a one-sample t-test over the seeds): "
            + "; ".join(parts) + ".")


def race_lines(results: Results, section: RaceSection | None = None) -> list[str]:
    """The sentences under the race's table: the target, the rule, every exception, the fastest."""
    s = section or results.race
    if s is None:
        return []
    val_from = results.corpus.val_from if results.corpus else None
    cap = (f"{s.time_cap_s:.1f} s ({s.cap_from})" if s.time_cap_s is not None else "— (not set)")
    factor = (f"a rung stops at {s.cap_factor:g}x its base's time in the same seed, once the base is done; a base "
              f"at {cap}" if s.cap_factor else f"each run is capped at {cap}")
    out = [f"target: val loss {s.target_loss:.4f}, {s.target_from}; on a fixed val set of {s.val_sequences} "
           f"sequences of {s.val_seq_len} tokens from {val_from or 'the held-out split'}, in eval mode, "
           f"under no_grad, at each configuration's precision." if s.target_loss is not None else
           "target: not set (the race stopped before it was calibrated).",
           (f"clock: training steps only, stopped at every evaluation (every {s.eval_every} base steps' worth, "
            f"{s.eval_tokens:,} tokens); the time to the target is interpolated between the evaluation above it and "
            f"the first at or below it; compile and warm-up are timed apart. {factor}: a run that stops first "
            "counts as at least its clock.")]
    out.extend(recipe_line(results))
    out.extend(_stage_lines(s))
    if s.stages or not any(e.runs for e in s.entries):
        out.append(f"verdict: per seed, the log of the time over its base's in the same stage; a one-sided t-test "
                   f"each way on their mean, paired by seed: win or loss at p < {s.alpha:g}, otherwise noise. Each "
                   "side is tested on the bound that works against it: a configuration with a run that stopped is "
                   "never a win, and a base's run that stopped gives no loss.")
    else:  # a file from before stages: its verdicts are as saved
        out.append(f"verdict (as saved, by a version before stages): Welch's t-test on the times against the "
                   f"configuration built on, one-sided each way, win or loss at p < {s.alpha:g}.")
    out.append(COLUMNS_NOTE)
    for e in s.entries:
        out.extend(_entry_lines(e, s))
    out.extend(machine_notes.run_lines(s))
    out.extend(power_lines(s))
    line = budget_line(s)
    if line:
        out.append(line)
    if s.batch_lr_scale != "none":
        out.append(f"the batch rung scales the learning rate by the {s.batch_lr_scale} rule (--batch-lr-scale).")
    best = s.entry(s.fastest) if s.fastest else None
    if best is not None and best.time is not None:
        at_least = "at least " if best.speedup_cum_bound == "at least" else ""
        cum = f", {at_least}{best.speedup_cum:.2f}× the baseline" if best.speedup_cum else ""
        out.append(f"fastest to the target: {best.name}, {best.time.mean:.2f} s on average{cum}"
                   + (f" ({chain_text(s, best)})" if best.built_on and len(chain(s, best)) > 1 else "") + ".")
    elif results.status == "complete":
        out.append("no configuration reached the target in every seed.")
    if results.status == "interrupted":
        out.append("race interrupted: the runs above were finished before the stop.")
    return out


def chain(s: RaceSection, e: RaceEntry) -> list[RaceEntry]:
    """The entries from the first one up to e, each built on the one before."""
    out = [e]
    while out[-1].built_on and (b := s.entry(out[-1].built_on)) is not None:
        out.append(b)
    return list(reversed(out))


def chain_text(s: RaceSection, e: RaceEntry) -> str:
    """× cum as the product it is: each link's × prev with its p win."""
    return " × ".join(f"{x.name} {prev_cell(x)} (p win {_p(x.p_win)})" for x in chain(s, e)[1:])


def print_race(results: Results, out: Console | None = None, section: RaceSection | None = None) -> None:
    out = out or console()
    shared = machine_notes.header_line(results)  # other processes ran beside the race: said before anything else
    if shared:
        out.print(escape(shared), soft_wrap=True)
    out.print(race_table(results, section))
    for line in race_lines(results, section):
        out.print(escape(line), soft_wrap=True)
