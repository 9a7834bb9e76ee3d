"""The summary at the top of report.html: the winner, what it buys (× eager in tokens/s, and in time to the target
with its p-value), what it is built from, and the lines that use it. Drawn from the saved file alone: a run's or a
race's folder is named RUN_DIR (the folder this page is in); a tune's commands are the ones it saved."""

from __future__ import annotations

from dataclasses import dataclass, field

from speedladder.config.settings import WINNER_FILE
from speedladder.records import RaceEntry, RaceSection, Results
from speedladder.report import conclusion
from speedladder.report.common import times
from speedladder.report.conclusion import Conclusion
from speedladder.report.race_table import BOUND_MARK


@dataclass
class Summary:
    """What the box says, as plain strings (the page escapes them)."""

    winner: str | None
    judge: str  # what named it
    built_from: str = ""
    tokens_x: str = "—"  # × eager tokens/s
    time_x: str = "—"  # × faster than eager to the target, with its p
    lines: list[str] = field(default_factory=list)  # the commands that use it
    notes: list[str] = field(default_factory=list)
    conclusion: Conclusion | None = None  # a ladder's: what paid, what did not and why, the next two commands


def _p(v: float | None) -> str:
    return "—" if v is None else (f"{v:.2g}" if v >= 1e-3 else f"{v:.0e}")


def _race_time(s: RaceSection, e: RaceEntry) -> str:
    """× eager to the target, with the p of each link of its chain (one link in a stage beside eager)."""
    if e.speedup_cum is None:
        return "—"
    links = []
    x: RaceEntry | None = e
    while x is not None and x.built_on:
        links.append(f"p win {_p(x.p_win)} against {x.built_on}")
        x = s.entry(x.built_on)
    mark = BOUND_MARK.get(e.speedup_cum_bound or "", "")
    return f"{mark}{e.speedup_cum:.2f}×" + (f" ({'; '.join(reversed(links))})" if links else " (the baseline)")


def _uses(folder: str, config: str | None = None) -> list[str]:
    where = config or folder
    flag = "--config" if config else "--run"
    return [f"speedladder train {flag} {where}",
            f'model, optimizer, autocast, spec = speedladder.apply(model, "{where}")']


def of(results: Results, folder: str = "RUN_DIR") -> Summary | None:
    """The summary of a run, a race or a tune; None for what names no winner (profile, predict, ddp, sweep)."""
    if results.parallel is not None or results.sweep is not None:
        return None
    t = results.tune
    if t is not None:
        saved = t.commands.train if t.commands else ""
        config = saved.split("--config ", 1)[1] if "--config " in saved else f"{folder}/{WINNER_FILE}"
        judge = t.judged_by or ("the time to the target val loss, raced over seeds" if t.judge == "time" else
                                "tokens/s in timed windows")
        out = Summary(t.winner, judge, "eager + " + (" + ".join(t.winner_rungs) or "nothing"),
                      lines=_uses(folder, config) if t.winner else [])
        chosen = t.time_judge if t.judge == "time" else t.tokens_judge
        if chosen is not None:
            out.tokens_x = times(chosen.tokens_per_s_x) if chosen.tokens_per_s_x else "— (a variant not timed in windows)"
            out.time_x = (f"{chosen.time_x:.2f}× (p win {_p(chosen.p_vs_eager)} against eager)"
                          if chosen.time_x is not None else "not raced")
        else:
            best = results.rung(t.winner) if t.winner else None
            out.tokens_x = times(best.speedup_cum) if best else "—"
            out.time_x = "not raced"
        other = t.tokens_judge if t.judge == "time" else t.time_judge
        if other is not None and other.winner != t.winner:
            p = f", p={_p(t.time_judge.p_vs_other)} that the winner is faster to the target" if (
                t.time_judge and t.time_judge.p_vs_other is not None) else ""
            out.notes.append(f"the {other.judge} judge named {other.winner} (eager + "
                             f"{' + '.join(other.rungs) or 'nothing'}; {times(other.tokens_per_s_x)} tokens/s, "
                             f"{times(other.time_x)} to the target){p}.")
        return out
    s = results.race
    if s is not None:
        raced = s.entry(s.fastest) if s.fastest else None
        if raced is None:
            return Summary(None, "the time to the target val loss, raced over seeds",
                           notes=["no configuration reached the target in every seed and beat the others."])
        rungs = [n for n in raced.rungs if n != "eager"]
        return Summary(raced.name, "the time to the target val loss, raced over seeds",
                       "eager + " + (" + ".join(rungs) or "nothing"),
                       times(raced.tokens_per_s_cum) + " (during the race)", _race_time(s, raced), _uses(folder))
    said = conclusion.of(results, folder)
    best = results.rung(said.best) if said is not None and said.best else None
    if said is None or best is None or said.nothing_paid:  # a winner only where a rung of it won
        return Summary(None, "tokens/s", conclusion=said,
                       notes=[] if said is not None else ["no rung passed every gate."])
    rungs = [n for n in results.chain(best) if n != "eager"]
    if said.interrupted:  # the best so far: the headline and the banner say it, nothing to use yet
        return Summary(None, "tokens/s", conclusion=said)
    # The race and train commands are the conclusion's next two: the box adds the line that applies it in code.
    return Summary(best.name, "tokens/s in timed windows, every gate passed",
                   "eager + " + " + ".join(rungs),
                   f"{times(best.speedup_cum)} ({best.tokens_per_s.median:,.0f} tokens/s)" if best.tokens_per_s else "—",
                   "not raced", _uses(folder)[1:], conclusion=said)


