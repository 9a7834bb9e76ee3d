"""Two profiled steps side by side, against the timed figures: what a loss or a missed prediction is explained by.

Like with like (docs/memory-sweep.md, every loss and miss explained): the base's step and the rung's are both
profiled in one child process, so the profiler taxes both; each is then set against its own timed step (the
ladder's windows, base and rung timed beside each other). The profile's own ratio must add up to the timed one
within ADDS_UP, or the note says that it does not and by how much the profiler inflated each side. The parts and
categories are shown in the timed figures' ms (each profile scaled to its own timed step, the profiler's tax
spread in proportion), so that a step of 750 ms is never blamed on a gap between a profiled base of 86 ms and a
timed one of 51 ms. For a compiled rung: what the compiler did (graphs, graph breaks, recompiles, the kernels its
generated code calls a step).

Pure functions of saved profiles and figures: no profiler here (profile/explain.py runs them).
"""

from __future__ import annotations

from speedladder.profile.predict import baseline_parts
from speedladder.records import OpsPerStep, PartMs, ProfiledExplanation, ProfileSummary, SideMs, TimedSteps, from_dict

# The model's parts, merged where two profiles cannot tell them apart (the attention's matmuls are matmuls to the
# profiler; its mask and softmax are tail), each with the words a note uses.
GROUPS: dict[str, tuple[tuple[str, ...], str]] = {
    "matmul": (("matmul", "attn_matmul"), "matmuls"),
    "attention": (("attention",), "fused attention"),
    "tail": (("attn_tail", "tail"), "elementwise, norm and softmax tail"),
    "copies": (("copies",), "copies & H2D"),
    "optimizer": (("optimizer",), "optimizer"),
    "overhead": (("overhead", "serial"), "host overhead (between operators, plus each operator's fixed cost)"),
    "other": (("other",), "other operators"),
}
# The profiled ratio within this of the timed one (either way): the profile accounts for what the windows measured.
ADDS_UP = 0.25


def grouped(parts: dict[str, float]) -> dict[str, float]:
    return {g: sum(parts.get(p, 0.0) for p in names) for g, (names, _) in GROUPS.items()}


def label(group: str, compiled: bool, device_type: str | None) -> str:
    """A group's words; inductor's fused kernels are the tail of a compiled step (C++ loops on a CPU)."""
    words = GROUPS[group][1]
    if group == "overhead" and device_type == "cuda":
        return "the host's time a step (it overlaps the device's), and what did not overlap"
    if group == "tail" and compiled:
        return f"{words} (inductor's fused {fused_words(device_type)})"
    return words


def fused_words(device_type: str | None) -> str:
    return "C++ loops" if device_type == "cpu" else "kernels"


def step_ms(profile: dict) -> float:
    """A profile's median step: the sum of its categories (ms)."""
    return sum(v["ms"] for v in profile["categories"].values())


def ratio(base_ms: float | None, rung_ms: float | None, base_tokens: int | None, rung_tokens: int | None) -> float | None:
    """The rung's tokens/s over its base's, from their step times and tokens a step."""
    if not (base_ms and rung_ms and base_tokens and rung_tokens):
        return None
    return (rung_tokens / rung_ms) / (base_tokens / base_ms)


