"""Gates that cannot be fooled: wrong rungs planted *after bf16* fail, right ones pass, and a model that ignores
its context does not pass the learns-check (docs/measurement.md, rules 7 and 9)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from conftest import plant, swap_attention

from speedladder import verify
from speedladder.config.run import RunConfig
from speedladder.data import unigram_entropy
from speedladder.gpt import merge_heads, split_heads
from speedladder.progress import Progress
from speedladder.rungs import MODEL_TRANSFORMS, SDPAttention
from speedladder.step import TrainStep
from speedladder.verify import correctness
from speedladder.verify.gates import Gates
from speedladder.workload import prepare

# Every test here runs again in .ci/run on a processor forced to AVX2 without native bf16 (pyproject.toml).
pytestmark = pytest.mark.isa


class NoCausalMask(SDPAttention):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = split_heads(self.qkv(x), self.n_head)
        return self.proj(merge_heads(F.scaled_dot_product_attention(q, k, v, is_causal=False)))


class WrongScale(SDPAttention):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = split_heads(self.qkv(x), self.n_head)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0 / q.size(-1))  # 1/d, not 1/sqrt(d)
        return self.proj(merge_heads(y))


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
    assert ref.fp64 is not None, ref.fp64_why  # the float64 truth every rung's error is measured from
    bf16 = dataclasses.replace(tiny.base_spec, autocast="bf16")
    gate, probe = gates.check(tiny.step(bf16), ref, ref.probe, "eager", lambda m: None)
    assert gate.passed, gate.detail
    return gates, ref, bf16, probe


@pytest.fixture
def planted(monkeypatch):
    for name, fn in {"no-causal-mask": swap_attention(NoCausalMask), "wrong-scale": swap_attention(WrongScale),
                     "skip-block": _skip_last_block, "unmasked-padding": _unmasked_padding}.items():
        plant(monkeypatch, name, fn)


def check_after_bf16(bench, step: TrainStep):
    gates, ref, _, probe = bench
    gate, _ = gates.check(step, ref, probe, "bf16", lambda m: None)
    return gate


def check_after(bench, position: str, step: TrainStep):
    """A rung gated as the ladder gates it, built on eager fp32 or on bf16."""
    gates, ref, _, bf16_probe = bench
    base, name = (ref.probe, "eager") if position == "eager" else (bf16_probe, "bf16")
    gate, _ = gates.check(step, ref, base, name, lambda m: None)
    return gate


def base_spec(tiny, bench, position: str):
    return tiny.base_spec if position == "eager" else bench[2]


@pytest.mark.parametrize("position", ["eager", "bf16"])
@pytest.mark.parametrize("transform, caught_by", [
    ("no-causal-mask", "causality"),
    ("wrong-scale", "differential"),
    ("skip-block", "differential"),
    ("unmasked-padding", "differential"),
])
def test_a_wrong_rung_fails_its_gate_after_eager_and_after_bf16(tiny, bench, planted, transform, caught_by, position):
    spec = dataclasses.replace(base_spec(tiny, bench, position), transforms=(transform,))
    gate = check_after(bench, position, tiny.step(spec))
    assert not gate.passed
    assert not getattr(gate, caught_by).passed, gate.detail
    # The check that caught it says by how much: a number well past what it allows.
    if caught_by == "causality":
        assert gate.causality.past_max_abs > 4 * gate.causality.allowed
    else:
        d = gate.differential
        assert d.rule == "fp64" and d.fp64 is not None
        assert d.grad_rel > 2 * d.grad_allowed or d.logits_rel > 2 * d.logits_allowed


@pytest.mark.parametrize("position", ["eager", "bf16"])
def test_skipping_every_other_optimizer_step_fails_after_eager_and_after_bf16(tiny, bench, position):
    # After eager the rung is another AdamW implementation (foreach), so that it is not eager itself.
    spec = dataclasses.replace(base_spec(tiny, bench, position), optimizer="adamw-foreach")
    step = tiny.step(spec)
    fresh = step._new_optimizer
    step._new_optimizer = lambda: EveryOtherStep(fresh())  # type: ignore[method-assign]
    gate = check_after(bench, position, step)
    assert not gate.passed
    d = gate.differential
    assert d.curve_rel > 2 * d.curve_allowed, d  # the loss curve strays from fp64's far beyond eager's own


@pytest.mark.parametrize("position", ["eager", "bf16"])
@pytest.mark.parametrize("names", [("sdpa",), ("pad-vocab",), ("activation-checkpointing",)])
def test_a_right_rung_passes_every_check_after_eager_and_after_bf16(tiny, bench, names, position):
    spec = dataclasses.replace(base_spec(tiny, bench, position), transforms=names)
    gate = check_after(bench, position, tiny.step(spec))
    assert gate.passed, gate.detail
    assert gate.causality.passed and gate.differential.applies and gate.differential.passed
    # Measured, not assumed: each distance from fp64 is within a small multiple of eager's own at that precision.
    for check in (gate.equivalence.fp64, gate.differential.fp64):
        assert check.scale.startswith("eager fp32" if position == "eager" else "eager bf16")
        assert check.grad.rung <= check.grad.allowed and check.logits.rung <= check.logits.allowed
        assert check.grad.eager is not None and check.grad.base is not None  # the three distances, recorded


def test_fused_adamw_passes_and_a_precision_change_is_judged_on_its_own_precision(tiny, bench):
    gate = check_after_bf16(bench, tiny.step(dataclasses.replace(bench[2], optimizer="adamw-fused")))
    assert gate.passed, gate.detail
    gates, ref, _, _ = bench
    fp32_base = ref.probe  # eager fp32 as the base of a bf16 rung: not the same arithmetic
    gate, _ = gates.check(tiny.step(bench[2]), ref, fp32_base, "eager", lambda m: None)
    d = gate.differential
    # bf16's distance from fp64 is judged against eager bf16's, not against fp32's 1e-7: the base is no scale here.
    assert d.applies and d.rule == "fp64" and d.base is None and d.fp64.scale == "eager bf16 (emulated)"
    assert d.fp64.grad.base is None and d.fp64.grad.eager > 1e3 * ref.probe.errors[1].grads[d.fp64.grad.name]


# A model whose attention has a key projection of its own with a bias, as OPT, BART or Whisper have: softmax does
# not see a constant added to a row of scores, so that bias's gradient is zero, and fp32 computes rounding noise
# there. Any re-rounding moves that noise by ~100% of itself.
KEY_BIAS_MODEL = """
import math
import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, width, heads, block_size):
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.q, self.k, self.v = (nn.Linear(width, width) for _ in range(3))
        self.proj = nn.Linear(width, width)
        self.fc, self.out = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)
        self.register_buffer("mask", torch.tril(torch.ones(block_size, block_size, dtype=torch.bool)),
                             persistent=False)

    def forward(self, x):
        B, T, C = x.shape
        h = self.ln_1(x)
        q, k, v = (f(h).view(B, T, self.heads, C // self.heads).transpose(1, 2) for f in (self.q, self.k, self.v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // self.heads)
        att = F.softmax(att.masked_fill(~self.mask[:T, :T], float("-inf")), dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(B, T, C))
        return x + self.out(F.relu(self.fc(self.ln_2(x))))


class KeyBiasLM(nn.Module):
    def __init__(self, vocab_size, block_size, width=32, heads=2, layers=2):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab_size, width), nn.Embedding(block_size, width)
        self.blocks = nn.ModuleList(Block(width, heads, block_size) for _ in range(layers))
        self.ln_f, self.head = nn.LayerNorm(width), nn.Linear(width, vocab_size, bias=False)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))
