"""Part 7: the correctness gates, and that they catch a wrong rung."""

from __future__ import annotations

import dataclasses
import math

import pytest
from conftest import plant

from speedladder.config.run import RunConfig
from speedladder.data import BatchStream, unigram_entropy
from speedladder.rungs import StepSpec
from speedladder.step import TrainStep
from speedladder.verify import correctness
from speedladder.workload import prepare


def no_causal_mask(model):
    """A deliberately wrong rung: attention may look at the future."""
    for block in model.blocks:
        block.attn.causal_mask.fill_(True)
    return model


def frozen(model):
    """A deliberately wrong rung: nothing trains."""
    for p in model.parameters():
        p.requires_grad_(False)
    model.wte.weight.requires_grad_(True)  # keep the loss differentiable
    return model


@pytest.fixture
def wrong_transforms(monkeypatch):
    plant(monkeypatch, "no-causal-mask", no_causal_mask)
    plant(monkeypatch, "frozen", frozen)


@pytest.fixture
def ref(tiny):
    return correctness.reference(tiny.step(StepSpec(4, 32)), tiny.gate_batches(StepSpec(4, 32), 20))


def step_for(tiny, **spec) -> TrainStep:
    return TrainStep(StepSpec(4, 32, **spec), tiny.cfg.model, tiny.init, tiny.device, tiny.cfg.run.lr)


def test_tolerances_are_per_dtype_and_explained():
    t = correctness.TOLERANCES
    assert set(t) == {"fp32", "tf32", "fp16", "bf16", "fp8"}
    assert t["fp32"].rtol < t["tf32"].rtol < t["bf16"].rtol < t["fp8"].rtol
    assert t["tf32"].rtol <= t["fp16"].rtol < t["bf16"].rtol  # fp16: tf32's mantissa, on every op autocast rounds
    assert t["tf32"].grad_rel <= t["fp16"].grad_rel < t["bf16"].grad_rel
    assert t["fp32"].grad_rel < t["tf32"].grad_rel < t["bf16"].grad_rel < t["fp8"].grad_rel
    assert all(tol.why for tol in t.values())


def test_reference_trains_and_is_deterministic(tiny, ref):
    assert len(ref.curve) == 20
    assert ref.curve[-1] < ref.curve[0] - 0.1  # 20 steps at lr 1e-3 already lower the loss
    again = correctness.reference(tiny.step(StepSpec(4, 32)), ref.batches)
    assert again.curve == ref.curve
    # The equivalence weights are the trained ones, not the near-zero initial logits.
    assert float(ref.logits.std()) > 0.2


def test_eager_and_bf16_pass_the_gates(tiny, ref):
    for spec in ({}, {"autocast": "bf16"}, {"autocast": "bf16", "transforms": ("activation-checkpointing",)}):
        step = step_for(tiny, **spec)
        eq = correctness.equivalence(step, ref)
        assert eq.passed, eq.detail
        band = correctness.loss_band(correctness.loss_curve(step, ref.batches), ref.curve, 0.02)
        assert band.passed, band.detail
    assert eq.precision == "bf16" and eq.logits_rel_err > 0  # bf16 is not bit-identical


def test_equivalence_catches_attention_that_sees_the_future(tiny, ref, wrong_transforms):
    eq = correctness.equivalence(step_for(tiny, transforms=("no-causal-mask",)), ref)
    assert not eq.passed
    assert eq.detail.startswith("logits: Tensor-likes are not close!")
    assert eq.logits_max_abs_err > eq.atol


def test_loss_band_catches_a_rung_that_does_not_train(tiny, ref, wrong_transforms):
    step = step_for(tiny, transforms=("frozen",))
    band = correctness.loss_band(correctness.loss_curve(step, ref.batches), ref.curve, 0.02)
    assert not band.passed
    assert band.max_rel_diff > 0.02
    assert "strays" in band.detail
    assert not correctness.equivalence(step, ref).passed  # its gradients are missing


