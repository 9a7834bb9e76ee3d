"""The emulated precision the gates judge a precision rung by (verify/emulated_precision.py, the `emulated_precision`
switch) rounds as autocast's kernels on this device do: measured gradient by gradient against eager under autocast,
on a model whose norms see bf16. A precision rung is not the scale of itself: a fault in its own path fails it;
switched off (no scale at its precision), a clean bf16 rung fails (docs/measurement.md, rule 12)."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
import torch.nn.functional as F
from conftest import plant, swap_attention
from planted import ISA, gated
from torch import nn

from speedladder.progress import Progress
from speedladder.rungs import SDPAttention
from speedladder.step.train_step import TrainStep
from speedladder.verify.emulated_precision import Emulated
from speedladder.verify.gates import Gates
from speedladder.verify.tolerance import Refinements


class NormAfterGelu(nn.Module):
    """A LayerNorm fed by a GELU (bf16 under autocast, so the norm runs in bf16 on a CPU) and a softmax over bf16
    scores: the two places a CPU's autocast differs from a GPU's."""

    def __init__(self, attend: bool, vocab: int = 28, width: int = 16) -> None:
        super().__init__()
        self.attend = attend
        self.wte = nn.Embedding(vocab, width)
        self.blocks = nn.Sequential(*(nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width), nn.GELU())
                                      for _ in range(2)))
        self.head = nn.Linear(width, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        h = self.blocks(self.wte(idx))
        if self.attend:
            scores = torch.softmax(h @ h.transpose(-1, -2), dim=-1)  # bf16 scores: a CPU's softmax runs in bf16
            h = h + scores @ h
        return self.head(h)


def _distances(model: nn.Module, ctx, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    """Each parameter's gradient, its largest difference from float64's over float64's largest element."""
    def grads(m: nn.Module, context) -> dict[str, torch.Tensor]:
        m.zero_grad()
        with context:
            loss = F.cross_entropy(m(x).flatten(0, 1).float(), y.flatten())
        loss.backward()
        return {n: p.grad.double() for n, p in m.named_parameters()}

    ref = grads(copy.deepcopy(model).double(), torch.autocast("cpu", enabled=False))
    got = grads(model, ctx)
    return {n: float((got[n] - ref[n]).abs().max() / ref[n].abs().max()) for n in ref}


def _emulated_and_autocast(attend: bool, seed: int) -> tuple[dict[str, float], dict[str, float]]:
    """One seeded model and batch: each gradient's distance from fp64, emulated bf16 and under autocast."""
    torch.manual_seed(seed)
    model = NormAfterGelu(attend)
    x, y = torch.randint(0, 28, (4, 16)), torch.randint(0, 28, (4, 16))
    return (_distances(model, Emulated("bf16"), x, y),
            _distances(model, torch.autocast("cpu", dtype=torch.bfloat16), x, y))


@pytest.mark.parametrize("threads", [1, 2])
def test_emulated_bf16_is_as_far_from_fp64_as_autocast_on_a_cpu(threads):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)  # the LayerNorm kernel sums its parameters' gradients one run per thread
    try:
        for seed in range(3):
            emulated, autocast = _emulated_and_autocast(attend=False, seed=seed)
            # Before the CPU's own policy, the norm's weight came out 0.6x autocast's distance: below the gate's
            # scale, so a clean bf16 rung failed its gate on about one initialization in three.
            for name in emulated:
                assert emulated[name] == pytest.approx(autocast[name], rel=0.05), (seed, name)
    finally:
        torch.set_num_threads(before)


def test_with_a_softmax_over_bf16_scores_every_gradient_stays_within_a_factor_of_autocasts():
    ratios = []
    for seed in range(3):
        emulated, autocast = _emulated_and_autocast(attend=True, seed=seed)
        ratios += [autocast[n] / emulated[n] for n in emulated]
    print(f"autocast's distance over the emulation's: {min(ratios):.2f}-{max(ratios):.2f}")
    # The gate allows 3x the emulation's distance; before a CPU's softmax was rounded, a weight reached 7x.
    assert 1 / 3 < min(ratios) and max(ratios) < 3.0


def test_a_cpu_rounds_softmax_and_norms_of_bf16_values_and_a_cast_widens():
    def bf16(t: torch.Tensor) -> bool:
        return torch.equal(t, t.bfloat16().float())

    torch.manual_seed(0)
    x, w = torch.randn(4, 16), torch.randn(16, 16)
    with Emulated("bf16"):
        h = F.gelu(F.linear(x, w))  # a matmul's output holds bf16, and so does an op on it alone
        normed = F.layer_norm(h, (16,), torch.randn(16), torch.randn(16))  # fp32 weights: still bf16 on a CPU
        soft = torch.softmax(h * 3.7, dim=-1)
        widened = h.float() * 1.37  # .float() holds fp32 values: the product is not rounded
        loss = F.cross_entropy(h, torch.zeros(4, dtype=torch.long))  # losses stay fp32 on every device
    assert bf16(h) and bf16(normed) and bf16(soft)
    assert not bf16(widened) and not bf16(loss.reshape(1))


