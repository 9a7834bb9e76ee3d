"""What a run concludes: what paid, what did not and why, and the next two commands worth running on this machine.

Drawn from a ladder's saved file alone (docs/report.md): the fastest configuration's rungs and their × prev; every
other rung with its reason (its explanation's note, its failed gate, or its prediction's reason when it lost as
predicted); the profile's regime; and, when nothing paid, that fact said plainly with what would change it, chosen
from what the profile and the processor say. The commands are chosen from what was measured: never a race of a
configuration against itself (a run whose fastest is eager is not raced).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from speedladder.config.presets import CUDA_DEFAULT_PRESET, PRESETS
from speedladder.measure.judging import SHORT
from speedladder.profile.categories import COMPUTE, MEMORY, OVERHEAD
from speedladder.records import ProfiledExplanation, Results, Role, RungResult, RunKind
from speedladder.report.common import STATUS_LABEL, times

SMALL_PRESETS = ("tiny", "d2l-cpu")  # scaled down so that a CPU climbs in minutes: matmuls too small to pay much
OVERHEAD_HEAVY = 0.3  # a host-overhead bucket this large: a bigger batch spreads it, whatever the regime's name


@dataclass
class Conclusion:
    """The conclusion, as plain strings: the console prints them, report.html escapes them."""

    headline: str
    nothing_paid: bool
    paid: list[str] = field(default_factory=list)  # each rung of the fastest configuration, with its × prev
    not_paid: list[str] = field(default_factory=list)  # each other rung, with why
    regime: str = ""  # the profile's regime and its buckets
    change: list[str] = field(default_factory=list)  # when nothing paid: what would change that
    commands: list[tuple[str, str]] = field(default_factory=list)  # (command, why): the next two worth running


def _reason(text: str) -> str:
    """A prediction's reason without its arithmetic's conclusion (" -> compile ≈ 1.17x")."""
    return text.split(" -> ")[0].split("; borderline")[0]


def why_not(r: RungResult) -> str:
    """Why a rung that ran is not in the fastest configuration, in its own words."""
    if not r.ok:
        return f"{STATUS_LABEL.get(r.status, r.status)}: {r.detail}"
    pred = r.predicted.speedup if r.predicted else None
    head = f"{times(r.speedup_prev)} {r.built_on}" + (f" (predicted {pred:.2f}×)" if pred else "")
    e = r.explanation or ProfiledExplanation()
    if r.verdict == SHORT:
        return f"{head} in one short window: {_reason(r.predicted.reason) if r.predicted else 'as predicted'}"
    if r.gate is not None and not r.gate.passed:
        return f"{head}, failed its gate: {r.gate.detail}"
    if r.kind != "speed":
        return f"{head}, a {r.kind} rung ({r.reason})"
    if e.note:
        return f"{head}, {r.verdict}: {e.note}"
    if r.predicted and r.prediction_error is not None and abs(r.prediction_error) <= 0.25:
        return f"{head}, {r.verdict}, as predicted: {_reason(r.predicted.reason)}"
    return f"{head}, {r.verdict}" + (f": {e.error}" if e.error else "")


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
    if c.run.ladder != "full":
        out.append("--ladder full: sdpa, fused AdamW and pad-vocab, which this ladder did not try")
    if c.preset in SMALL_PRESETS and not (c.run.model_source or c.run.hf):
        out.append(f"a bigger preset (--preset {CUDA_DEFAULT_PRESET}): matmuls large enough to pay for bf16 and fusion")
    if results.model.kind == "speedladder":
        out.append("your own model (--model FILE.py:NAME, --hf gpt2|llama): the ladder climbs it the same way")
    if env.device_type == "cpu":
        out.append("a GPU: docs/gpu.md runs the ladder, the race and tune there")
    return out


def _commands(results: Results, folder: str, best: RungResult | None) -> list[tuple[str, str]]:
    """The next two commands worth running here: the fastest raced to a loss and trained when something paid;
    else the ladder widened where the profile says it could pay."""
    c, flags = results.config, workload_flags(results)
    if best is not None and any(x.verdict == "win" for n in results.chain(best) if (x := results.rung(n)) is not None):
        batch = " A bigger batch can run faster and still need more tokens." if "batch" in results.chain(best) else ""
        return [(f"speedladder race --run {folder}",
                 f"is {best.name} also sooner to a target loss than eager, over seeds?{batch}"),
                (f"speedladder train --run {folder}", f"train {best.name}, the fastest configuration here")]
    out = []
    if c.run.ladder != "full":
        out.append((f"speedladder run --ladder full{flags}", "the rungs this ladder did not try"))
    p = results.profile
    if p is not None and not p.error and (p.regime == "overhead-bound" or p.buckets.get(OVERHEAD, 0) >= OVERHEAD_HEAVY):
        out.append((f"speedladder run{flags} --batch-size {4 * c.batch_size}",
                    "the step is overhead-bound: a bigger batch spreads each operator's fixed cost"))
    if c.preset in SMALL_PRESETS and results.environment.device_type == "cuda" and not (
            c.run.model_source or c.run.hf):  # on a CPU the bigger preset would climb for an hour: named, not run
        out.append((f"speedladder run --preset {CUDA_DEFAULT_PRESET}", "bigger matmuls, the reference setup"))
    if "muon" not in c.rungs:
        out.append((f"speedladder race{flags}", ("the race to a target loss over seeds, Muon among its rungs: a "
                                                  "rung can pay in time to a loss where no rung paid in tokens/s")))
    out.append((f"speedladder sweep{flags} --batch-sizes {c.batch_size},{2 * c.batch_size},{4 * c.batch_size}",
                "each rung beside eager as the batch grows: where, if anywhere, one starts to pay"))
    return out[:2]


def of(results: Results, folder: str = "RUN_DIR") -> Conclusion | None:
    """A ladder's conclusion (run); None for what has its own (a tune, a race, predict, ddp, a sweep, a profile)."""
    if results.run_kind is not RunKind.RUN:
        return None
    base = results.baseline
    if base is None:
        return None
    best = results.rung(results.fastest) if results.fastest else None
    chain = [n for n in results.chain(best) if n != base.name] if best is not None else []
    rungs = [r for r in results.rungs if r.role in (Role.RUNG, Role.BESIDE) and r is not base]
    paid = [f"{r.name} {times(r.speedup_prev)} {r.built_on} ({r.verdict})" for r in rungs if r.name in chain]
    not_paid = [f"{r.name}: {why_not(r)}" for r in rungs if r.name not in chain and r.status != "skipped"]
    skipped = [r.name for r in rungs if r.status == "skipped"]
    if skipped:
        not_paid.append(f"not run here: {', '.join(skipped)} (their reasons are in the notes)")
    won = [n for n in chain if (x := results.rung(n)) is not None and x.verdict == "win"]
    nothing = not won  # a gain inside the windows' spread (noise above 1.0x, built upon) is no claim (rule 13)
    if best is None:
        headline = "no configuration passed every gate and the learns-check: there is nothing here to train."
    elif not chain:
        headline = f"nothing paid on this machine: no rung ran faster than {base.name} and passed every gate."
    elif nothing:
        headline = (f"nothing paid beyond the noise on this machine: {best.name} ran {times(best.speedup_cum)} "
                    f"{base.name}, a gain its windows cannot tell from noise.")
    else:
        headline = (f"{best.name} paid most: {times(best.speedup_cum)} {base.name} in tokens/s, every gate passed"
                    + (" and it learns" if results.learns_check and results.learns_check.passed else "") + ".")
    return Conclusion(headline, nothing, paid, not_paid, regime_line(results),
                      _changes(results) if nothing else [], _commands(results, folder, best))


def paid_label(c: Conclusion) -> str:
    """What the fastest configuration's rungs are called: what paid, or, where no test claims a gain, what was built
    upon."""
    return "built upon, no gain claimed" if c.nothing_paid else "paid"


def lines(c: Conclusion) -> list[str]:
    """The conclusion as the console prints it, after the table and the notes."""
    out = [f"conclusion: {c.headline}"]
    if c.paid:
        out.append(f"  {paid_label(c)}: " + "; ".join(c.paid) + ".")
    out.extend(f"  did not pay: {n}." for n in c.not_paid)
    if c.regime:
        out.append(f"  why: {c.regime}.")
    if c.change:
        out.append("  what would change that: " + "; ".join(c.change) + ".")
    out.extend(f"next: {cmd}    # {why}" for cmd, why in c.commands)
    return out
