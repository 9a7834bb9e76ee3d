"""The one call from `speedladder judge` into the gates (verify/gates.py), in the candidate's worker: the candidate's
step checked against eager fp32 at its shape and its float64 truth, as the ladder checks a rung."""

from __future__ import annotations

from collections.abc import Callable

from speedladder.progress import Progress
from speedladder.records import Gate
from speedladder.step.train_step import TrainStep
from speedladder.step.workload import Workload
from speedladder.verify.gates import Gates


def gate(work: Workload, step: TrainStep, progress: Progress, say: Callable[[str], None]) -> Gate:
    """Every gate that applies to the step, against eager fp32 of its shape (nothing below it to compare with: the
    base is raced, not gated)."""
    gates = Gates(work, progress)
    try:
        gate_record, _ = gates.check(step, None, None, None, say)  # its shape's reference, made there
    finally:
        gates.release()  # the references' models go before the candidate is raced
    return gate_record
