"""The one rule (verify/gate_rule.py): wrong rungs planted after eager and *after bf16* fail, right ones pass, each check
says by how much, and "no fp64" is a status of the verdict, not a second rule (docs/measurement.md, rules 7 and 12)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from conftest import plant, swap_attention
from planted import (
    EveryOtherStep,
    NoCausalMask,
    WrongScale,
    check_after,
    gated,
    skip_last_block,
    unmasked_padding,
)

from speedladder.config.run import RunConfig
from speedladder.progress import Progress
from speedladder.step.workload import prepare
from speedladder.verify import probes
from speedladder.verify.gates import Gates

# Every test here runs again in .ci/run on a processor forced to AVX2 without native bf16 (pyproject.toml).
pytestmark = pytest.mark.isa


@pytest.fixture(scope="module")
def bench(tiny):
    return gated(tiny)


@pytest.fixture
def planted_rungs(monkeypatch):
    for name, fn in {"no-causal-mask": swap_attention(NoCausalMask), "wrong-scale": swap_attention(WrongScale),
                     "skip-block": skip_last_block, "unmasked-padding": unmasked_padding}.items():
        plant(monkeypatch, name, fn)


@pytest.mark.parametrize("position", ["eager", "bf16"])
@pytest.mark.parametrize("transform, caught_by", [
    ("no-causal-mask", "causality"),
    ("wrong-scale", "differential"),
    ("skip-block", "differential"),
    ("unmasked-padding", "differential"),
])
def test_a_wrong_rung_fails_its_gate_after_eager_and_after_bf16(tiny, bench, planted_rungs, transform, caught_by,
                                                                position):
    gate = check_after(tiny, bench, position, (transform,))
    assert not gate.passed
    assert not getattr(gate, caught_by).passed, gate.detail
    # The check that caught it says by how much: a number well past what it allows.
    if caught_by == "causality":
        assert gate.causality.past_max_abs > 4 * gate.causality.allowed
    else:
        d = gate.differential
        assert d.rule == "fp64" and d.fp64 is not None and d.fp64.truth == "fp64"
        assert d.grad_rel > 2 * d.grad_allowed or d.logits_rel > 2 * d.logits_allowed


@pytest.mark.parametrize("position", ["eager", "bf16"])
def test_skipping_every_other_optimizer_step_fails_after_eager_and_after_bf16(tiny, bench, position):
    # After eager the rung is another AdamW implementation (foreach), so that it is not eager itself.
    spec = dataclasses.replace(tiny.base_spec if position == "eager" else bench[2],
                               optimizer="adamw-foreach")
    step = tiny.step(spec)
    fresh = step._new_optimizer
    step._new_optimizer = lambda: EveryOtherStep(fresh())  # type: ignore[method-assign]
    gate = check_after(tiny, bench, position, step=step)
    assert not gate.passed
    d = gate.differential
    assert d.curve_rel > 2 * d.curve_allowed, d  # the loss curve strays from fp64's far beyond eager's own


@pytest.mark.parametrize("position", ["eager", "bf16"])
@pytest.mark.parametrize("names", [("sdpa",), ("pad-vocab",), ("activation-checkpointing",)])
def test_a_right_rung_passes_every_check_after_eager_and_after_bf16(tiny, bench, names, position):
    gate = check_after(tiny, bench, position, names)
    assert gate.passed, gate.detail
    assert gate.causality.passed and gate.differential.applies and gate.differential.passed
    # Measured, not assumed: each distance from fp64 is within a small multiple of eager's own at that precision.
    for check in (gate.equivalence.fp64, gate.differential.fp64):
        assert check.scale.startswith("eager fp32" if position == "eager" else "eager bf16")
        assert check.grad.rung <= check.grad.allowed and check.logits.rung <= check.logits.allowed
        assert check.grad.eager is not None and check.grad.base is not None  # the three distances, recorded


def test_the_rule_runs_its_steps_in_order_and_times_each(tiny, bench):
    """The gate's record says what each step of the rule cost, in the order the rule runs them."""
    gate = check_after(tiny, bench, "bf16", ("sdpa",))
    steps = list(gate.seconds)
    assert steps[:3] == ["outputs", "loss curve", "scale"] and steps[-1] == "causality", steps
    assert all(v >= 0 for v in gate.seconds.values())


