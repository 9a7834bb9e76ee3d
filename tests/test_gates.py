"""Gates that cannot be fooled: wrong rungs planted *after bf16* fail, right ones pass, and a model that ignores
its context does not pass the learns-check (docs/measurement.md, rules 7 and 9)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from speedladder import verify
from speedladder.config import RunConfig
from speedladder.data import unigram_entropy
from speedladder.gates import Gates
from speedladder.gpt import merge_heads, split_heads
from speedladder.progress import Progress
from speedladder.rungs import MODEL_TRANSFORMS, SDPAttention
from speedladder.step import TrainStep
from speedladder.workload import prepare


class NoCausalMask(SDPAttention):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = split_heads(self.qkv(x), self.n_head)
        return self.proj(merge_heads(F.scaled_dot_product_attention(q, k, v, is_causal=False)))


class WrongScale(SDPAttention):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = split_heads(self.qkv(x), self.n_head)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0 / q.size(-1))  # 1/d, not 1/sqrt(d)
        return self.proj(merge_heads(y))


def _attention(cls):
    def transform(model):
        for block in model.blocks:
            block.attn = cls(block.attn)
        return model
    return transform


def _skip_last_block(model):
    model.blocks[-1].forward = lambda x: x
    return model


def _unmasked_padding(model):
    model = MODEL_TRANSFORMS["pad-vocab"](model)
    model.lm_head.forward = lambda x: F.linear(x, model.lm_head.weight)  # the padding's logits left at 0, not -inf
    return model


class EveryOtherStep:
    """An optimizer that skips every other update: fast, and wrong."""

    def __init__(self, inner: torch.optim.Optimizer) -> None:
        self.inner, self.calls, self.state = inner, 0, inner.state

    def step(self) -> None:
        self.calls += 1
        if self.calls % 2:
            self.inner.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.inner.zero_grad(set_to_none=set_to_none)


@pytest.fixture(scope="module")
def bench(tiny):
    """The reference at the tiny shape, and bf16 gated against it: the base every planted rung builds on."""
    gates = Gates(tiny, Progress(quiet=True))
    ref = gates.reference(tiny.base_spec)
    bf16 = dataclasses.replace(tiny.base_spec, autocast="bf16")
    gate, probe = gates.check(tiny.step(bf16), ref, ref.probe, "eager", lambda m: None)
    assert gate.passed, gate.detail
    return gates, ref, bf16, probe


@pytest.fixture
def planted(monkeypatch):
    for name, fn in {"no-causal-mask": _attention(NoCausalMask), "wrong-scale": _attention(WrongScale),
                     "skip-block": _skip_last_block, "unmasked-padding": _unmasked_padding}.items():
        monkeypatch.setitem(MODEL_TRANSFORMS, name, fn)


def check_after_bf16(bench, step: TrainStep):
    gates, ref, _, probe = bench
    gate, _ = gates.check(step, ref, probe, "bf16", lambda m: None)
    return gate


@pytest.mark.parametrize("transform, caught_by", [
    ("no-causal-mask", "causality"),
    ("wrong-scale", "differential"),
    ("skip-block", "differential"),
    ("unmasked-padding", "differential"),
])
def test_a_wrong_rung_after_bf16_fails_its_gate(tiny, bench, planted, transform, caught_by):
    spec = dataclasses.replace(bench[2], transforms=(transform,))
    gate = check_after_bf16(bench, tiny.step(spec))
    assert not gate.passed
    assert not getattr(gate, caught_by).passed, gate.detail
    # The check that caught it says by how much: a number well past what it allows.
    if caught_by == "causality":
        assert gate.causality.past_max_abs > 4 * gate.causality.allowed
    else:
        d = gate.differential
        assert d.grad_rel > 2 * d.grad_allowed or d.logits_rel > 2 * d.logits_allowed


def test_skipping_every_other_optimizer_step_after_bf16_fails(tiny, bench):
    step = tiny.step(bench[2])
    fresh = step._new_optimizer
    step._new_optimizer = lambda: EveryOtherStep(fresh())  # type: ignore[method-assign]
    gate = check_after_bf16(bench, step)
    assert not gate.passed
    d = gate.differential
    assert d.curve_rel > d.curve_allowed, d  # the loss curve strays from bf16's


@pytest.mark.parametrize("names", [("sdpa",), ("pad-vocab",), ("activation-checkpointing",)])
def test_a_right_rung_after_bf16_passes_every_check(tiny, bench, names):
    spec = dataclasses.replace(bench[2], transforms=names)
    gate = check_after_bf16(bench, tiny.step(spec))
    assert gate.passed, gate.detail
    assert gate.causality.passed and gate.differential.applies and gate.differential.passed
    # Measured, not assumed: the differences are a small multiple of bf16's own distance from fp32.
    assert gate.differential.logits_rel <= gate.differential.logits_allowed


def test_fused_adamw_after_bf16_passes_and_a_precision_change_is_not_compared_with_its_base(tiny, bench):
    gate = check_after_bf16(bench, tiny.step(dataclasses.replace(bench[2], optimizer="adamw-fused")))
    assert gate.passed, gate.detail
    gates, ref, _, _ = bench
    fp32_base = ref.probe  # eager fp32 as the base of a bf16 rung: not the same arithmetic
    gate, _ = gates.check(tiny.step(bench[2]), ref, fp32_base, "eager", lambda m: None)
    assert gate.differential.applies is False and "fp32 -> bf16" in gate.differential.detail


def test_gradients_are_judged_per_tensor(tiny, bench):
    """One layer's small gradients wrong: diluted in a global norm, caught per tensor."""
    _, ref, _, _ = bench
    grads = {n: g.clone() for n, g in ref.grads.items()}
    small = min(grads, key=lambda n: grads[n].norm())
    grads[small] *= 1.5
    total = torch.cat([g.flatten() for g in grads.values()])
    total_ref = torch.cat([g.flatten() for g in ref.grads.values()])
    assert float((total - total_ref).norm() / total_ref.norm()) < 0.01  # what one global norm would see
    name, worst = verify.probes.worst_grad(grads, ref.grads)
    assert name == small and worst == pytest.approx(0.5)


