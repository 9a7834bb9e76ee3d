"""Training curves and what the gates read from them (verify/curves.py): the loss band's arithmetic, tokens to a
target loss, and the learns-check, which a model that ignores its context does not pass (docs/measurement.md,
rules 7 and 9)."""

from __future__ import annotations

import dataclasses
import math

import pytest
from conftest import plant

from speedladder.config.run import RunConfig
from speedladder.data.batches import BatchStream
from speedladder.data.corpus import unigram_entropy
from speedladder.progress import Progress
from speedladder.spec import StepSpec
from speedladder.step.train_step import TrainStep
from speedladder.step.workload import prepare
from speedladder.verify import curves
from speedladder.verify.gates import Gates


def step_for(tiny, **spec) -> TrainStep:
    return TrainStep(StepSpec(4, 32, **spec), tiny.cfg.model, tiny.init, tiny.device, tiny.cfg.run.lr)


def test_loss_band_arithmetic():
    assert curves.loss_band([3.0, 2.0], [3.0, 2.02], 0.02).passed
    out = curves.loss_band([3.0, 2.1], [3.0, 2.0], 0.02)
    assert not out.passed and out.max_rel_diff == pytest.approx(0.05)
    assert not curves.loss_band([3.0, math.nan], [3.0, 2.0], 0.02).passed


def test_tokens_to_a_target_loss():
    assert curves.tokens_to([4.0, 3.0, 2.0, 1.0], 2.5, 2, 10) == 30  # mean(3, 2) first <= 2.5 at step 3
    assert curves.tokens_to([4.0, 3.0], 1.0, 1, 10) is None
    assert curves.tokens_to([1.0], 1.0, 1, 7) == 7


def test_unigram_entropy_of_the_time_machine(tiny):
    # 28 symbols; "ln 28 = 3.332 nats and the unigram entropy is 2.846".
    assert unigram_entropy(tiny.corpus) == pytest.approx(2.8457, abs=1e-3)


def test_a_model_that_learns_only_frequencies_fails_below_the_unigram_entropy():
    flat = [3.3] + [2.9] * 99  # stuck above the unigram entropy, like eager at the same steps
    check = curves.learns_check(flat, flat, 0.03, 2.846)
    assert not check.passed and "unigram entropy" in check.detail


def test_learns_check(tiny):
    stream = BatchStream(tiny.corpus, 4, 32, tiny.device, seed=0)
    eager = curves.train_curve(step_for(tiny), stream, 120)
    again = curves.train_curve(step_for(tiny), BatchStream(tiny.corpus, 4, 32, tiny.device, seed=0), 120)
    good = curves.learns_check(again, eager, band=0.03, unigram_entropy=2.846)
    assert good.passed, good.detail
    assert good.final_loss == pytest.approx(good.eager_final_loss) and len(good.losses) == 120
    still = TrainStep(StepSpec(4, 32), tiny.cfg.model, tiny.init, tiny.device, lr=0.0)
    flat = curves.train_curve(still, BatchStream(tiny.corpus, 4, 32, tiny.device, seed=0), 120)
    bad = curves.learns_check(flat, eager, band=0.03, unigram_entropy=2.846)
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
        trained = {name: curves.train_curve(work.step(spec), work.stream(spec), 300) for name, spec in (
            ("eager", work.base_spec), ("bf16", dataclasses.replace(work.base_spec, autocast="bf16")),
            ("context-free", dataclasses.replace(work.base_spec, transforms=("zero-attention",))))}
    return trained, unigram_entropy(work.corpus)


@pytest.mark.slow
def test_a_context_free_model_fails_the_learns_check_and_the_real_one_passes(d2l_curves):
    trained, entropy = d2l_curves
    free = curves.learns_check(trained["context-free"], trained["eager"], 0.03, entropy)
    assert free.final_loss < entropy  # it does learn letter pairs: the old "loss fell 10%" would pass it
    assert free.drop > 0.10
    assert not free.passed and free.final_loss > 1.03 * free.eager_final_loss
    real = curves.learns_check(trained["bf16"], trained["eager"], 0.03, entropy)
    assert real.passed, real.detail
    assert real.eager_losses == trained["eager"] and real.losses == trained["bf16"]  # both curves saved


def test_a_rung_whose_step_is_the_reference_takes_its_learns_curve_and_another_trains_its_own():
    """A batch rung built on eager (when compile and bf16 lost) is eager fp32 at the bigger batch: the learns-check's
    own reference at that shape, so its curve is the reference's, not the same 300 steps trained twice."""
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