def compare(base: dict, rung: dict, before: dict[str, float], after: dict[str, float], error: float,
            timed: TimedSteps | None = None) -> ProfiledExplanation:
    """Two profiles side by side, against their timed steps, and the part that moved against the prediction most.

    base, rung: saved profiles (ProfileSummary dicts) of the base's step and the rung's. before, after: the model's
    predicted parts (ms) of the base and the rung, in the baseline profile's ms, rescaled here to the base's. error:
    measured x over predicted, less 1 (> 0: faster than predicted). timed: the two steps as the windows timed them
    and the measured ratio; without it the profiled ms are shown as they are. The rungs and traces are the caller's.
    """
    measured_b = grouped(baseline_parts(from_dict(ProfileSummary, base)))
    measured_r = grouped(baseline_parts(from_dict(ProfileSummary, rung)))
    base_ms, rung_ms = step_ms(base), step_ms(rung)
    kb = timed.base_ms / base_ms if timed and base_ms else 1.0  # each profile scaled to its own timed step
    kr = timed.rung_ms / rung_ms if timed and rung_ms else 1.0
    pred_b, pred_a = grouped(before), grouped(after)
    scale = kb * sum(measured_b.values()) / (sum(pred_b.values()) or 1.0)
    parts = {g: PartMs(base_ms=kb * measured_b[g], rung_ms=kr * measured_r[g],
                       expected_ms=kb * measured_b[g] + scale * (pred_a[g] - pred_b[g])) for g in GROUPS}
    cats = {c: SideMs(base_ms=kb * base["categories"][c]["ms"],
                      rung_ms=kr * rung["categories"].get(c, {}).get("ms", 0.0)) for c in base["categories"]}
    # Against the prediction: the part that cost most beyond what the model expected when the rung was slower
    # than predicted, the part that saved most beyond it when the rung was faster.
    sign = 1.0 if error < 0 else -1.0
    culprit = max(parts, key=lambda g: sign * (parts[g].rung_ms - parts[g].expected_ms))
    grew = max(cats, key=lambda c: cats[c].rung_ms - cats[c].base_ms)
    p = parts[culprit]
    compiled = bool(rung.get("spec", {}).get("compile")) and not base.get("spec", {}).get("compile")
    note = (f"{label(culprit, compiled, rung.get('device_type'))}: {p.rung_ms - p.base_ms:+.2f} ms a step "
            f"where the model expected {p.expected_ms - p.base_ms:+.2f} ms")
    tokens = base.get("tokens_per_step"), rung.get("tokens_per_step")
    profiled_x = ratio(base_ms, rung_ms, *tokens)
    adds_up = (abs(profiled_x / timed.x - 1) <= ADDS_UP) if timed and profiled_x and timed.x else None
    return ProfiledExplanation(
        categories=cats, parts=parts, culprit=culprit, grew=grew, note=note, basis="timed" if timed else "profiled",
        base_step_ms=base_ms, rung_step_ms=rung_ms, base_tokens_per_step=tokens[0], rung_tokens_per_step=tokens[1],
        profiled_x=profiled_x, timed=timed, adds_up=adds_up, compiler=rung.get("compiler"),
        ops_per_step=OpsPerStep(base.get("ops_per_step"), rung.get("ops_per_step")), device_type=rung.get("device_type"))


def sums(e: ProfiledExplanation) -> str:
    """How the profiled steps set against the timed ones: both ratios, and whether the profile adds up."""
    t = e.timed
    px = e.profiled_x or ratio(e.base_step_ms, e.rung_step_ms, e.base_tokens_per_step, e.rung_tokens_per_step)
    line = (f"{e.base_step_ms:.1f} → {e.rung_step_ms:.1f} ms a step under the profiler"
            + (f" ({px:.2f}×)" if px else ""))
    if not t:
        return line
    line += f", timed {t.base_ms:.1f} → {t.rung_ms:.1f} ms ({t.x:.2f}×)"
    if e.adds_up:
        return line + f": the profile adds up to the timed ratio (within {ADDS_UP:.0%})"
    tax_b, tax_r = e.base_step_ms / t.base_ms - 1, e.rung_step_ms / t.rung_ms - 1
    return (line + f": the profile does not add up to the timed ratio (the profiled steps ran {tax_b:+.0%} and "
            f"{tax_r:+.0%} against their timed ones: the profiler's tax, or the machine's load, fell unevenly); the "
            "parts are each profile scaled to its timed step")


def grew_line(e: ProfiledExplanation) -> str:
    """The category that grew most, in the explanation's ms, when one grew."""
    c = e.grew
    if not c:
        return ""
    v = e.categories[c]
    d = v.rung_ms - v.base_ms
    return f"the category that grew most: {c} {d:+.2f} ms a step ({v.base_ms:.2f} → {v.rung_ms:.2f})" if d > 0 else ""


def compiler_line(e: ProfiledExplanation) -> str:
    """What the compiler did for a compiled rung: graphs, breaks, recompiles, the kernels a step against its base's
    operators (the profiler sees a compiled step's library calls as operators, not its fused kernels)."""
    c = e.compiler
    if not c:
        return ""
    reasons = c.get("break_reasons") or {}
    why = f" ({'; '.join(f'{n}× {r}' for r, n in reasons.items())})" if reasons else ""
    line = (f"the compiler: {c['graphs']} graph(s), {c['graph_breaks']} graph break(s){why}, "
            f"{c['recompiles']} recompile(s) after the first step")
    ops, k = e.ops_per_step, c.get("kernel_calls")
    if k and ops.base and ops.rung is not None:
        line += (f"; kernels a step: {ops.base:,.0f} operators before, {ops.rung + k['fused']:,.0f} after "
                 f"({k['fused']} fused {fused_words(e.device_type)} and {k['library']} library calls in its "
                 f"generated code, {ops.rung:,.0f} operators in all)")
    return line
