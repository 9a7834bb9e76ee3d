"""What a run concludes, read from the rung table's own verdicts: what paid, what did not and why, what was not
measured, whether it learns, and the next two commands worth running on this machine.

Drawn from a ladder's saved file alone (docs/report.md), and the one source of the sentences the terminal ends
with and report.html's summary opens with. Every rung of the table lands in exactly one group, by its own record:

- paid: the rungs of the fastest configuration whose own × prev is a win (each credited with its own ratio, never
  the chain's); built upon, no gain claimed: the others of that configuration (noise above 1.0×, a memory rung);
- did not pay: a rung that passed its gates and was not built upon for its speed (a loss, noise at or below 1.0×,
  one short window), with its reason (its explanation's note, its prediction's reason when it lost as predicted);
- judged by the race: an optimizer or architecture rung, whose tokens/s is not what it is for;
- failed a gate, whatever its speed; won where it was built, when the fastest configuration does not build there;
- not measured: stopped during, not reached, skipped, out of memory, an error;
- learns: passed, failed, or not checked (--learns-steps 0, or a run stopped before it): a skipped check is never
  "it learns".

The fastest configuration is the file's `fastest`; an interrupted run has none (it stops before the learns-check),
so the fastest rung that was measured and passed its gates is named as the best so far, with a banner: where the
run stopped, what was never reached, and the command that climbs the rest. A winner is named only where a rung of
it won. The commands are chosen from what was measured: never a race of a configuration against itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import PurePath

from speedladder.config.ladders import FULL_LADDER, LADDERS
from speedladder.config.settings import CONFIG_FILE
from speedladder.ladder.builds_on import judged_by_race, ranked
from speedladder.measure.judging import SHORT
from speedladder.models.presets import CUDA_DEFAULT_PRESET, PRESETS
from speedladder.profile.categories import COMPUTE, MEMORY, OVERHEAD
from speedladder.records import LearnsCheck, ProfiledExplanation, Results, Role, RungResult, RunKind
from speedladder.report.common import STATUS_LABEL, label, times

SMALL_PRESETS = ("tiny", "d2l-cpu")  # scaled down so that a CPU climbs in minutes: matmuls too small to pay much
OVERHEAD_HEAVY = 0.3  # a host-overhead bucket this large: a bigger batch spreads it, whatever the regime's name
STOPPED = ("interrupted", "pending")  # a record the stop cut short
FULL = "full"  # the ladder named beside every rung this project has for speed

# The groups, in the order they are said; each rung of the table lands in one (docs/report.md).
PAID, BUILT, NOT_PAID, RACE, MEMORY_RUNGS, FAILED, ELSEWHERE, NOT_MEASURED = (
    "paid", "built upon, no gain claimed", "did not pay", "judged by the race", "memory", "failed a gate",
    "won where it was built, not in the fastest", "not measured")


@dataclass
class Conclusion:
    """The conclusion, as plain strings: the console prints them, report.html escapes them."""

    headline: str
    nothing_paid: bool  # no rung of the fastest configuration won: no winner is named
    best: str | None = None  # the fastest configuration named: the winner, the best so far, or what was built upon
    interrupted: bool = False
    banner: str = ""  # an interrupted run's: where it stopped, the best so far, what was not reached, how to go on
    groups: dict[str, list[str]] = field(default_factory=dict)  # title -> one line per rung (or one for several)
    learns: str = ""  # the learns-check's state, in a line
    regime: str = ""  # the profile's regime and its buckets
    change: list[str] = field(default_factory=list)  # when nothing paid: what would change that
    commands: list[tuple[str, str]] = field(default_factory=list)  # (command, why): the next two worth running

    @property
    def paid(self) -> list[str]:
        return self.groups.get(PAID, [])

    @property
    def not_paid(self) -> list[str]:
        return self.groups.get(NOT_PAID, [])

    def sentences(self) -> list[tuple[str, str]]:
        """(title, sentence) in the order they are said, the commands apart: what the console and the page share."""
        out = [("", self.headline)]
        out += [(title, line) for title, lines in self.groups.items() for line in lines]
        out += [("learns", self.learns)] if self.learns else []
        out += [("why", self.regime)] if self.regime else []
        out += [("what would change that", line) for line in self.change]
        return out


def _reason(text: str) -> str:
    """A prediction's reason without its arithmetic's conclusion (" -> compile ≈ 1.17x")."""
    return text.split(" -> ")[0].split("; borderline")[0]


def _head(r: RungResult) -> str:
    pred = r.predicted.speedup if r.predicted else None
    return f"{times(r.speedup_prev)} {r.built_on}" + (f" (predicted {pred:.2f}×)" if pred else "")


def why_not(r: RungResult) -> str:
    """Why a rung that passed its gates did not pay, in its own words: its × prev, verdict and reason."""
    head = _head(r)
    e = r.explanation or ProfiledExplanation()
    if r.verdict == SHORT:
        return f"{head} in one short window: {_reason(r.predicted.reason) if r.predicted else 'as predicted'}"
    if e.note:
        return f"{head}, {r.verdict}: {e.note}"
    if r.predicted and r.prediction_error is not None and abs(r.prediction_error) <= 0.25:
        return f"{head}, {r.verdict}, as predicted: {_reason(r.predicted.reason)}"
    return f"{head}, {r.verdict}" + (f": {e.error}" if e.error else "")


def _race_line(r: RungResult) -> str:
    """An optimizer or architecture rung: its tokens/s, its tokens to AdamW's loss where measured, and who judges."""
    text = f"{r.name}: {times(r.speedup_prev)} {r.built_on} in tokens/s"
    t = r.gate.tokens_to_target if r.gate else None
    if t is not None and t.token_ratio and r.speedup_prev:
        text += (f", {t.token_ratio:.2f}× fewer tokens to AdamW's loss over {t.steps} batches (together about "
                 f"{t.token_ratio * r.speedup_prev:.2f}× sooner to it, which only a race measures)")
    return text + f"; an {r.kind} rung, judged by time to a target loss: the race"


