"""Eager fp32's reference (verify/reference.py): one fp32 and one float64 model, phases timed and recorded; at a
batch built of micro-batches the function judged per micro-batch and the accumulation on its own; the curve's
least scale measured only when a curve needs it; the rounding fuzz as hooks put on and taken off
(docs/measurement.md, rules 12 and 16)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch
from conftest import cli, plant
from planted import ISA, gated
from torch import nn

from speedladder.progress import Progress
from speedladder.rungs import RungError, rounding_fuzz
from speedladder.rungs.fuzz import attach
from speedladder.verify import curves, probes, reference
from speedladder.verify.gates import Gates

DATA = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.fixture(scope="module")
def bench(tiny):
    return gated(tiny)


def test_the_reference_trains_is_deterministic_and_records_what_each_phase_cost(tiny, bench):
    gates, ref, _, _ = bench
    assert len(ref.curve) == tiny.cfg.run.gates.loss_steps
    assert ref.curve[-1] < ref.curve[0] - 0.1  # 20 steps at lr 1e-3 already lower the loss
    # The equivalence weights are the trained ones, not the near-zero initial logits.
    assert float(ref.logits.std()) > 0.2
    again = Gates(tiny, Progress(quiet=True)).reference(tiny.base_spec)
    assert again.curve == ref.curve and again.truth.curve == ref.truth.curve
    phases = list(ref.seconds)
    assert phases[:2] == ["eager fp32 model and gate batches", "eager fp32 curve"], phases
    for phase in ("float64 model", "kink census", "eager fp32 outputs", "float64 curve", "float64 outputs"):
        assert phase in phases, phases
    assert phases.index("kink census") < phases.index("eager fp32 outputs") < phases.index("float64 curve")
    cost = gates.costs[tiny.base_spec]
    assert cost.total_s == pytest.approx(sum(cost.seconds.values()), abs=1e-2) and cost.steps == len(ref.curve)


def test_one_fp32_and_one_float64_model_serve_every_phase(tiny, monkeypatch):
    """The reference, the emulated scale and the explanation reuse the same two models until they are released."""
    built: list[torch.dtype | None] = []
    real = type(tiny).step

    def step(self, spec, wrap=None, device=None, dtype=None):
        built.append(dtype)
        return real(self, spec, wrap, device, dtype)
    monkeypatch.setattr(type(tiny), "step", step)
    gates = Gates(tiny, Progress(quiet=True))
    ref = gates.reference(tiny.base_spec)
    bf16 = dataclasses.replace(tiny.base_spec, autocast="bf16")
    built.clear()
    gates.eager_at(bf16, ref)
    assert built == []  # the emulation ran on the reference's own fp32 model
    gates.release()
    gates.eager_at(dataclasses.replace(bf16, transforms=("sdpa",)), ref)  # cached: nothing built again
    assert built == []


def test_the_rounding_fuzz_as_hooks_leaves_the_model_as_it_was(tiny):
    step = tiny.step(tiny.base_spec)
    batch = tiny.gate_batches(tiny.base_spec, 1)[0]
    plain = probes.outputs(step, tiny.init, batch, 2)
    remove = attach(step.model, seed=3)
    fuzzed = probes.outputs(step, tiny.init, batch, 2)
    remove()
    after = probes.outputs(step, tiny.init, batch, 2)
    assert not torch.equal(fuzzed[0], plain[0])  # it re-rounded while on ...
    assert torch.equal(after[0], plain[0]) and all(torch.equal(after[2][n], g) for n, g in plain[2].items())  # ... off


def test_the_fuzz_rerounds_by_the_unit_roundoff_of_each_format():
    """(1 + u) with u ~ 2^-24 in fp32 and 2^-8 in bf16: measured, not assumed."""
    x = torch.full((1 << 16,), 3.0)
    model = rounding_fuzz(seed=7)(nn.Identity())
    for dtype, unit in ((torch.float32, 2.0 ** -24), (torch.bfloat16, 2.0 ** -8)):
        rel = (model(x.to(dtype).requires_grad_()).detach().double() / 3.0 - 1)
        assert 0.3 * unit < float(rel.std()) < 3 * unit, (dtype, float(rel.std()))
    again = rounding_fuzz(seed=7)(nn.Identity())
    torch.testing.assert_close(again(x), rounding_fuzz(seed=7)(nn.Identity())(x), rtol=0, atol=0)  # seeded
    big = torch.full((5 << 20,), 3.0)  # more than the table holds: it wraps, and still re-rounds every element
    rel = rounding_fuzz(seed=7)(nn.Identity())(big).double() / 3.0 - 1
    assert float(rel.abs().max()) <= 2.0 ** -23 and float(rel.std()) > 0.3 * 2.0 ** -24


@pytest.mark.parametrize("scale", [0, -1, math.nan, "1"])
def test_a_fuzz_magnitude_that_is_not_a_positive_number_is_refused(scale):
    with pytest.raises(RungError, match="positive number"):
        rounding_fuzz(scale=scale)


def test_the_example_rung_file_refuses_a_bad_magnitude_in_one_line(monkeypatch):
    monkeypatch.setenv("FUZZ_SCALE", "-2")
    rc, out, err = cli("run", "--preset", "tiny", "--device", "cpu", "--rung-file", "docs/examples/rounding_fuzz.py",
                       "--rungs", "eager,fuzz", "--quiet")
    assert rc == 2 and "positive number" in err and "Traceback" not in err + out
    assert len(err.strip().splitlines()) == 1, err


@ISA
@pytest.mark.parametrize("position", ["eager", "bf16"])
def test_the_rounding_fuzz_passes_every_gate_at_every_seed(tiny, bench, monkeypatch, position):
    from planted import check_after

    for seed in (0, 1, 2):
        plant(monkeypatch, "fuzz", rounding_fuzz(seed=seed))
        gate = check_after(tiny, bench, position, ("fuzz",))
        assert gate.passed, f"seed {seed}: {gate.detail}"


# -- a batch built of micro-batches ------------------------------------------------------------------------

def test_at_a_big_batch_the_function_is_the_workload_batchs_and_the_curve_is_accumulated(tiny, bench):
    """The batch rung's reference: its outputs, census and truth are the workload batch's, on the probe rolled so
    that each micro-batch holds the same clean sequences in another order; its loss curve, over the same tokens as
    the workload batch's, is accumulated over micro-batches and is the one big batch's."""
    gates, ref, _, _ = bench
    m = 2
    big = dataclasses.replace(tiny.base_spec, batch_size=m * tiny.cfg.batch_size)
    assert gates.micro_batch(big.batch_size) == tiny.cfg.batch_size  # the workload's batch: it ran as the baseline
    assert gates.micro_batch(tiny.cfg.batch_size) is None and gates.micro_batch(tiny.cfg.batch_size + 1) is None
    at = gates.reference(big)
    k = tiny.cfg.run.gates.loss_steps
    assert len(at.curve) == reference.curve_steps(k, m) == k // m and at.micro == tiny.cfg.batch_size
    assert at.weights is ref.weights and at.grads is ref.grads and at.kinks is ref.kinks  # the function's reference
    x = at.batch[0]
    assert x.shape[0] == big.batch_size
    for j in range(m):  # each micro-batch: the workload probe's sequences, rolled j rows
        torch.testing.assert_close(x[j * tiny.cfg.batch_size:(j + 1) * tiny.cfg.batch_size], ref.batch[0].roll(-j, 0))
    # The accumulated curve is the one big batch's: fp32 with the sums reordered (on the tiny preset within 1.5e-7
    # relative, 2026-12-01; 1e-5 leaves room for another CPU's kernels, 10x under the fp32 gate's own floor).
    whole = curves.loss_curve(tiny.step(big), at.batches)
    torch.testing.assert_close(torch.tensor(at.curve), torch.tensor(whole), rtol=1e-5, atol=0)
    # A rung at the big batch computes, per micro-batch, the workload batch's outputs: loss and gradients equal.
    step = tiny.step(big)
    loss = probes.outputs(step, ref.weights, at.batch, at.probe_rows)[1]
    assert loss == pytest.approx(ref.loss, rel=1e-5)
    assert gates.costs[big].function_at == tiny.cfg.batch_size and "eager fp32 outputs" not in gates.costs[big].seconds


@ISA
def test_at_a_big_batch_right_rungs_and_the_fuzz_pass_and_wrong_ones_fail(tiny, bench, monkeypatch):
    from conftest import swap_attention
    from planted import WrongScale, skip_last_block

    gates, _, _, _ = bench
    big = dataclasses.replace(tiny.base_spec, batch_size=2 * tiny.cfg.batch_size)
    eager, mine = gates.check(tiny.step(big), None, None, None, lambda m: None)  # the batch rung on eager: causality
    assert eager.reference and eager.passed, eager.detail
    for names in (("sdpa",), ("activation-checkpointing",)):
        gate, _ = gates.check(tiny.step(dataclasses.replace(big, transforms=names)), None, mine, "batch",
                              lambda m: None)
        assert gate.passed, (names, gate.detail)
    for seed in (0, 1, 2):
        plant(monkeypatch, "fuzz", rounding_fuzz(seed=seed))
        gate, _ = gates.check(tiny.step(dataclasses.replace(big, transforms=("fuzz",))), None, mine, "batch",
                              lambda m: None)
        assert gate.passed, (seed, gate.detail)
    for name, fn in {"wrong-scale": swap_attention(WrongScale), "skip-block": skip_last_block}.items():
        plant(monkeypatch, name, fn)
        gate, _ = gates.check(tiny.step(dataclasses.replace(big, transforms=(name,))), None, mine, "batch",
                              lambda m: None)
        assert not gate.passed, name


def test_the_accumulation_is_checked_on_its_own(tiny, bench):
    """A big batch that trains on its first micro-batch alone computes each micro-batch's function right (the
    rolled probe's micro-batches hold the same sequences: its outputs are the workload batch's), and its loss curve
    over distinct micro-batches says it does not train as the big batch should."""
    gates, _, _, _ = bench
    micro = tiny.cfg.batch_size
    big = dataclasses.replace(tiny.base_spec, batch_size=2 * micro, optimizer="adamw-foreach")
    step = tiny.step(big)
    whole = step._micro_steps
    step._micro_steps = lambda x, y, *rest: whole(x[:micro], y[:micro], *rest)  # type: ignore[method-assign]
    gate, _ = gates.check(step, None, None, None, lambda m: None)
    assert gate.equivalence.passed, gate.equivalence.detail
    assert not gate.passed and not gate.differential.passed, gate.detail
    assert gate.differential.curve_rel > 10 * gate.differential.curve_allowed


def _lr_times(step, factor: float):
    """The step's optimizer at `factor` x its learning rate: the same update rule, a curve that differs."""
    fresh = step._new_optimizer

    def made():
        opt = fresh()
        for group in opt.param_groups:
            group["lr"] *= factor
        return opt
    step._new_optimizer = made  # type: ignore[method-assign]
    step.reset()
    return step


