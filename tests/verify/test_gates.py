"""The gates of a run (verify/gates.py): each rung's gate says what it built and what that cost; a gate that cannot
run fails, saying why, and keeps the rung's speed; verify/ falls back in two places at most, each recorded
(docs/measurement.md, rules 7 and 16)."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import torch

from speedladder.progress import Progress
from speedladder.verify import bisection, gate_rule
from speedladder.verify.gates import Gates

VERIFY = Path(__file__).resolve().parents[2] / "src" / "speedladder" / "verify"


def test_verify_falls_back_in_two_places_at_most():
    """A broad except hides a failure far from its cause: verify/ keeps two, the reference's (float64 or the census
    cannot run: eager fp32 stands in, or the probe is unexamined) and the gate's (it cannot run: failed), each
    saying why in the record."""
    broad = []
    for path in sorted(VERIFY.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ExceptHandler) and (
                    node.type is None or (isinstance(node.type, ast.Name) and node.type.id in ("Exception",
                                                                                               "BaseException"))):
                broad.append(f"{path.name}:{node.lineno}")
    assert len(broad) <= 2, broad
    assert {b.split(":")[0] for b in broad} == {"reference.py", "gates.py"}, broad


def test_a_gate_records_the_reference_it_built_and_what_each_phase_cost(tiny):
    gates = Gates(tiny, Progress(quiet=True))
    sdpa = dataclasses.replace(tiny.base_spec, transforms=("sdpa",))
    first, _ = gates.check(tiny.step(sdpa), None, None, None, lambda m: None)
    (cost,) = first.references
    assert (cost.batch_size, cost.seq_len, cost.micro, cost.steps) == (tiny.cfg.batch_size, tiny.cfg.seq_len, None,
                                                                      tiny.cfg.run.gates.loss_steps)
    assert cost.seconds and cost.total_s > 0
    again, _ = gates.check(tiny.step(dataclasses.replace(sdpa, optimizer="adamw-foreach")), None, None, None,
                           lambda m: None)
    assert again.passed and again.references == []  # the reference is kept: built once per shape


def test_the_references_models_go_when_released_and_come_back_when_needed(tiny):
    gates = Gates(tiny, Progress(quiet=True))
    ref = gates.reference(tiny.base_spec)
    assert gates._models  # the fp32 and the float64 model the phases shared
    gates.release()
    assert not gates._models
    gate, _ = gates.check(tiny.step(dataclasses.replace(tiny.base_spec, autocast="bf16")), ref, ref.probe, "eager",
                          lambda m: None)
    assert gate.passed and gates._models  # the emulated scale built the fp32 model again


def test_a_gate_that_cannot_run_fails_and_says_why(tiny, monkeypatch):
    gates = Gates(tiny, Progress(quiet=True))
    ref = gates.reference(tiny.base_spec)

    def oom(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 8.00 GiB")
    monkeypatch.setattr(gate_rule, "verdict", oom)
    gate, probe = gates.check(tiny.step(dataclasses.replace(tiny.base_spec, transforms=("sdpa",))), ref, ref.probe,
                              "eager", lambda m: None)
    assert not gate.passed and probe is None and gate.detail == "the gates could not run: ran out of memory"


def test_a_reference_that_cannot_be_made_fails_every_gate_of_its_shape_without_trying_again(tiny, monkeypatch):
    gates = Gates(tiny, Progress(quiet=True))
    tries: list[int] = []

    def broken(spec, dtype=torch.float32):
        tries.append(1)
        raise RuntimeError("no model today")
    monkeypatch.setattr(gates, "model", broken)
    sdpa = dataclasses.replace(tiny.base_spec, transforms=("sdpa",))
    for _ in range(2):
        gate, _ = gates.check(tiny.step(sdpa), None, None, None, lambda m: None)
        assert not gate.passed and "no model today" in gate.detail, gate.detail
    assert tries == [1]


def test_an_explanation_that_cannot_run_keeps_the_verdict_and_says_why(tiny, monkeypatch):
    from conftest import plant, swap_attention
    from planted import WrongScale

    gates = Gates(tiny, Progress(quiet=True))
    ref = gates.reference(tiny.base_spec)
    plant(monkeypatch, "wrong-scale", swap_attention(WrongScale))

    def broken(*args, **kwargs):
        raise RuntimeError("no hooks here")
    monkeypatch.setattr(bisection, "explain", broken)
    gate, _ = gates.check(tiny.step(dataclasses.replace(tiny.base_spec, transforms=("wrong-scale",))), ref,
                          ref.probe, "eager", lambda m: None)
    assert not gate.passed and not gate.differential.passed
    assert gate.explanation is not None and "no hooks here" in gate.explanation.summary


def test_the_gate_lines_say_what_the_reference_and_each_step_cost(tiny):
    """`speedladder gates` and report.html read the costs back from the record: the reference this gate built,
    phase by phase, and the rule's steps."""
    from speedladder.records import RungResult
    from speedladder.report.gate_details import cost_notes, gate_lines
    from speedladder.step.workload import new_results

    gates = Gates(tiny, Progress(quiet=True))
    sdpa = dataclasses.replace(tiny.base_spec, transforms=("sdpa",))
    gate, _ = gates.check(tiny.step(sdpa), None, None, None, lambda m: None)
    lines = gate_lines("sdpa", gate)
    built = next(line for line in lines if "built the eager fp32 reference" in line)
    assert f"B={tiny.cfg.batch_size}" in built and "eager fp32 curve" in built and "float64 curve" in built
    assert any(line.strip().startswith("its steps: outputs") for line in lines), lines
    r = RungResult(name="sdpa", rung="sdpa", role="rung", reason="", kind="speed", built_on=None, spec=sdpa,
                   precision="fp32", requirement={}, status="ok", gate=gate)
    saved = new_results(tiny)
    saved.rungs = [r]
    notes = cost_notes(saved)
    assert any("sdpa's gate built the eager fp32 reference" in n for n in notes), notes