def _memory_line(r: RungResult, base: RungResult | None) -> str:
    """A memory rung, expected to cost speed: its tokens/s, and what it saved where both were metered."""
    text = f"{r.name}: {times(r.speedup_prev)} {r.built_on} in tokens/s, a memory rung"
    mine, theirs = r.saved_activation_bytes, base.saved_activation_bytes if base is not None else None
    if mine and theirs:
        text += f" saving activations ({theirs / mine:.1f}× less saved for backward)"
    return text + (f": {r.reason}" if r.reason else "")


def regime_line(results: Results) -> str:
    p = results.profile
    if p is None or p.error or not p.buckets:
        return ""
    b = p.buckets
    return (f"the baseline is {p.label}: compute {b.get(COMPUTE, 0):.0%}, memory-bound operators "
            f"{b.get(MEMORY, 0):.0%}, host overhead {b.get(OVERHEAD, 0):.0%} of its step")


def workload_flags(results: Results) -> str:
    """The flags that give this run's model and data again ("" where the defaults do)."""
    c = results.config.run
    flags = []
    if c.model_source:
        flags.append(f"--model {c.model_source}")
    elif c.hf:
        flags += [f"--hf {c.hf}", *(f"--hf-set {kv}" for kv in c.hf_set)]
    elif not results.config.preset_note:
        flags.append(f"--preset {results.config.preset}")
    preset = PRESETS.get(results.config.preset)
    if c.data != (preset.corpus if preset and not (c.model_source or c.hf) else "timemachine"):
        flags.append(f"--data {c.data}")
    return "".join(f" {f}" for f in flags)


def untried(results: Results) -> list[str]:
    """The full ladder's rungs (its beside rungs too) this run has no record of."""
    full = (*FULL_LADDER, *LADDERS[FULL].beside)
    return [n for n in full if results.rung(n) is None]


def planned(results: Results) -> list[str]:
    """The rungs this run was to climb, in order, then those to measure beside its top."""
    c = results.config
    return [*(c.rungs or ()), *(c.run.beside or ())]