def test_fused_adamw_passes_and_a_precision_change_is_judged_on_its_own_precision(tiny, bench):
    gate = check_after(tiny, bench, "bf16", optimizer="adamw-fused")
    assert gate.passed, gate.detail
    gates, ref, bf16, _ = bench
    fp32_base = ref.probe  # eager fp32 as the base of a bf16 rung: not the same arithmetic
    gate, _ = gates.check(tiny.step(bf16), ref, fp32_base, "eager", lambda m: None)
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


def test_a_legitimate_rounding_change_passes_by_fp64_and_a_wrong_function_fails(tmp_path, monkeypatch):
    """The gradient of a bias whose gradient vanishes is rounding noise in fp32: a reordered reduction moves it by
    ~100% of itself (a fixed per-tensor tolerance failed compile and sdpa on a Hugging Face OPT so). Judged by its
    distance from fp64 against eager's own, measured relative to the model's gradients, it passes, after eager and
    after bf16, and a wrong function on the same model still fails."""
    (tmp_path / "keybias.py").write_text(KEY_BIAS_MODEL)
    work = prepare(RunConfig(preset="tiny", device="cpu", model_source=f"{tmp_path / 'keybias.py'}:KeyBiasLM"))
    plant(monkeypatch, "split-k", _split_k)
    plant(monkeypatch, "wrong-scale-k", lambda m: _scale_keys(m, 1.5))
    gates, ref, bf16, bf16_probe = gated(work)
    for spec, base, name in ((work.base_spec, ref.probe, "eager"), (bf16, bf16_probe, "bf16")):
        rung = dataclasses.replace(spec, transforms=("split-k",))
        gate, _ = gates.check(work.step(rung), ref, base, name, lambda m: None)
        assert gate.passed, gate.detail
        wrong = dataclasses.replace(spec, transforms=("wrong-scale-k",))
        gate, _ = gates.check(work.step(wrong), ref, base, name, lambda m: None)
        assert not gate.passed and not gate.differential.passed, gate.detail


def test_without_fp64_the_same_rule_measures_from_eager_fp32_and_says_so(tiny, monkeypatch):
    """No float64 (as on MPS, or a model that will not run in it): eager fp32 stands in for the truth, the verdict's
    status says so, and the rule is the same: a right rung passes, wrong ones are still caught after eager and after
    bf16."""
    gates = Gates(tiny, Progress(quiet=True))
    monkeypatch.setattr(gates, "_make64", lambda spec: (None, "withheld by the test"))
    blind = gates.reference(tiny.base_spec)
    assert blind.fp64 is None and "withheld by the test" in blind.fp64_why
    assert not blind.kinks["probe"].ran and "withheld" in blind.kinks["probe"].detail  # no census without float64
    assert blind.probe.errors[1].grads and max(blind.probe.errors[1].grads.values()) == 0.0  # eager is the truth
    blind_bench = gated_without_fp64(tiny, gates, blind)
    gate = check_after(tiny, blind_bench, "eager", ("sdpa",))
    assert gate.passed, gate.detail
    assert gate.equivalence.rule == "eager fp32" and gate.equivalence.fp64.truth == "eager fp32"
    assert "withheld by the test" in gate.equivalence.fp64_why
    assert gate.equivalence.fp64.grad.allowed > gate.equivalence.fp64.floor  # eager fp32's own error allowed for
    for position in ("eager", "bf16"):
        plant(monkeypatch, "wrong-scale", swap_attention(WrongScale))
        wrong = check_after(tiny, blind_bench, position, ("wrong-scale",))
        assert not wrong.passed and "from eager fp32" in wrong.detail, wrong.detail
        plant(monkeypatch, "skip-block", skip_last_block)
        assert not check_after(tiny, blind_bench, position, ("skip-block",)).passed