def html(results: Results, folder: str = "RUN_DIR") -> str:
    from speedladder.report.htmlkit import esc, kv, missing

    s = of(results, folder)
    if s is None:
        return missing("no winner to summarize: this command measures one configuration, or a sweep of them.")
    said = conclusion_html(s.conclusion)
    commands = s.lines + [cmd for cmd, _ in (s.conclusion.commands if s.conclusion else [])]
    folder_line = "<p>RUN_DIR: the folder this report is in.</p>" if any("RUN_DIR" in c for c in commands) else ""
    if s.winner is None:
        return (f'<div class="summary">{said}{folder_line}</div>' if said else
                missing(" ".join(s.notes) or "no winner."))
    pairs = [("winner", s.winner), ("named by", s.judge), ("built from", s.built_from),
             ("× eager tokens/s", s.tokens_x), ("× eager to the target", s.time_x)]
    uses = "".join(f"<pre>{esc(line)}</pre>" for line in s.lines)
    notes = "".join(f"<p>{esc(n)}</p>" for n in s.notes)
    return (f'<div class="summary">{said}{kv(pairs)}' + (f"<h3>use it</h3>{uses}" if uses else "")
            + f"{folder_line}{notes}</div>")


def conclusion_html(c: Conclusion | None) -> str:
    """The conclusion first, in the console's sentences (Conclusion.sentences): the headline, each group of rungs,
    the learns-check, why, what would change it, and what to run next."""
    from speedladder.report.htmlkit import esc

    if c is None:
        return ""
    said = c.sentences()
    titles = list(dict.fromkeys(title for title, _ in said[1:]))
    rows = "".join(f"<dt>{esc(t)}</dt><dd>" + "".join(f"<div>{esc(line)}</div>" for title, line in said[1:]
                                                    if title == t) + "</dd>" for t in titles)
    body = [f'<p class="headline"><strong>{esc(said[0][1])}</strong></p>', f'<dl class="said">{rows}</dl>']
    nexts = "".join(f'<pre>{esc(cmd)}</pre><p class="why">{esc(why)}</p>' for cmd, why in c.commands)
    return f'<div class="conclusion">{"".join(body)}<h3>next</h3>{nexts}</div>'