def _changes(results: Results) -> list[str]:
    """What would make a rung pay where none did, chosen from the profile, the processor and the ladder climbed."""
    env, c, p = results.environment, results.config, results.profile
    out = []
    bf16 = results.rung("bf16")
    if env.device_type == "cpu" and env.bf16_native is False and bf16 is not None:
        out.append("native bf16: a processor with AVX-512 BF16 or AMX, or a GPU (bf16 matmuls are emulated here)")
    regime = p.regime if p is not None and not p.error else None
    if regime == "overhead-bound" or (p is not None and p.buckets.get(OVERHEAD, 0) >= OVERHEAD_HEAVY):
        out.append("a bigger batch or model: the step is overhead-bound, and each operator's fixed cost would "
                   "spread over more work (--batch-size, a bigger preset)")
    if regime == "memory-bound":
        out.append("fusion where it pays: compile's Triton kernels on a GPU, fused AdamW (--ladder full)")
    if untried(results):
        out.append(f"--ladder full: {', '.join(untried(results))}, which this run did not try")
    if c.preset in SMALL_PRESETS and not (c.run.model_source or c.run.hf):
        out.append(f"a bigger preset (--preset {CUDA_DEFAULT_PRESET}): matmuls large enough to pay for bf16 and fusion")
    if results.model.kind == "speedladder":
        out.append("your own model (--model FILE.py:NAME, --hf gpt2|llama): the ladder climbs it the same way")
    if env.device_type == "cpu":
        out.append("a GPU: docs/gpu.md runs the ladder, the race and tune there")
    return out


def config_path(folder: str) -> str:
    """The config.toml beside a run's results.json, as a command names it (`folder` is the folder or the file)."""
    if folder.endswith(".json"):
        return str(PurePath(folder).parent / CONFIG_FILE)
    return f"{folder.rstrip('/')}/{CONFIG_FILE}"


def _resume(results: Results, folder: str, best: RungResult | None) -> str:
    """The command that climbs what the stop left: the best configuration's rungs again (each rung is timed beside
    its base, so the base is measured again), then the rung it stopped in and those it never reached."""
    chain = list(results.chain(best)) if best is not None else []
    stopped = [r.rung for r in results.rungs if r.status in STOPPED and r.role in (Role.RUNG, Role.BESIDE)]
    left = [n for n in planned(results) if results.rung(n) is None]
    rungs = list(dict.fromkeys([*chain, *stopped, *left]))
    return f"speedladder run --config {config_path(folder)} --rungs {','.join(rungs)}"


def _race_rungs(results: Results, judged: list[RungResult]) -> str:
    """--rungs of a race of the rungs judged by it: each on the configuration it was measured on."""
    names: list[str] = []
    for r in judged:
        base = results.rung(r.built_on) if r.built_on else None
        names += [*(results.chain(base) if base is not None else ()), r.rung]
    return ",".join(dict.fromkeys(names))


def _commands(results: Results, folder: str, best: RungResult | None, won: bool, interrupted: bool,
              judged: list[RungResult]) -> list[tuple[str, str]]:
    """The next two commands worth running here: an interrupted run's rest first; a race of the rungs the race
    judges; the fastest raced to a loss and trained when something paid; else the ladder widened where the profile
    says it could pay."""
    c, flags = results.config, workload_flags(results)
    out = []
    if interrupted:
        out.append((_resume(results, folder, best), ("climb what the stop left, its best configuration measured "
                                                    "again beside each rung")))
    if judged:
        names = ", ".join(r.name for r in judged)
        out.append((f"speedladder race{flags} --rungs {_race_rungs(results, judged)}",
                    f"{names}: judged by time to a target loss over seeds, not by tokens/s"))
    chain = [n for n in results.chain(best) if n != "eager"] if best is not None else []
    if won and best is not None and chain:
        batch = " A bigger batch can run faster and still need more tokens." if "batch" in chain else ""
        if interrupted:
            out.append((f"speedladder race{flags} --combos {'+'.join(chain)}",
                        f"is {best.name} also sooner to a target loss than eager, over seeds?{batch}"))
        else:
            out += [(f"speedladder race --run {folder}",
                     f"is {best.name} also sooner to a target loss than eager, over seeds?{batch}"),
                    (f"speedladder train --run {folder}", f"train {best.name}, the fastest configuration here")]
        return out[:2]
    if untried(results):
        out.append((f"speedladder run --ladder full{flags}", f"the rungs this run did not try: {', '.join(untried(results))}"))
    p = results.profile
    if p is not None and not p.error and (p.regime == "overhead-bound" or p.buckets.get(OVERHEAD, 0) >= OVERHEAD_HEAVY):
        out.append((f"speedladder run{flags} --batch-size {4 * c.batch_size}",
                    "the step is overhead-bound: a bigger batch spreads each operator's fixed cost"))
    if c.preset in SMALL_PRESETS and results.environment.device_type == "cuda" and not (
            c.run.model_source or c.run.hf):  # on a CPU the bigger preset would climb for an hour: named, not run
        out.append((f"speedladder run --preset {CUDA_DEFAULT_PRESET}", "bigger matmuls, the reference setup"))
    if "muon" not in (c.rungs or ()) and not judged:
        out.append((f"speedladder race{flags}", ("the race to a target loss over seeds, Muon among its rungs: a "
                                                  "rung can pay in time to a loss where no rung paid in tokens/s")))
    out.append((f"speedladder sweep{flags} --batch-sizes {c.batch_size},{2 * c.batch_size},{4 * c.batch_size}",
                "each rung beside eager as the batch grows: where, if anywhere, one starts to pay"))
    return out[:2]