def gated_without_fp64(work, gates, ref):
    bf16 = dataclasses.replace(work.base_spec, autocast="bf16")
    gate, probe = gates.check(work.step(bf16), ref, ref.probe, "eager", lambda m: None)
    assert gate.passed and gate.equivalence.fp64.truth == "eager fp32", gate.detail
    return gates, ref, bf16, probe


def test_gradients_are_judged_per_tensor(tiny, bench):
    """One layer's small gradients wrong: diluted in a global norm, caught per tensor."""
    _, ref, _, _ = bench
    grads = {n: g.clone() for n, g in ref.grads.items()}
    small = min(grads, key=lambda n: grads[n].norm())
    grads[small] *= 1.5
    total = torch.cat([g.flatten() for g in grads.values()])
    total_ref = torch.cat([g.flatten() for g in ref.grads.values()])
    assert float((total - total_ref).norm() / total_ref.norm()) < 0.01  # what one global norm would see
    name, worst = probes.worst_grad(grads, ref.grads)
    assert name == small and worst == pytest.approx(0.5)


def test_the_eager_reference_itself_passes_the_causality_probe(tiny, bench):
    gates, _, _, _ = bench
    gate, _probe = gates.check(tiny.step(tiny.base_spec), None, None, None, lambda m: None)
    assert gate.reference and gate.passed and gate.causality.passed
    assert gate.causality.future_max_abs > 0  # the probe changed something: it can see a leak


def test_equivalence_catches_attention_that_sees_the_future(tiny, bench, planted_rungs):
    gate = check_after(tiny, bench, "eager", ("no-causal-mask",))
    assert not gate.equivalence.passed and not gate.causality.passed
    assert gate.causality.past_max_abs > 0


def _frozen(model):
    """A deliberately wrong rung: nothing trains but the embedding (the loss stays differentiable)."""
    for p in model.parameters():
        p.requires_grad_(False)
    model.wte.weight.requires_grad_(True)
    return model


def test_the_loss_band_catches_a_rung_that_does_not_train(tiny, bench, monkeypatch):
    plant(monkeypatch, "frozen", _frozen)
    gate = check_after(tiny, bench, "eager", ("frozen",))
    assert not gate.passed and not gate.loss_band.passed and "strays" in gate.loss_band.detail


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
    gate = check_after(tiny, bench, "bf16", ("float8",))
    assert gate.passed, gate.detail
    assert gate.causality.past_max_abs == 0.0  # a token's scale is its own
    # Judged against eager at fp8 (the same casts, nothing else changed), not against bf16's smaller error.
    assert gate.equivalence.precision == "fp8" and gate.differential.fp64.scale == "eager fp8 (emulated)"
    assert gate.differential.base is None  # bf16 -> fp8: the base's distance is no scale for it
    plant(monkeypatch, "float8", _float8("tensorwise"))
    gate = check_after(tiny, bench, "bf16", ("float8",))
    assert not gate.passed and not gate.causality.passed, gate.detail
    assert gate.causality.past_max_abs > 10 * gate.causality.allowed


@pytest.mark.slow
def test_compile_passes_every_gate_after_eager_and_after_bf16(tiny, bench):
    """The compiled step rounds as inductor's code for this processor rounds (run again under a forced AVX2 in
    CI): judged by its distance from fp64 against eager's own, it passes at both positions."""
    for position in ("eager", "bf16"):
        gate = check_after(tiny, bench, position, compile=True)
        assert gate.passed, gate.detail
        assert gate.equivalence.rule == "fp64" and gate.differential.rule == "fp64"