def test_the_eager_reference_itself_passes_the_causality_probe(tiny, bench):
    gates, _, _, _ = bench
    gate, _probe = gates.check(tiny.step(tiny.base_spec), None, None, None, lambda m: None)
    assert gate.reference and gate.passed and gate.causality.passed
    assert gate.causality.future_max_abs > 0  # the probe changed something: it can see a leak


def test_unigram_entropy_of_the_time_machine(tiny):
    # 28 symbols; "ln 28 = 3.332 nats and the unigram entropy is 2.846".
    assert unigram_entropy(tiny.corpus) == pytest.approx(2.8457, abs=1e-3)


@pytest.fixture(scope="module")
def d2l_curves():
    """300 steps at the default CPU preset: eager fp32, and the same model with its attention output zeroed."""
    work = prepare(RunConfig(preset="d2l-cpu", device="cpu"))

    def zero_attention(model):
        for block in model.blocks:
            block.attn.forward = lambda x: x * 0  # a model that sees only the current token
        return model

    MODEL_TRANSFORMS["zero-attention"] = zero_attention
    try:
        curves = {name: verify.train_curve(work.step(spec), work.stream(spec), 300) for name, spec in (
            ("eager", work.base_spec), ("bf16", dataclasses.replace(work.base_spec, autocast="bf16")),
            ("context-free", dataclasses.replace(work.base_spec, transforms=("zero-attention",))))}
    finally:
        del MODEL_TRANSFORMS["zero-attention"]
    return curves, unigram_entropy(work.corpus)


def test_a_context_free_model_fails_the_learns_check_and_the_real_one_passes(d2l_curves):
    curves, entropy = d2l_curves
    free = verify.learns_check(curves["context-free"], curves["eager"], 0.03, entropy)
    assert free.final_loss < entropy  # it does learn letter pairs: the old "loss fell 10%" would pass it
    assert free.drop > 0.10
    assert not free.passed and free.final_loss > 1.03 * free.eager_final_loss
    real = verify.learns_check(curves["bf16"], curves["eager"], 0.03, entropy)
    assert real.passed, real.detail
    assert real.eager_losses == curves["eager"] and real.losses == curves["bf16"]  # both curves saved