@pytest.fixture(scope="module")
def bench(tiny):
    return gated(tiny)


def _drop_grad_under_autocast(monkeypatch, name: str = "blocks.0.attn.qkv.weight") -> None:
    """A fault in the autocast path itself: every step under bf16 autocast loses one parameter's gradient, so eager
    at bf16 built through autocast would carry it too."""
    original = TrainStep.forward_backward

    def forward_backward(self, x, y, compiled=True, rows=None):
        logits, loss = original(self, x, y, compiled, rows)
        if self.spec.autocast == "bf16" and self.params[name].grad is not None:
            self.params[name].grad.zero_()
        return logits, loss
    monkeypatch.setattr(TrainStep, "forward_backward", forward_backward)


@ISA
def test_a_bf16_path_that_drops_a_gradient_fails_its_gate(tiny, bench, monkeypatch):
    gates, ref, _, _ = bench
    _drop_grad_under_autocast(monkeypatch)
    gate, _ = gates.check(tiny.step(dataclasses.replace(tiny.base_spec, autocast="bf16")), ref, ref.probe, "eager",
                          lambda m: None)
    assert not gate.passed and "qkv.weight" in gate.detail, gate.detail
    assert gate.equivalence.fp64.scale == "eager bf16 (emulated)"


@ISA
def test_without_the_emulated_scale_a_clean_bf16_rung_fails(tiny, bench):
    """The emulation is what a bf16 rung's error is measured against: switched off, nothing at bf16 sets the scale
    (eager fp32's own error is no scale for bf16's), and the clean bf16 rung that passes with it fails."""
    gates, ref, bf16, _ = bench
    off = Gates(tiny, Progress(quiet=True), Refinements(emulated_precision=False))
    gate, _ = off.check(tiny.step(bf16), ref, ref.probe, "eager", lambda m: None)
    assert not gate.passed and gate.equivalence.fp64.grad.eager is None, gate.detail
    on, _ = gates.check(tiny.step(bf16), ref, ref.probe, "eager", lambda m: None)
    assert on.passed, on.detail


class MaskOnlyInFp32(SDPAttention):
    """Attention that drops its causal mask under autocast alone."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from speedladder.models.gpt import merge_heads, split_heads

        q, k, v = split_heads(self.qkv(x), self.n_head)
        causal = not torch.is_autocast_enabled(x.device.type)
        return self.proj(merge_heads(F.scaled_dot_product_attention(q, k, v, is_causal=causal)))


def test_a_bf16_rung_whose_attention_sees_the_future_under_autocast_fails(tiny, bench, monkeypatch):
    plant(monkeypatch, "leaky-bf16", swap_attention(MaskOnlyInFp32))
    gates, ref, _, _ = bench
    spec = dataclasses.replace(tiny.base_spec, autocast="bf16", transforms=("leaky-bf16",))
    gate, _ = gates.check(tiny.step(spec), ref, ref.probe, "eager", lambda m: None)
    assert not gate.passed and not gate.causality.passed, gate.detail


@ISA
def test_an_fp8_path_that_drops_a_gradient_fails_its_gate(tiny, bench, monkeypatch, fp8_any_size):
    pytest.importorskip("torchao.float8")
    import functools

    from speedladder.rungs import float8_linears

    plant(monkeypatch, "float8", functools.partial(float8_linears, emulate=True))
    gates, ref, bf16, bf16_probe = bench
    fp8 = dataclasses.replace(bf16, transforms=("float8",))
    gate, _ = gates.check(tiny.step(fp8), ref, bf16_probe, "bf16", lambda m: None)
    assert gate.passed, gate.detail  # torchao's rowwise fp8 against the emulated scale: a clean fp8 rung passes
    _drop_grad_under_autocast(monkeypatch, "blocks.1.mlp.fc.weight")
    gate, _ = gates.check(tiny.step(fp8), ref, bf16_probe, "bf16", lambda m: None)
    assert not gate.passed and "mlp.fc.weight" in gate.detail, gate.detail


def test_the_processor_is_read_as_torch_and_onednn_will_use_it():
    """Under .ci/run's forced AVX2 the header and results.json say bf16 is not native; the read never fails."""
    import os

    from speedladder import processor

    p = processor.cpu()
    assert p.capability and p.bf16_native in (True, False, None) and p.why
    if os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper() == "AVX2":
        assert p.bf16_native is False
    if os.environ.get("ATEN_CPU_CAPABILITY", "").lower() == "avx2":
        assert p.capability == "AVX2"
