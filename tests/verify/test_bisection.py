"""A failed gate explains itself (verify/bisection.py, the `bisection` switch): it names the module where the
divergence starts, tells a change of function from a flip at a kink, and gives the command that re-runs the gates
alone; switched off, a failure names no module (docs/measurement.md, rule 12)."""

from __future__ import annotations

import dataclasses

import pytest
from browser import visit
from conftest import cli, plant, swap_attention
from planted import NoCausalMask, WrongScale, check_after, gated, skip_last_block
from test_emulated_precision import _drop_grad_under_autocast

from speedladder.progress import Progress
from speedladder.verify.gates import Gates
from speedladder.verify.tolerance import Refinements


@pytest.fixture(scope="module")
def bench(tiny):
    return gated(tiny)


PLANTS = {"no-causal-mask": swap_attention(NoCausalMask), "wrong-scale": swap_attention(WrongScale),
          "skip-block": skip_last_block}


@pytest.mark.parametrize("transform, check, module", [
    ("wrong-scale", "equivalence", "blocks.0.attn"),
    ("skip-block", "equivalence", "blocks.1"),
    ("no-causal-mask", "causality", "blocks.0.attn"),
])
def test_a_failed_gate_names_where_the_divergence_starts(tiny, bench, monkeypatch, transform, check, module):
    plant(monkeypatch, transform, PLANTS[transform])
    gate = check_after(tiny, bench, "eager", (transform,))
    e = gate.explanation
    assert not gate.passed and e is not None and e.check == check, gate
    assert e.module is not None and e.module.startswith(module), e
    if check != "causality":  # a wrong function is wrong at a second probe too
        assert e.kind == "function" and "fails too" in e.second_probe, e
        assert e.rung > e.allowed, e
    assert e.module in e.summary
    assert gate.seconds.get("bisection", 0) > 0  # what the explanation cost, beside the rule's own steps


def test_with_bisection_switched_off_a_failure_names_no_module(tiny, bench, monkeypatch):
    """The same failure, the same verdict, and no explanation: bisection decides nothing, it only says where."""
    plant(monkeypatch, "wrong-scale", PLANTS["wrong-scale"])
    _, ref, _, _ = bench
    off = Gates(tiny, Progress(quiet=True), Refinements(bisection=False))
    gate, _ = off.check(tiny.step(dataclasses.replace(tiny.base_spec, transforms=("wrong-scale",))), ref, ref.probe,
                        "eager", lambda m: None)
    assert not gate.passed and gate.explanation is None and "bisection" not in gate.seconds


def test_a_fault_after_the_modules_is_named_as_such(tiny, bench, monkeypatch):
    """A gradient dropped after the backward: every module stays in the band; the parameter is named."""
    gates, ref, _, _ = bench
    _drop_grad_under_autocast(monkeypatch)
    gate, _ = gates.check(tiny.step(dataclasses.replace(tiny.base_spec, autocast="bf16")), ref, ref.probe, "eager",
                          lambda m: None)
    e = gate.explanation
    assert e is not None and e.module is None and "blocks.0.attn.qkv.weight itself" in e.summary, e


@pytest.mark.slow
def test_the_gates_command_reruns_one_rung_alone_and_the_page_shows_why(tmp_path):
    """A user's wrong rung fails in a run; the run's notes, results.json and report.html name where its divergence
    starts and the command; that command re-runs its gates alone: exit 1 for it, 0 for a rung that passed."""
    (tmp_path / "off.py").write_text(SCALE_OFF_RUNG)
    rc, out, err = cli("run", "--preset", "tiny", "--device", "cpu", "--no-profile", "--window-steps", "2", "--loss-steps",
                       "4", "--learns-steps", "0", "--rung-file", str(tmp_path / "off.py"), "--rungs",
                       "eager,scale-off,sdpa", "--out", str(tmp_path / "runs"), "--quiet")
    assert rc == 0, err
    (run_dir,) = (tmp_path / "runs").iterdir()
    command = f"speedladder gates {run_dir} scale-off"
    assert "scale-off: why — the divergence starts at blocks.0.attn" in out and command in out, out
    page = (run_dir / "report.html").read_text()
    assert "divergence starts at" in page and command in page and "kink census" in page

    def look(p) -> None:  # in Chromium: the gates section shows the module and the command, as drawn
        text = p.locator("#gates").inner_text()
        assert "divergence starts at blocks.0.attn" in text and command in text, text[:2000]
    requests, errors = visit(run_dir / "report.html", look)
    assert requests == [] and errors == []
    rc, out, _ = cli("gates", str(run_dir), "scale-off", "--quiet")
    assert rc == 1 and "FAILED" in out and "again, alone: " + command in out, out
    rc, out, _ = cli("gates", str(run_dir), "sdpa", "--quiet")
    assert rc == 0 and "sdpa: gate passed" in out, out
    rc, _, err = cli("gates", str(run_dir), "nope", "--quiet")
    assert rc == 2 and "no rung 'nope'" in err


SCALE_OFF_RUNG = """
import torch.nn.functional as F
import speedladder
from speedladder.models.gpt import merge_heads, split_heads
from speedladder.rungs import SDPAttention


class Off(SDPAttention):
    def forward(self, x):
        q, k, v = split_heads(self.qkv(x), self.n_head)
        scale = 1.001 / q.size(-1) ** 0.5  # off by 1e-3
        return self.proj(merge_heads(F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)))


@speedladder.rung("scale-off", "attention's scale off by 1e-3: wrong everywhere, a little", kind="speed")
def off(model):
    for b in model.blocks:
        b.attn = Off(b.attn)
    return model
"""