# -- the curve's least scale ---------------------------------------------------------------------------------

def test_the_curves_least_scale_is_measured_only_when_a_curve_needs_it(tiny, monkeypatch):
    """eager fp32 re-rounded can only widen a curve's allowance: a curve that passes on eager's own distance never
    pays for it; one that would fail asks for it once per reference, and is judged again with it (recorded as
    `spread`)."""
    gates = Gates(tiny, Progress(quiet=True))
    ref = gates.reference(tiny.base_spec)
    calls: list[int] = []

    def planted_spread(step, r) -> float:  # a spread that covers the rung below, counted
        calls.append(1)
        return 1.0
    monkeypatch.setattr(reference, "spread", planted_spread)
    sdpa = dataclasses.replace(tiny.base_spec, transforms=("sdpa",))
    gate, _ = gates.check(tiny.step(sdpa), ref, ref.probe, "eager", lambda m: None)
    assert gate.passed and calls == [] and gate.differential.fp64.curve.spread is None
    # A rung whose every update is 5% larger: its curve strays from fp64 by far more than 10x eager's own distance;
    # judged again with a spread (planted, 1.0) that covers it, it passes, and the spread is recorded.
    off = dataclasses.replace(tiny.base_spec, optimizer="adamw-foreach")
    for _ in range(2):
        gate, _ = gates.check(_lr_times(tiny.step(off), 1.05), ref, ref.probe, "eager", lambda m: None)
    curve = gate.differential.fp64.curve
    assert calls == [1] and curve.spread == 1.0 and curve.allowed >= 10.0 and curve.rung < 10.0, curve
    assert gate.differential.passed and ref.truth.curve_spread == 1.0