def learns_line(lc: LearnsCheck | None, best: RungResult | None, interrupted: bool) -> str:
    """The learns-check's state in a line: passed (on which rung), failed, or not checked, and why."""
    if lc is None:
        return ("not checked: the run stopped before the learns-check" if interrupted else
                "not checked: no configuration passed every gate" if best is None else "not checked")
    if lc.skipped:
        return f"not checked: {lc.detail}" if lc.detail else "not checked"
    if lc.passed:
        steps = f", {lc.steps} steps" if lc.steps else ""
        loss = (f": loss {lc.first_loss:.3f} → {lc.final_loss:.3f}" if lc.first_loss is not None
                and lc.final_loss is not None else "")
        eager = f", eager fp32 {lc.eager_final_loss:.3f} over the same batches" if lc.eager_final_loss is not None else ""
        return f"passed ({lc.rung}{steps}){loss}{eager}"
    return f"FAILED on {lc.rung}: {lc.detail}" if lc.rung else f"FAILED: {lc.detail}"


def _stop_line(results: Results) -> str:
    """Where an interrupted run stopped: in a rung (its label), or between them."""
    cut = [r for r in results.rungs if r.status in STOPPED]
    if cut:
        return f"stopped during {', '.join(label(r).lstrip('└┊◆★ ') for r in cut)} ({cut[-1].detail or 'interrupted'})"
    lc = results.learns_check
    if lc is not None and lc.skipped and "during" in lc.detail:
        return lc.detail.replace("the run ", "")
    done = [r for r in results.rungs if r.role in (Role.RUNG, Role.BESIDE)]
    return f"stopped after {done[-1].name}" if done else "stopped before its first rung"


def _group(r: RungResult, chain: list[str], best: RungResult | None, results: Results) -> tuple[str, str]:
    """The group a measured rung of the table lands in, and its line there, from its own record alone."""
    if r.name in chain:
        if r.verdict == "win":
            return PAID, f"{r.name} {times(r.speedup_prev)} {r.built_on}"
        what = f"a {r.kind} rung" if r.kind != "speed" else r.verdict
        return BUILT, f"{r.name} {times(r.speedup_prev)} {r.built_on} ({what})"
    if r.gate is not None and not r.gate.passed:
        return FAILED, f"{r.name}: {times(r.speedup_prev)} {r.built_on} in tokens/s, failed its gate: {r.gate.detail}"
    if judged_by_race(r):
        return RACE, _race_line(r)
    if r.kind == "memory":
        return MEMORY_RUNGS, _memory_line(r, results.rung(r.built_on) if r.built_on else None)
    if r.verdict == "win":  # it won on its base, which the fastest configuration does not build on
        return ELSEWHERE, (f"{r.name}: {times(r.speedup_prev)} {r.built_on}, a win on {r.built_on}, which the fastest "
                           f"configuration ({best.name if best else 'none'}) is not built on")
    return NOT_PAID, f"{r.name}: {why_not(r)}"


