"""The price of the kinks a probe cannot avoid (verify/flip_pricing.py, the `flip_pricing` switch): where every
sequence holds one, a rung that only re-rounds passes because each flip is allowed for, gradient by gradient;
switched off, a rung that crosses one of them fails (docs/measurement.md, rule 12)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import plant, swap_attention
from planted import ISA, WrongScale, cross_the_kink, plant_a_kink_in_every_row, skip_last_block

from speedladder.config.run import GateConfig, RunConfig
from speedladder.progress import Progress
from speedladder.rungs import rounding_fuzz
from speedladder.step.workload import prepare
from speedladder.verify import curves, flip_pricing, kink_census
from speedladder.verify.gates import Gates
from speedladder.verify.tolerance import ALL_ON, Refinements


def _everywhere_kinked(refine: Refinements = ALL_ON):
    """The reference over one gate batch whose every sequence holds a planted kink: the probe cannot move."""
    work = prepare(RunConfig(preset="tiny", device="cpu", gates=GateConfig(loss_steps=1)))
    curve = plant_a_kink_in_every_row(work)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(curves, "loss_curve", curve)
        gates = Gates(work, Progress(quiet=True), refine)
        ref = gates.reference(work.base_spec)
    return work, gates, ref, curve.planted


@pytest.fixture(scope="module")
def everywhere():
    return _everywhere_kinked()


@ISA
def test_kinks_the_probe_cannot_avoid_are_priced_into_the_allowance(everywhere, monkeypatch):
    """Every sequence of the only gate batch holds an element within rounding of a ReLU's kink: the probe stays, the
    flips of those elements are priced in float64 and allowed for, gradient by gradient. The fuzz then passes at
    every seed; wrong rungs are still caught."""
    work, gates, ref, _ = everywhere
    census = ref.kinks["probe"]
    assert census.near >= 4 and census.priced >= 4 and "no sequence" in census.detail, census
    assert ref.fp64 is not None and ref.fp64.flips["probe"], "no price for the remaining kinks"
    for seed in range(8):
        plant(monkeypatch, "fuzz", rounding_fuzz(seed=seed))
        gate, _ = gates.check(work.step(dataclasses.replace(work.base_spec, transforms=("fuzz",))), ref, ref.probe,
                              "eager", lambda m: None)
        assert gate.passed, f"seed {seed}: {gate.detail}"
    flips = ref.fp64.flips["probe"]  # what the flips could move each gradient by: the fc layer's first of all
    assert flips["blocks.0.mlp.fc.bias"] > 0 and flips["blocks.0.mlp.fc.weight"] > 0, flips
    for name, fn in {"wrong-scale": swap_attention(WrongScale), "skip-block": skip_last_block}.items():
        plant(monkeypatch, name, fn)
        wrong = dataclasses.replace(work.base_spec, transforms=(name,))
        assert not gates.check(work.step(wrong), ref, ref.probe, "eager", lambda m: None)[0].passed, name


@ISA
def test_a_rung_that_crosses_an_unavoidable_kink_passes_by_its_price_and_fails_without_it(everywhere,
                                                                                        monkeypatch):
    """The same reference with flip pricing switched off: a rung that only re-rounds and crosses one of the
    remaining kinks by construction passes where the flips were priced, and fails without the price."""
    work, gates, ref, planted = everywhere
    plant(monkeypatch, "cross-kink", cross_the_kink(planted, row=planted["row"]))
    spec = dataclasses.replace(work.base_spec, transforms=("cross-kink",))
    priced, _ = gates.check(work.step(spec), ref, ref.probe, "eager", lambda m: None)
    assert priced.passed, priced.detail
    _, unpriced_gates, unpriced, _ = _everywhere_kinked(Refinements(flip_pricing=False))
    assert not unpriced.truth.flips and unpriced.kinks["probe"].priced == 0
    gate, _ = unpriced_gates.check(work.step(spec), unpriced, unpriced.probe, "eager", lambda m: None)
    assert not gate.passed and "grad" in gate.detail, gate.detail


def test_the_price_of_a_flip_is_what_flipping_that_element_does_in_float64(everywhere):
    """flip_allowance against an independent reckoning: the planted element's pre-activation moved across 0 by
    twice its own size (a change far below rounding, that flips ReLU's gradient there), gradients taken again in
    float64. For one element every random sign gives the same norm: the price is FLIP_K times it."""
    work, _, ref, _ = everywhere
    step64 = work.step(work.base_spec, dtype=torch.float64)
    weights, batch = ref.probe_weights, ref.batch
    remaining = ref.remaining["probe"]
    (place, idx), *_ = [(k, v) for k, v in remaining.flippable.items()]
    one = kink_census.Count(near=1, flippable={place: idx[:1]})
    priced = flip_pricing.flip_allowance(step64, weights, batch, one)
    before = flip_pricing._gradients(step64, weights, batch, None)
    flat = int(idx[0])

    def across(_m, _a, out):
        out = out.clone()
        out.view(-1)[flat] = -out.view(-1)[flat]
        return out
    handle = dict(step64.model.named_modules())["blocks.0.mlp.fc"].register_forward_hook(across)
    after = flip_pricing._gradients(step64, weights, batch, None)
    handle.remove()
    moved = {n: float((after[n] - before[n]).norm()) for n in before}
    assert max(moved.values()) > 0, "the flip moved no gradient: the plant tests nothing"
    # The forward moved too, by 2|z| (about 1e-8): what it moves downstream is far below the flip's own effect.
    for n, m in moved.items():
        assert priced[n] == pytest.approx(flip_pricing.FLIP_K * m, rel=1e-3, abs=1e-4 * max(moved.values())), n