def test_loss_band_arithmetic():
    assert correctness.loss_band([3.0, 2.0], [3.0, 2.02], 0.02).passed
    out = correctness.loss_band([3.0, 2.1], [3.0, 2.0], 0.02)
    assert not out.passed and out.max_rel_diff == pytest.approx(0.05)
    assert not correctness.loss_band([3.0, math.nan], [3.0, 2.0], 0.02).passed


def test_learns_check(tiny):
    stream = BatchStream(tiny.corpus, 4, 32, tiny.device, seed=0)
    eager = correctness.train_curve(step_for(tiny), stream, 120)
    again = correctness.train_curve(step_for(tiny), BatchStream(tiny.corpus, 4, 32, tiny.device, seed=0), 120)
    good = correctness.learns_check(again, eager, band=0.03, unigram_entropy=2.846)
    assert good.passed, good.detail
    assert good.final_loss == pytest.approx(good.eager_final_loss) and len(good.losses) == 120
    still = TrainStep(StepSpec(4, 32), tiny.cfg.model, tiny.init, tiny.device, lr=0.0)
    flat = correctness.train_curve(still, BatchStream(tiny.corpus, 4, 32, tiny.device, seed=0), 120)
    bad = correctness.learns_check(flat, eager, band=0.03, unigram_entropy=2.846)
    assert not bad.passed and bad.final_loss > 1.03 * bad.eager_final_loss


@pytest.fixture(scope="module")
def d2l_curves():
    """300 steps at the default CPU preset: eager fp32, and the same model with its attention output zeroed."""
    work = prepare(RunConfig(preset="d2l-cpu", device="cpu"))

    def zero_attention(model):
        for block in model.blocks:
            block.attn.forward = lambda x: x * 0  # a model that sees only the current token
        return model

    with pytest.MonkeyPatch.context() as monkeypatch:
        plant(monkeypatch, "zero-attention", zero_attention)
        curves = {name: correctness.train_curve(work.step(spec), work.stream(spec), 300) for name, spec in (
            ("eager", work.base_spec), ("bf16", dataclasses.replace(work.base_spec, autocast="bf16")),
            ("context-free", dataclasses.replace(work.base_spec, transforms=("zero-attention",))))}
    return curves, unigram_entropy(work.corpus)


@pytest.mark.slow
def test_a_context_free_model_fails_the_learns_check_and_the_real_one_passes(d2l_curves):
    curves, entropy = d2l_curves
    free = correctness.learns_check(curves["context-free"], curves["eager"], 0.03, entropy)
    assert free.final_loss < entropy  # it does learn letter pairs: the old "loss fell 10%" would pass it
    assert free.drop > 0.10
    assert not free.passed and free.final_loss > 1.03 * free.eager_final_loss
    real = correctness.learns_check(curves["bf16"], curves["eager"], 0.03, entropy)
    assert real.passed, real.detail
    assert real.eager_losses == curves["eager"] and real.losses == curves["bf16"]  # both curves saved


def test_a_rung_whose_step_is_the_reference_takes_its_learns_curve_and_another_trains_its_own():
    """A batch rung built on eager (when compile and bf16 lost) is eager fp32 at the bigger batch: the learns-check's
    own reference at that shape, so its curve is the reference's, not the same 300 steps trained twice."""
    from speedladder.progress import Progress
    from speedladder.verify.gates import Gates

    work = prepare(RunConfig(preset="tiny", device="cpu", gates=dataclasses.replace(RunConfig().gates,
                                                                                   learns_steps=12)))
    gates = Gates(work, Progress(quiet=True))
    said: list[str] = []
    big = StepSpec(work.base_spec.batch_size * 2, work.base_spec.seq_len)
    same = gates.learns(big, said.append)
    assert any("its curve is the reference's" in s for s in said)
    assert same.losses == same.eager_losses and len(same.losses) == 12
    said.clear()
    other = gates.learns(dataclasses.replace(big, autocast="bf16"), said.append)
    assert not any("reference's" in s for s in said)
    assert other.eager_losses == same.eager_losses and other.losses != same.losses  # trained, on the same batches
