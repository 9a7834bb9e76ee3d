"""MFU in the report: against one peak per device (the table's column, named in its header), and against each row's
own precision (the details' cell, marked where the peak was measured here), with the notes naming each peak."""

from __future__ import annotations

from dataclasses import dataclass

from speedladder.measure import peakflops
from speedladder.measure.peakflops import is_measured
from speedladder.records import Results, RungResult

MEASURED_MARK = " meas"  # on an MFU taken against the matmul ceiling measured here (no datasheet entry)


def tflops_text(v: float) -> str:
    """TFLOP/s to read: 1,979 and 66.9 for a GPU, 0.213 for a CPU."""
    return f"{v:,.0f}" if v >= 100 else f"{v:.3g}"


def mfu_cell(r: RungResult) -> str:
    if r.mfu is None:
        return "n/a"
    return f"{100 * r.mfu:.1f}%" + (MEASURED_MARK if is_measured(r.peak_basis) else "")


def mfu_notes(rungs: list[RungResult]) -> list[str]:
    """Which peak each MFU is taken against: one line per basis (the datasheet's, the one given, or the ceiling
    measured here) with its peak at each precision, and a line of its own for each fp8 rung's blend."""
    out = []
    if rungs and all(r.mfu is None for r in rungs) and not any(r.peak_basis for r in rungs):
        out.append("MFU n/a: no peak FLOP/s is known for this device; --peak-tflops sets one.")
    by_basis: dict[str, dict[str, float]] = {}
    for r in rungs:
        if r.peak_tflops is None:
            if r.peak_basis:  # a peak that could not be had: why
                out.append(f"{r.name}: MFU n/a, {r.peak_basis}.")
        elif r.precision == "fp8" and r.peak_basis:  # a blend of its own FLOP shares
            mark = f"MFU marked{MEASURED_MARK} against " if is_measured(r.peak_basis) else "MFU against "
            out.append(f"{r.name}: {mark}{tflops_text(r.peak_tflops)} TFLOP/s, {r.peak_basis}.")
        elif r.peak_basis:  # files written before every basis was named leave it empty
            by_basis.setdefault(r.peak_basis, {}).setdefault(r.precision, r.peak_tflops)
    for basis, peaks in by_basis.items():
        mark = f"MFU marked{MEASURED_MARK}: against the " if is_measured(basis) else "MFU against the "
        out.append(mark + basis + ": " + ", ".join(f"{p} {tflops_text(v)}" for p, v in peaks.items()) + " TFLOP/s.")
    return out


# -- one peak per device -------------------------------------------------------------------------
# The table's MFU column is taken against one peak for every row, as nanoGPT, torchtitan and llm.c report it: the
# device's dense bf16 peak (fp16's on a device without bf16 units) where --peak-tflops or the datasheet gives it,
# else the highest matmul ceiling measured here at any precision the run used. Each row's MFU at its own precision
# (fp32's peak for an fp32 rung, a blend for fp8) is in the details.
DEVICE_PRECISIONS = ("bf16", "fp16")


@dataclass(frozen=True)
class DevicePeak:
    """The one peak a table's MFU column is taken against."""

    tflops: float
    precision: str
    basis: str  # where it comes from, in words

    @property
    def header(self) -> str:
        """The column's header: MFU and its peak, named."""
        return f"MFU vs {self.precision} {tflops_text(self.tflops)} TF"


def device_peak(results: Results) -> DevicePeak | None:
    """The run's one peak: given (--peak-tflops) or the datasheet's dense bf16 (else fp16) peak, else the highest
    peak its rungs were taken against (a ceiling measured here, never an fp8 blend); None where none is known."""
    env = results.environment
    given = results.config.run.peak_tflops or {}
    for p in DEVICE_PRECISIONS:
        if p in given:
            return DevicePeak(given[p], p, f"{p}, given by --peak-tflops")
    cap = env.cuda_capability
    capability = (cap[0], cap[1]) if cap and len(cap) == 2 else None
    sheet = peakflops.datasheet(env.device_name or "", capability) if env.device_type == "cuda" else None
    if sheet is not None:
        for p in DEVICE_PRECISIONS:
            if p in sheet.tflops:
                return DevicePeak(sheet.tflops[p], p, f"the {sheet.model}'s dense {p} peak (its datasheet)")
    recorded = [(r.peak_tflops, r.precision, r.peak_basis) for r in results.rungs
                if r.peak_tflops and r.precision != "fp8"]
    if not recorded:
        return None
    tflops, precision, basis = max(recorded)
    what = "measured here" if peakflops.is_measured(basis) else basis or "recorded"
    return DevicePeak(tflops, precision, f"the highest matmul peak of this run, {precision}'s, {what}")


def device_mfu_cell(r: RungResult, peak: DevicePeak | None) -> str:
    """A row's MFU against the device's one peak."""
    if peak is None or r.tflops is None:
        return "n/a"
    return f"{100 * r.tflops / peak.tflops:.1f}%"


def device_note(peak: DevicePeak | None) -> list[str]:
    if peak is None:
        return []
    return [(f"{peak.header}: every row against one peak, {peak.basis}; each against its own precision's peak: "
            "`MFU at its precision` (--wide, and report.html's details).")]