def _headline(base: RungResult, best: RungResult | None, chain: list[str], won: bool, learns: str,
              learnt: bool, interrupted: bool) -> str:
    so_far = " so far" if interrupted else ""
    if best is None:
        return "no configuration passed every gate and the learns-check: there is nothing here to train."
    if not chain:
        return f"nothing paid{so_far} on this machine: no rung ran faster than {base.name} and passed every gate."
    if not won:  # a gain inside the windows' spread (noise above 1.0x, built upon) is no claim (rule 13)
        return (f"nothing paid beyond the noise{so_far} on this machine: {best.name} ran {times(best.speedup_cum)} "
                f"{base.name}, a gain its windows cannot tell from noise.")
    return (f"{'the best so far' if interrupted else 'the fastest configuration'} is {best.name} "
            f"({' + '.join([base.name, *chain])}): {times(best.speedup_cum)} {base.name} in tokens/s, every gate "
            "passed" + (", and it learns" if learnt else f"; learns: {learns.split(':')[0]}") + ".")


def of(results: Results, folder: str = "RUN_DIR") -> Conclusion | None:
    """A ladder's conclusion (run); None for what has its own (a tune, a race, predict, ddp, a sweep, a profile)."""
    base = results.baseline
    if results.run_kind is not RunKind.RUN or base is None:
        return None
    interrupted = results.status == "interrupted"
    best = results.rung(results.fastest) if results.fastest else None
    if best is None and interrupted:  # no learns-check ran: the fastest that was measured and passed its gates
        best = next(iter(ranked(results)), None)
    chain = [n for n in results.chain(best) if n != base.name] if best is not None else []
    groups: dict[str, list[str]] = {t: [] for t in (PAID, BUILT, NOT_PAID, RACE, MEMORY_RUNGS, FAILED, ELSEWHERE,
                                                    NOT_MEASURED)}
    skipped, failed_to_run, judged = [], [], []
    for r in (r for r in results.rungs if r.role in (Role.RUNG, Role.BESIDE) and r is not base):
        if r.status == "skipped":
            skipped.append(r.name)
        elif r.status in STOPPED:
            groups[NOT_MEASURED].append(f"{r.name}: stopped during it")
        elif not r.ok:
            failed_to_run.append(f"{r.name}: {STATUS_LABEL.get(r.status, r.status)}: {r.detail}")
        else:
            title, line = _group(r, chain, best, results)
            groups[title].append(line)
            judged += [r] if title == RACE else []
    left = [n for n in planned(results) if results.rung(n) is None]
    groups[NOT_MEASURED] += failed_to_run + (
        [f"not reached: {', '.join(left)} — the run stopped before them" if interrupted
         else f"not run: {', '.join(left)}"] if left else [])
    groups[NOT_MEASURED] += [f"skipped here: {', '.join(skipped)} (each one's reason is in the notes)"] * bool(skipped)
    won = bool(groups[PAID])
    lc = results.learns_check
    learns = learns_line(lc, best, interrupted)
    learnt = best is not None and lc is not None and lc.state == "passed" and lc.rung == best.name
    commands = _commands(results, folder, best, won, interrupted, judged)
    banner = ""
    if interrupted:
        banner = (f"interrupted: {_stop_line(results)}" + (f"; not reached: {', '.join(left)}" if left else "")
                  + "; the learns-check did not run" * (lc is None or lc.skipped)
                  + (f". Best so far: {best.name}, {times(best.speedup_cum)} {base.name}, every gate passed"
                     if best is not None else "") + f". To go on: {commands[0][0]}")
    return Conclusion(_headline(base, best, chain, won, learns, learnt, interrupted), not won,
                      best.name if best is not None else None, interrupted, banner,
                      {t: lines for t, lines in groups.items() if lines}, learns, regime_line(results),
                      _changes(results) if not won else [], commands)


def lines(c: Conclusion) -> list[str]:
    """The conclusion as the console prints it, after the table and the notes: the same sentences as the page's."""
    out = [f"conclusion: {c.headline}"]
    for title, items in c.groups.items():
        if title in (PAID, BUILT):
            out.append(f"  {title}: " + "; ".join(items) + ".")
        else:
            out.extend(f"  {title}: {n}." for n in items)
    if c.learns:
        out.append(f"  learns: {c.learns}.")
    if c.regime:
        out.append(f"  why: {c.regime}.")
    if c.change:
        out.append("  what would change that: " + "; ".join(c.change) + ".")
    out.extend(f"next: {cmd}    # {why}" for cmd, why in c.commands)
    return out