# -- the loss band compares a rung's own curve with the reference's ---------------------------------------------

def test_the_loss_band_compares_the_rungs_own_curve_with_the_references(tiny, bench):
    """A rung whose curve differs from eager's by an amount measured apart shows exactly that difference: the band's
    curve is the rung's own step trained over the gate batches, its reference curve eager fp32's, never one
    curve against itself."""
    gates, ref, _, _ = bench
    spec = dataclasses.replace(tiny.base_spec, optimizer="adamw-foreach")
    gate, _ = gates.check(_lr_times(tiny.step(spec), 1.01), ref, ref.probe, "eager", lambda m: None)
    band = gate.loss_band
    own = curves.loss_curve(_lr_times(tiny.step(spec), 1.01), ref.batches)
    eager = curves.loss_curve(tiny.step(tiny.base_spec), ref.batches)
    assert list(band.losses) == own and list(band.ref_losses) == eager == ref.curve
    assert band.max_rel_diff == pytest.approx(max(abs(a - b) / b for a, b in zip(own, eager)))
    assert band.max_rel_diff > 0


def test_the_h200_gpt2_curves_equal_to_the_last_bit_came_from_rungs_that_ran_their_own_kernels():
    """On the H200's GPT-2 page (the H200 run of 2026-12-04 at 837fae3) sdpa, fused AdamW and pad-vocab showed a loss
    curve equal to eager's to the last bit. Their outputs say they ran their own kernels: each rung's logits lie at
    a distance from fp64 of their own, not eager's. The loss and the curve are means over 16,384 tokens in fp32,
    over 2 steps, the first at the initial weights and the second after AdamW's first update (about lr x the
    gradient's sign, deaf to rounding): a logits difference of 2.5e-7 moves such a mean by far less than half a
    unit in its last place."""
    rungs = json.loads((DATA / "h200-gpt2-gates.json").read_text())["rungs"]
    eager_logits = rungs["sdpa"]["equivalence_fp64"]["logits"]["eager"]
    for name, r in rungs.items():
        band, eq = r["loss_band"], r["equivalence_fp64"]
        assert band["max_rel_diff"] == 0.0 and band["losses"] == band["ref_losses"] and len(band["losses"]) == 2
        assert eq["logits"]["rung"] != eager_logits, name  # not eager's logits: its own kernels ran
        assert eq["loss"]["rung"] == eq["loss"]["eager"], name  # ... and the mean over 16,384 tokens agreed
        # A mean over the tokens averages their rounding differences down by about sqrt(tokens): at these losses,
        # in [8, 16), fp32's last place is 2^-20, so half of it is more than 2^-25 of the loss, over 5x that.
        tokens, rel = r["tokens"], r["logits_rel_err"]
        assert all(8 <= v < 16 for v in band["losses"]), band
        assert rel / math.sqrt(tokens) < 2.0 ** -25 / 5, name