def test_a_model_that_learns_only_frequencies_fails_below_the_unigram_entropy():
    flat = [3.3] + [2.9] * 99  # stuck above the unigram entropy, like eager at the same steps
    check = verify.learns_check(flat, flat, 0.03, 2.846)
    assert not check.passed and "unigram entropy" in check.detail


def test_the_accumulated_reference_at_a_big_batch_is_the_one_big_batch(tiny):
    """Eager fp32 at the batch rung's batch, built over micro-batches of the workload's batch, is the same
    reference as one step on the whole batch: curve, trained weights, logits, loss and every gradient."""
    gates = Gates(tiny, Progress(quiet=True))
    big = dataclasses.replace(tiny.base_spec, batch_size=2 * tiny.cfg.batch_size)
    assert gates.micro_batch(big.batch_size) == tiny.cfg.batch_size  # the workload's batch: it ran as the baseline
    assert gates.micro_batch(tiny.cfg.batch_size) is None and gates.micro_batch(tiny.cfg.batch_size + 1) is None
    batches = tiny.gate_batches(big, 5)
    whole = verify.reference(tiny.step(big), batches)
    accumulated = verify.reference(tiny.step(big), batches, micro=tiny.cfg.batch_size)
    # fp32 with the sums reordered: on the tiny preset the curve, loss, logits and gradients agreed within 1.5e-7
    # relative and the weights after 5 AdamW steps within 6.2e-7 absolute (2026-12-01); 1e-5 leaves room for another
    # CPU's kernels, and is 10x under the fp32 gate's own tolerance (1e-4).
    torch.testing.assert_close(torch.tensor(accumulated.curve), torch.tensor(whole.curve), rtol=1e-5, atol=0)
    torch.testing.assert_close(accumulated.loss, whole.loss, rtol=1e-5, atol=0)
    assert accumulated.logits.shape == whole.logits.shape  # every probe row kept, across micro-batches
    assert verify.probes.rel(accumulated.logits, whole.logits) < 1e-5
    assert verify.probes.worst_grad(accumulated.grads, whole.grads)[1] < 1e-5
    assert verify.probes.worst_grad(accumulated.probe.grads, whole.probe.grads)[1] < 1e-5
    for name, w in whole.weights.items():
        torch.testing.assert_close(accumulated.weights[name], w, rtol=0, atol=1e-5)


def _float8(recipe: str):
    import functools

    from speedladder.rungs import float8_linears

    return functools.partial(float8_linears, recipe=recipe, emulate=True)  # torchao's emulation runs on a CPU


def test_an_fp8_rung_with_rowwise_scales_passes_its_gates_and_tensorwise_fails_causality(tiny, bench, monkeypatch):
    """fp8 after bf16, through torchao's emulation (its casts and scales, the matmul in high precision): rowwise
    scales are per token, so changing future tokens leaves the past exactly where it was; one scale per tensor
    (the tensorwise recipe) moves the past logits, and the causality probe says so."""
    pytest.importorskip("torchao.float8")
    spec = dataclasses.replace(bench[2], transforms=("float8",))
    assert spec.precision == "fp8"
    monkeypatch.setitem(MODEL_TRANSFORMS, "float8", _float8("rowwise"))
    gate = check_after_bf16(bench, tiny.step(spec))
    assert gate.passed, gate.detail
    assert gate.causality.past_max_abs == 0.0  # a token's scale is its own
    assert gate.equivalence.precision == "fp8" and gate.differential.applies is False  # bf16 -> fp8
    monkeypatch.setitem(MODEL_TRANSFORMS, "float8", _float8("tensorwise"))
    gate = check_after_bf16(bench, tiny.step(spec))
    assert not gate.passed and not gate.causality.passed, gate.detail
    assert gate.causality.past_max_abs > 10 * gate.causality.allowed
