"""MFU in the report: the table's cell, marked where the peak was measured here, and the note naming each peak."""

from __future__ import annotations

from speedladder.measure.peakflops import is_measured
from speedladder.records import RungResult

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