"""


class SplitK(torch.nn.Module):
    """A Linear whose reduction is summed in two halves: the same function, rounded differently (as another
    processor's kernels or a compiler's reordering would round it). It adopts the layer's own parameters."""

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        self.weight, self.bias = linear.weight, linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.shape[-1] // 2
        return F.linear(x[..., :h], self.weight[:, :h]) + F.linear(x[..., h:], self.weight[:, h:]) + self.bias


def _split_k(model):
    for block in model.blocks:
        block.fc = SplitK(block.fc)
    return model


def test_a_legitimate_rounding_change_passes_by_fp64_where_a_fixed_floor_fails(tmp_path, monkeypatch):
    """The gradient of a bias whose gradient vanishes is rounding noise in fp32: a reordered reduction moves it by
    ~100% of itself. Judged against the base with a fixed floor (the rule used where fp64 cannot run) the rung
    fails, as compile and sdpa failed on a Hugging Face OPT; judged against fp64 with eager's own distance for
    scale it passes, after eager and after bf16, and a wrong function on the same model still fails."""
    (tmp_path / "keybias.py").write_text(KEY_BIAS_MODEL)
    work = prepare(RunConfig(preset="tiny", device="cpu", model_source=f"{tmp_path / 'keybias.py'}:KeyBiasLM"))
    plant(monkeypatch, "split-k", _split_k)
    plant(monkeypatch, "wrong-scale-k", lambda m: _scale_keys(m, 1.5))
    gates = Gates(work, Progress(quiet=True))
    ref = gates.reference(work.base_spec)
    assert ref.fp64 is not None, ref.fp64_why
    bf16 = dataclasses.replace(work.base_spec, autocast="bf16")
    gate, bf16_probe = gates.check(work.step(bf16), ref, ref.probe, "eager", lambda m: None)
    assert gate.passed, gate.detail
    for spec, base, name in ((work.base_spec, ref.probe, "eager"), (bf16, bf16_probe, "bf16")):
        rung = dataclasses.replace(spec, transforms=("split-k",))
        gate, _ = gates.check(work.step(rung), ref, base, name, lambda m: None)
        assert gate.passed, gate.detail
        wrong = dataclasses.replace(spec, transforms=("wrong-scale-k",))
        gate, _ = gates.check(work.step(wrong), ref, base, name, lambda m: None)
        assert not gate.passed and not gate.differential.passed, gate.detail
    # Without fp64 (as on MPS) the fixed floor fails the same correct rung, on the vanishing bias.
    fallback = dataclasses.replace(ref, fp64=None, fp64_why="withheld by the test")
    gate, _ = gates.check(work.step(dataclasses.replace(work.base_spec, transforms=("split-k",))), fallback,
                          ref.probe, "eager", lambda m: None)
    assert not gate.passed and gate.equivalence.rule == "table" and gate.differential.rule == "base"
    assert ".k.bias" in gate.detail, gate.detail


