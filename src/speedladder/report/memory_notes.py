"""Memory in words, tables and a chart: read from saved results alone."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from speedladder.records import Results, Role, RungResult

MISSING = "not measured"  # how memory.record says a meter could not run
RSS = "rss"  # marks a resident-set figure (a CPU's process peak) apart from the CUDA allocator's


def short_bytes(n: float | None) -> str:
    """Bytes to 3 significant figures in the largest unit under the number (1.00 GiB, 15.2 MiB, 439 KiB)."""
    if n is None:
        return "n/a"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10), ("B", 1)):
        if abs(n) >= size or unit == "B":
            v = n / size
            decimals = max(0, 2 - math.floor(math.log10(abs(v)))) if v and unit != "B" else 0
            return f"{v:.{decimals}f} {unit}"
    raise AssertionError("unreachable")


RESERVED = "res"  # marks the CUDA allocator's reserved peak beside its allocated one


def peak_cell(r: RungResult) -> str:
    """The measured peak: the CUDA allocator's (allocated, then reserved: CUDA graphs' pools are reserved), else
    the resident set's rise during the step (marked rss)."""
    if r.peak_memory_bytes is not None:
        reserved = f" ({RESERVED} {short_bytes(r.peak_reserved_bytes)})" if r.peak_reserved_bytes is not None else ""
        return short_bytes(r.peak_memory_bytes) + reserved
    rise = r.resident_rise
    return "n/a" if rise is None else f"{short_bytes(rise)} {RSS}"


def saved_cell(r: RungResult) -> str:
    return short_bytes(r.saved_activation_bytes)


def bar_label(r: RungResult) -> str:
    """The memory lines under a waterfall bar's ×: saved activations and the measured peak."""
    lines = []
    if r.saved_activation_bytes is not None:
        lines.append(f"act {short_bytes(r.saved_activation_bytes)}")
    if r.peak_memory_bytes is not None or r.resident_rise is not None:
        lines.append(peak_cell(r))  # the CUDA allocator's peak, or a CPU's resident rise (marked rss)
    return "\n".join(lines)


def _ratio(a: int | None, b: int | None) -> str:
    return "—" if not a or not b else f"{b / a:.1f}× less" if b >= a else f"{a / b:.1f}× more"


def _held_note(measured: Sequence[RungResult]) -> str:
    """What the process held when each peak was reset, which the peaks leave out (results.json's held_before_bytes)."""
    held = [r.held_before_bytes for r in measured if r.held_before_bytes is not None]
    if not held:
        return ""
    span = short_bytes(held[0]) if min(held) == max(held) else f"{short_bytes(min(held))}–{short_bytes(max(held))}"
    return f", each over what the process held before its rung ({span}: weights, the gates' references)"


def memory_notes(results: Results) -> list[str]:
    """How the memory figures were had, and each memory rung's saving against the rung it built on."""
    measured = [r for r in results.rungs if r.ok and r.saved_activation_bytes is not None]
    if not measured:
        return []
    steps = results.config.run.memory.steps
    out = ["memory: `saved act` is what one forward kept for backward (saved-tensor hooks, each storage once, "
           "parameters left out); `pred act` the same from the shapes (eager autograd's saves)"
           + (f"; `peak mem` marked rss: the resident set's rise during {steps} steps over what the process held "
              "before them, in a child process" if any(r.resident_rise is not None for r in measured)
              else "")
           + (f"; `peak mem` is CUDA's peak allocated, then ({RESERVED} ...) its peak reserved, which holds CUDA "
              "graphs' memory pools" if any(r.peak_reserved_bytes is not None for r in measured) else "")
           + _held_note(measured) + "."]
    by_name = {r.name: r for r in results.rungs}
    for r in measured:
        base = by_name.get(r.built_on or "")
        if r.kind != "memory" or base is None or base.saved_activation_bytes is None:
            continue
        text = (f"{r.name}: saved activations {short_bytes(r.saved_activation_bytes)} vs {base.name}'s "
                f"{short_bytes(base.saved_activation_bytes)} ({_ratio(r.saved_activation_bytes, base.saved_activation_bytes)}"
                f"; predicted {_ratio(r.predicted_activation_bytes, base.predicted_activation_bytes)})")
        if r.resident_rise is not None and base.resident_rise is not None:
            text += (f"; the step's resident rise {short_bytes(r.resident_rise)} vs {short_bytes(base.resident_rise)} "
                     f"({_ratio(r.resident_rise, base.resident_rise)})")
        elif r.peak_memory_bytes and base.peak_memory_bytes:
            text += (f"; peak {short_bytes(r.peak_memory_bytes)} vs {short_bytes(base.peak_memory_bytes)} "
                     f"({_ratio(r.peak_memory_bytes, base.peak_memory_bytes)})")
        out.append(text + ".")
    out.extend(f"{r.name}: {part}." for r in results.rungs if r.ok for part in r.memory_note.split("; ")
               if part.endswith(MISSING) or MISSING + ":" in part)
    return out


# -- report.html --------------------------------------------------------------------------------


def memory_chart(results: Results) -> str | None:
    """Saved activations (measured and predicted) and the step's resident rise per rung, as inline SVG."""
    from speedladder.report.htmlkit import _figure, svg

    recs = [r for r in results.rungs if r.ok and r.role != Role.CONTROL and r.saved_activation_bytes is not None]
    if not recs:
        return None
    fig, (ax,) = _figure(max(5.0, 1.3 * len(recs) + 2), 3.6)
    series = (("saved activations", "saved_activation_bytes", "#1f6fb4"),
              ("predicted from shapes", "predicted_activation_bytes", "#ff7f0e"),
              ("resident rise during the step", "resident_rise", "#8c8c8c"))
    for k, (name, attr, colour) in enumerate(series):
        ax.bar([i + (k - 1) * 0.27 for i in range(len(recs))],
               [(getattr(r, attr) or 0) / 2**20 for r in recs], width=0.27, color=colour, label=name)
    ax.set_xticks(range(len(recs)), [r.name for r in recs])
    ax.set_ylabel("MiB")
    ax.legend(fontsize=8, frameon=False)
    fig.tight_layout()
    return svg(fig, "memory-meters")


def _record_fields(r: RungResult) -> dict[str, object]:
    """A rung record's fields by name, with what a file of another version keeps in its extra."""
    return {**{f.name: getattr(r, f.name) for f in dataclasses.fields(r) if f.name != "extra"}, **r.extra}


def memory_fields(recs: Sequence[RungResult]) -> list[str]:
    """Memory figures present on the rung records beyond peak memory (e.g. saved-activation bytes), by field name;
    a nested memory record's numbers (in a file of another version) as "field.key", one column each."""
    keys: list[str] = []
    for r in recs:
        for k, v in _record_fields(r).items():
            if k == "peak_memory_bytes" or k in keys:
                continue
            if (k.endswith("_bytes") or "memory" in k) and (v is None or isinstance(v, (int, float))):
                keys.append(k)
            elif "memory" in k and isinstance(v, dict):
                keys.extend(f"{k}.{kk}" for kk, vv in v.items()
                            if (vv is None or isinstance(vv, (int, float))) and f"{k}.{kk}" not in keys)
    return keys


def field_of(r: RungResult, key: str) -> object:
    """The value of one of memory_fields' names on a record; None where it has none."""
    first, _, rest = key.partition(".")
    v = _record_fields(r).get(first)
    return (v.get(rest) if isinstance(v, dict) else None) if rest else v