def _scale_keys(model, factor: float):
    """A wrong function: every key scaled by `factor` (the attention's temperature changed)."""
    for block in model.blocks:
        block.k = _Scaled(block.k, factor)  # its own parameters, under new module names: the gates hold them by object
    return model


class _Scaled(torch.nn.Module):
    def __init__(self, inner: torch.nn.Module, factor: float) -> None:
        super().__init__()
        self.inner, self.factor = inner, factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x) * self.factor


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


def test_a_model_that_learns_only_frequencies_fails_below_the_unigram_entropy():
    flat = [3.3] + [2.9] * 99  # stuck above the unigram entropy, like eager at the same steps
    check = correctness.learns_check(flat, flat, 0.03, 2.846)
    assert not check.passed and "unigram entropy" in check.detail


def test_the_accumulated_reference_at_a_big_batch_is_the_one_big_batch(tiny):
    """Eager fp32 at the batch rung's batch, built over micro-batches of the workload's batch, is the same
    reference as one step on the whole batch: curve, trained weights, logits, loss and every gradient."""
    gates = Gates(tiny, Progress(quiet=True))
    big = dataclasses.replace(tiny.base_spec, batch_size=2 * tiny.cfg.batch_size)
    assert gates.micro_batch(big.batch_size) == tiny.cfg.batch_size  # the workload's batch: it ran as the baseline
    assert gates.micro_batch(tiny.cfg.batch_size) is None and gates.micro_batch(tiny.cfg.batch_size + 1) is None
    batches = tiny.gate_batches(big, 5)
    whole = correctness.reference(tiny.step(big), batches)
    accumulated = correctness.reference(tiny.step(big), batches, micro=tiny.cfg.batch_size)
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


def test_an_fp8_rung_with_rowwise_scales_passes_its_gates_and_tensorwise_fails_causality(tiny, bench, monkeypatch,
                                                                                         fp8_any_size):
    """fp8 after bf16, through torchao's emulation (its casts and scales, the matmul in high precision): rowwise
    scales are per token, so changing future tokens leaves the past exactly where it was; one scale per tensor
    (the tensorwise recipe) moves the past logits, and the causality probe says so."""
    pytest.importorskip("torchao.float8")
    spec = dataclasses.replace(bench[2], transforms=("float8",))
    assert spec.precision == "fp8"
    plant(monkeypatch, "float8", _float8("rowwise"))
    gate = check_after_bf16(bench, tiny.step(spec))
    assert gate.passed, gate.detail
    assert gate.causality.past_max_abs == 0.0  # a token's scale is its own
    # Judged against eager at fp8 (the same casts, nothing else changed), not against bf16's smaller error.
    assert gate.equivalence.precision == "fp8" and gate.differential.fp64.scale == "eager fp8 (emulated)"
    assert gate.differential.base is None  # bf16 -> fp8: the base's distance is no scale for it
    plant(monkeypatch, "float8", _float8("tensorwise"))
    gate = check_after_bf16(bench, tiny.step(spec))
    assert not gate.passed and not gate.causality.passed, gate.detail
    assert gate.causality.past_max_abs > 10 * gate.causality.allowed


@pytest.mark.slow
def test_compile_passes_every_gate_after_eager_and_after_bf16(tiny, bench):
    """The compiled step rounds as inductor's code for this processor rounds (run again under a forced AVX2 in
    CI): judged by its distance from fp64 against eager's own, it passes at both positions."""
    gates, ref, bf16, bf16_probe = bench
    for spec, base, name in ((tiny.base_spec, ref.probe, "eager"), (bf16, bf16_probe, "bf16")):
        gate, _ = gates.check(tiny.step(dataclasses.replace(spec, compile=True)), ref, base, name, lambda m: None)
        assert gate.passed, gate.detail
        assert gate.equivalence.rule == "fp64" and gate.differential.rule == "fp64"


def test_the_processor_is_read_as_torch_and_onednn_will_use_it():
    """Under .ci/run's forced AVX2 the header and results.json say bf16 is not native; the read never fails."""
    import os

    from speedladder.measure import processor

    p = processor.cpu()
    assert p.capability and p.bf16_native in (True, False, None) and p.why
    if os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper() == "AVX2":
        assert p.bf16_native is False
    if os.environ.get("ATEN_CPU_CAPABILITY", "").lower() == "avx2":
        assert p.capability == "AVX2"
