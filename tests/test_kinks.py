"""Gates that no rounding can fool (docs/measurement.md, rule 12): the kink census sees ReLU's zero, a clamp's
bounds and a max's ties in any model; the probe lies where no rounding can cross one; a rung that only re-rounds
(the rounding fuzz) passes at every seed, there and at a planted kink; and a precision rung is judged on a scale
its own code path did not compute."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from conftest import cli, plant, swap_attention
from test_gates import NoCausalMask, WrongScale, _skip_last_block
from test_html_report import visit
from torch import nn

from speedladder.config.run import GateConfig, RunConfig
from speedladder.progress import Progress
from speedladder.rungs import RungError, SDPAttention, rounding_fuzz
from speedladder.step import TrainStep
from speedladder.verify import correctness, flips, kinks, probes, truth
from speedladder.verify.gates import Gates
from speedladder.workload import prepare

# The verdicts that must hold on any processor (marked isa) run again in .ci/run with AVX2 forced.
ISA = pytest.mark.isa

SEEDS = (0, 1, 2)


@pytest.fixture(scope="module")
def bench(tiny):
    """The tiny preset's reference and bf16 gated on it: what the fuzz and the planted rungs build on."""
    gates = Gates(tiny, Progress(quiet=True))
    ref = gates.reference(tiny.base_spec)
    assert ref.fp64 is not None, ref.fp64_why
    bf16 = dataclasses.replace(tiny.base_spec, autocast="bf16")
    gate, probe = gates.check(tiny.step(bf16), ref, ref.probe, "eager", lambda m: None)
    assert gate.passed, gate.detail
    return gates, ref, bf16, probe


def _check(work, bench, position: str, transforms: tuple[str, ...] = (), **change):
    gates, ref, bf16, bf16_probe = bench
    spec, base, name = ((work.base_spec, ref.probe, "eager") if position == "eager" else (bf16, bf16_probe, "bf16"))
    spec = dataclasses.replace(spec, transforms=transforms, **change)
    gate, _ = gates.check(work.step(spec), ref, base, name, lambda m: None)
    return gate


# -- the census ------------------------------------------------------------------------------------------------

class Kinky(nn.Module):
    """relu, clamp, abs, a max over a dimension, a comparison of two activations, top-k; and a constant compared
    with 0 (a mask), which rounding cannot move."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = torch.ones(x.shape[-1]) == 0
        y = F.relu(x) + x.clamp(-0.5, 0.5) + x.abs() + x.amax(-1, keepdim=True) + (x > x.flip(-1)).float()
        return y.masked_fill(mask, 0.0) + x.topk(2, dim=-1).values.sum(-1, keepdim=True)


def _seen(x: torch.Tensor) -> kinks._Seen:
    seen = kinks._Seen()
    with torch.no_grad(), kinks._Census(seen):
        Kinky()(x)
    return seen


def test_the_census_sees_every_kink_and_tie_and_counts_those_within_rounding():
    torch.manual_seed(0)
    x64 = torch.randn(4, 3, 8, dtype=torch.float64)
    x64[1, 2, 5] = 1e-9  # within rounding of ReLU's and abs's zero
    x64[2, 0, 3] = 0.5 + 1e-9  # within rounding of the clamp's upper bound
    seen64 = _seen(x64)
    ops = [name for name, _ in seen64.ops]
    for op in ("relu", "clamp", "abs", "amax", "gt", "topk"):
        assert op in ops, ops
    assert "eq" in ops  # the constant mask is seen ...
    c = kinks.count(seen64, _seen(x64.float().double() * (1 + 1e-7)), rows=4)
    assert c.why == "" and c.ops == len(ops)
    assert c.by_op.get("relu") == 1 and c.by_op.get("abs") == 1 and c.by_op.get("clamp") == 1, c.by_op
    assert "eq" not in c.by_op  # ... and never counted: it deviates by nothing at any precision
    assert c.rows == {1, 2} and c.unplaced == 0  # the sequences the near elements lie in


def test_two_runs_that_do_not_pair_are_refused_not_guessed():
    seen = _seen(torch.randn(2, 8, dtype=torch.float64))
    fewer = kinks._Seen(seen.ops[:-1])
    c = kinks.count(seen, fewer, rows=2)
    assert c.why and "cannot pair" in c.why and c.near == 0


def test_a_model_without_kinks_has_a_census_of_zero_written_as_such(tmp_path):
    """GELU everywhere and a causal mask from a comparison of constants: a census of 0, recorded as 0."""
    (tmp_path / "gelu.py").write_text(GELU_MODEL)
    work = prepare(RunConfig(preset="tiny", device="cpu", model_source=f"{tmp_path / 'gelu.py'}:GeluLM"))
    gates = Gates(work, Progress(quiet=True))
    ref = gates.reference(work.base_spec)
    for k in ("trained", "probe"):
        census = ref.kinks[k]
        assert census.ran and census.near == 0 and census.near_first == 0 and census.probe == "gate batch 0"
    gate, _ = gates.check(work.step(dataclasses.replace(work.base_spec, optimizer="adamw-foreach")), ref,
                          ref.probe, "eager", lambda m: None)
    assert gate.passed, gate.detail
    assert gate.equivalence.fp64.kinks.near == 0 and gate.differential.fp64.kinks.near == 0


GELU_MODEL = """
import torch
import torch.nn.functional as F
from torch import nn


class GeluLM(nn.Module):
    def __init__(self, vocab_size, block_size, width=32):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab_size, width), nn.Embedding(block_size, width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.fc, self.out = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)
        self.ln, self.head = nn.LayerNorm(width), nn.Linear(width, vocab_size)
        self.register_buffer("bias", torch.tril(torch.ones(block_size, block_size)), persistent=False)

    def forward(self, idx):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        q, k, v = self.qkv(x).split(x.shape[-1], dim=-1)
        att = (q @ k.transpose(-2, -1)) / x.shape[-1] ** 0.5
        att = att.masked_fill(self.bias[:T, :T] == 0, float("-inf")).softmax(-1)  # nanoGPT's mask
        x = x + self.proj(att @ v)
        x = x + self.out(F.gelu(self.fc(self.ln(x))))
        return self.head(x)
"""


# -- the rounding fuzz: the clean control ---------------------------------------------------------------------

@pytest.fixture
def fuzz(monkeypatch):
    def use(seed: int, scale: float = 1.0) -> None:
        plant(monkeypatch, "fuzz", rounding_fuzz(scale=scale, seed=seed))
    return use


@ISA
@pytest.mark.parametrize("position", ["eager", "bf16"])
def test_the_rounding_fuzz_passes_every_gate_at_every_seed(tiny, bench, fuzz, position):
    for seed in SEEDS:
        fuzz(seed)
        gate = _check(tiny, bench, position, ("fuzz",))
        assert gate.passed, f"seed {seed}: {gate.detail}"


def test_the_fuzz_rerounds_by_the_unit_roundoff_of_each_format():
    """(1 + u) with u ~ 2^-24 in fp32 and 2^-8 in bf16: measured, not assumed."""
    x = torch.full((1 << 16,), 3.0)
    model = rounding_fuzz(seed=7)(nn.Identity())
    for dtype, unit in ((torch.float32, 2.0 ** -24), (torch.bfloat16, 2.0 ** -8)):
        rel = (model(x.to(dtype).requires_grad_()).detach().double() / 3.0 - 1)
        assert 0.3 * unit < float(rel.std()) < 3 * unit, (dtype, float(rel.std()))
    again = rounding_fuzz(seed=7)(nn.Identity())
    torch.testing.assert_close(again(x), rounding_fuzz(seed=7)(nn.Identity())(x), rtol=0, atol=0)  # seeded


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


# -- a planted kink: one ReLU input within rounding of zero, at the probe -------------------------------------

KINK_AT = ("blocks.0.mlp.fc", 0, 5)  # the layer, and the (sequence, position) of gate batch 0 where a unit is planted
KINK_DEPTH = 3.0  # the planted input lies this many times eager's RMS deviation below 0: inside the band (BAND_K)


def _fc_out(work, weights, batch, dtype) -> torch.Tensor:
    """Block 0's fc output (ReLU's input) of one forward at the weights, on the whole batch, as the gate runs it."""
    step = work.step(work.base_spec, dtype=dtype)
    step.reset(weights)
    seen: dict[str, torch.Tensor] = {}

    def keep(_m, _a, out) -> None:  # returns None: the output goes on unchanged
        seen["z"] = out.detach().double().cpu()
    handle = dict(step.model.named_modules())[KINK_AT[0]].register_forward_hook(keep)
    with torch.no_grad():
        step.forward(*(t.to(step.device) for t in batch))
    handle.remove()
    return seen["z"]


def _plant_kink(work):
    """After the reference trains, move block 0's fc bias so that one pre-activation of gate batch 0 lies, at the
    probe weights (biases are not amplified), KINK_DEPTH times eager's RMS deviation below ReLU's kink in float64:
    within the census's band, on the side where eager fp32 computes it too. The unit is the one at that position
    whose eager value is closest to float64, so eager and float64 agree on the side on any processor; what the
    plant made is checked and kept in `loss_curve.planted` for the rung that crosses it (_cross_the_kink)."""
    original = correctness.loss_curve
    layer, row, pos = KINK_AT

    def loss_curve(step: TrainStep, batches, micro=None):
        curve = original(step, batches, micro)
        if step.spec == work.base_spec and next(iter(step.params.values())).dtype == torch.float32 \
                and not hasattr(loss_curve, "planted"):
            weights = {n: p.detach().cpu().clone() for n, p in step.params.items()}
            at = probes.amplified(weights)
            z64, z32 = (_fc_out(work, at, batches[0], dt) for dt in (torch.float64, torch.float32))
            rms = float((z32 - z64).pow(2).mean().sqrt())
            unit = int((z32 - z64)[row, pos].abs().argmin())
            with torch.no_grad():
                step.params[layer + ".bias"][unit] -= float(z64[row, pos, unit]) + KINK_DEPTH * rms
            weights[layer + ".bias"] = step.params[layer + ".bias"].detach().cpu().clone()
            at = probes.amplified(weights)
            z64, z32 = (_fc_out(work, at, batches[0], dt)[row, pos, unit] for dt in (torch.float64, torch.float32))
            assert z64 < 0 and z32 < 0 and -z64 <= kinks.BAND_K * rms, (float(z64), float(z32), rms)
            loss_curve.planted = {"unit": unit, "z32": float(z32), "z64": float(z64), "rms": rms}  # type: ignore
        return curve
    return loss_curve


def _cross_the_kink(planted: dict) -> Callable[[nn.Module], nn.Module]:
    """A rung that only re-rounds, and crosses the planted kink for certain: eager fp32 with the planted element of
    block 0's fc output moved from its eager value z to -z, a change of 2|z| (about 2 x KINK_DEPTH times eager's
    RMS deviation there, well inside the band a kernel that sums in another order can land in). ReLU's gradient
    at that element jumps from 0 to 1; everywhere else the rung is eager."""
    _, row, pos = KINK_AT

    def transform(model: nn.Module) -> nn.Module:
        def cross(_m, _a, out):
            out = out.clone()
            out[row, pos, planted["unit"]] += -2 * planted["z32"]
            return out
        dict(model.named_modules())[KINK_AT[0]].register_forward_hook(cross)
        return model
    return transform


@pytest.fixture(scope="module")
def kinked(tiny):
    """The tiny reference with a planted kink, and bf16 gated on it."""
    mp = pytest.MonkeyPatch()
    mp.setattr(correctness, "loss_curve", _plant_kink(tiny))
    try:
        gates = Gates(tiny, Progress(quiet=True))
        ref = gates.reference(tiny.base_spec)
    finally:
        mp.undo()
    bf16 = dataclasses.replace(tiny.base_spec, autocast="bf16")
    gate, probe = gates.check(tiny.step(bf16), ref, ref.probe, "eager", lambda m: None)
    assert gate.passed, gate.detail
    return gates, ref, bf16, probe


@ISA
def test_a_planted_kink_is_seen_and_the_probe_moves_off_it(kinked):
    _, ref, _, _ = kinked
    census = ref.kinks["probe"]
    assert census.ran and census.near_first >= 1 and census.by_op.get("relu", 0) >= 1, census
    assert census.near == 0 and census.rows, census  # the sequence holding it was replaced
    assert census.rows[KINK_AT[1]][0] != 0, census.rows  # ... by a clean one of a later gate batch


@ISA
@pytest.mark.parametrize("position", ["eager", "bf16"])
def test_at_a_planted_kink_the_fuzz_passes_and_wrong_rungs_are_still_caught(tiny, kinked, fuzz, monkeypatch,
                                                                                position):
    for seed in SEEDS:
        fuzz(seed)
        gate = _check(tiny, kinked, position, ("fuzz",))
        assert gate.passed, f"seed {seed}: {gate.detail}"
    for name, fn in {"no-causal-mask": swap_attention(NoCausalMask), "wrong-scale": swap_attention(WrongScale),
                     "skip-block": _skip_last_block}.items():
        plant(monkeypatch, name, fn)
        assert not _check(tiny, kinked, position, (name,)).passed, name


@ISA
def test_a_rung_that_crosses_a_kink_passes_by_the_census_and_fails_without_it(tiny, monkeypatch):
    """The control of the control, on any processor: a rung that only re-rounds, and by construction crosses the
    planted kink (_cross_the_kink), passes where the census moved the probe off it, and fails the same gate with
    the census switched off (the probe left on gate batch 0): no seed's luck decides whether the plant tests
    anything."""
    gates_of = {}
    for census in (True, False):
        curve = _plant_kink(tiny)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(correctness, "loss_curve", curve)
            if not census:
                mp.setattr(kinks, "choose_probe",
                           lambda truth, eager, weights, batches, micro=None: (batches[0], {}, {}))
            gates = Gates(tiny, Progress(quiet=True))
            ref = gates.reference(tiny.base_spec)
        seen = ref.kinks.get("probe")
        assert (seen is not None and seen.near_first >= 1) if census else not ref.kinks, ref.kinks
        plant(monkeypatch, "cross-kink", _cross_the_kink(curve.planted))
        spec = dataclasses.replace(tiny.base_spec, transforms=("cross-kink",))
        gates_of[census], _ = gates.check(tiny.step(spec), ref, ref.probe, "eager", lambda m: None)
    assert gates_of[True].passed, gates_of[True].detail
    assert not gates_of[False].passed, "a rung that crossed a kink at the probe passed without the census"
    assert "grad" in gates_of[False].detail, gates_of[False].detail  # ReLU's gradient moved, not its value


def _plant_a_kink_in_every_row(work):
    """Block 0's fc biases moved so that, in each sequence r of gate batch 0, unit r's pre-activation at position 5
    is 0 in float64 at the probe weights: no sequence of that batch is clear of a kink."""
    original = correctness.loss_curve
    layer = "blocks.0.mlp.fc"

    def loss_curve(step: TrainStep, batches, micro=None):
        curve = original(step, batches, micro)
        if step.spec == work.base_spec and next(iter(step.params.values())).dtype == torch.float32 \
                and not getattr(loss_curve, "done", False):
            loss_curve.done = True  # type: ignore[attr-defined]
            weights = {n: p.detach().cpu().clone() for n, p in step.params.items()}
            probe64 = work.step(work.base_spec, dtype=torch.float64)
            probe64.reset(probes.amplified(weights))
            seen = {}
            module = dict(probe64.model.named_modules())[layer]
            handle = module.register_forward_hook(lambda m, a, out: seen.setdefault("z", out.detach()))
            with torch.no_grad():
                probe64.forward(*batches[0])
            handle.remove()
            with torch.no_grad():
                for row in range(batches[0][0].shape[0]):
                    step.params[layer + ".bias"][row] -= float(seen["z"][row, 5, row])
        return curve
    return loss_curve


def _everywhere_kinked(tiny, monkeypatch, flip_k: float):
    """The reference over one gate batch whose every sequence holds a planted kink: the probe cannot move."""
    work = prepare(RunConfig(preset="tiny", device="cpu", gates=GateConfig(loss_steps=1)))
    monkeypatch.setattr(correctness, "loss_curve", _plant_a_kink_in_every_row(work))
    monkeypatch.setattr(flips, "FLIP_K", flip_k)
    gates = Gates(work, Progress(quiet=True))
    ref = gates.reference(work.base_spec)
    monkeypatch.undo()
    return work, gates, ref


@ISA
def test_kinks_the_probe_cannot_avoid_are_priced_into_the_allowance(tiny, fuzz, monkeypatch):
    """Every sequence of the only gate batch holds an element at a ReLU's kink: the probe stays, the flips of those
    elements are priced in float64 and allowed for, gradient by gradient. The fuzz then passes at every seed;
    the same reference without the price fails it; wrong rungs are still caught."""
    work, gates, ref = _everywhere_kinked(tiny, monkeypatch, flips.FLIP_K)
    census = ref.kinks["probe"]
    assert census.near >= 4 and census.priced >= 4 and "no sequence" in census.detail, census
    assert ref.fp64 is not None and ref.fp64.flips["probe"], "no price for the remaining kinks"

    def fuzzed(gates, ref, seed: int):
        fuzz(seed)
        return gates.check(work.step(dataclasses.replace(work.base_spec, transforms=("fuzz",))), ref, ref.probe,
                           "eager", lambda m: None)[0]
    for seed in range(8):
        gate = fuzzed(gates, ref, seed)
        assert gate.passed, f"seed {seed}: {gate.detail}"
    priced = [d for d in (gate.differential.fp64.grad,) if d.kinks]
    assert priced and priced[0].allowed > priced[0].kinks, gate.differential.fp64.grad
    for name, fn in {"wrong-scale": swap_attention(WrongScale), "skip-block": _skip_last_block}.items():
        plant(monkeypatch, name, fn)
        wrong = dataclasses.replace(work.base_spec, transforms=(name,))
        assert not gates.check(work.step(wrong), ref, ref.probe, "eager", lambda m: None)[0].passed, name


def test_the_price_of_a_flip_is_what_flipping_that_element_does_in_float64(tiny, monkeypatch):
    """flip_allowance against an independent reckoning: the planted element's pre-activation moved across 0 by
    twice its own size (a change far below rounding, that flips ReLU's gradient there), gradients taken again in
    float64. For one element every random sign gives the same norm: the price is FLIP_K times it."""
    work, _, ref = _everywhere_kinked(tiny, monkeypatch, flips.FLIP_K)
    step64 = work.step(work.base_spec, dtype=torch.float64)
    weights, batch = ref.probe_weights, ref.batch
    remaining = ref.remaining["probe"]
    (place, idx), *_ = [(k, v) for k, v in remaining.flippable.items()]
    one = kinks.Count(near=1, flippable={place: idx[:1]})
    priced = flips.flip_allowance(step64, weights, batch, None, one)
    before = flips._gradients(step64, weights, batch, None, None)
    flat = int(idx[0])

    def across(_m, _a, out):
        out = out.clone()
        out.view(-1)[flat] = -out.view(-1)[flat]
        return out
    handle = dict(step64.model.named_modules())["blocks.0.mlp.fc"].register_forward_hook(across)
    after = flips._gradients(step64, weights, batch, None, None)
    handle.remove()
    moved = {n: float((after[n] - before[n]).norm()) for n in before}
    assert max(moved.values()) > 0, "the flip moved no gradient: the plant tests nothing"
    # The forward moved too, by 2|z| (about 1e-8): what it moves downstream is far below the flip's own effect.
    for n, m in moved.items():
        assert priced[n] == pytest.approx(flips.FLIP_K * m, rel=1e-3, abs=1e-4 * max(moved.values())), n


def test_a_census_that_cannot_run_says_why_and_the_gate_judges_as_before(tiny, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("no dispatch here")
    monkeypatch.setattr(kinks, "choose_probe", broken)
    gates = Gates(tiny, Progress(quiet=True))
    ref = gates.reference(tiny.base_spec)
    assert not ref.kinks["probe"].ran and "census failed" in ref.kinks["probe"].detail
    gate, _ = gates.check(tiny.step(dataclasses.replace(tiny.base_spec, transforms=("sdpa",))), ref, ref.probe,
                          "eager", lambda m: None)
    assert gate.passed and gate.differential.fp64.kinks is not None and not gate.differential.fp64.kinks.ran


# -- a precision rung is not the scale of itself ----------------------------------------------------------------

def _drop_grad_under_autocast(monkeypatch, name: str = "blocks.0.attn.qkv.weight") -> None:
    """A fault in the autocast path itself: every step under bf16 autocast loses one parameter's gradient, so eager
    at bf16 built through autocast would carry it too."""
    original = TrainStep.forward_backward

    def forward_backward(self, x, y, compiled=True):
        logits, loss = original(self, x, y, compiled)
        if self.spec.autocast == "bf16" and self.params[name].grad is not None:
            self.params[name].grad.zero_()
        return logits, loss
    monkeypatch.setattr(TrainStep, "forward_backward", forward_backward)


@ISA
def test_a_bf16_path_that_drops_a_gradient_fails_its_gate(tiny, monkeypatch):
    gates = Gates(tiny, Progress(quiet=True))
    ref = gates.reference(tiny.base_spec)
    _drop_grad_under_autocast(monkeypatch)
    gate, _ = gates.check(tiny.step(dataclasses.replace(tiny.base_spec, autocast="bf16")), ref, ref.probe, "eager",
                          lambda m: None)
    assert not gate.passed and "qkv.weight" in gate.detail, gate.detail
    assert gate.equivalence.fp64.scale == "eager bf16 (emulated)"


class MaskOnlyInFp32(SDPAttention):
    """Attention that drops its causal mask under autocast alone."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from speedladder.gpt import merge_heads, split_heads

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
def test_an_fp8_path_that_drops_a_gradient_fails_its_gate(tiny, monkeypatch, fp8_any_size):
    pytest.importorskip("torchao.float8")
    import functools

    from speedladder.rungs import float8_linears

    plant(monkeypatch, "float8", functools.partial(float8_linears, emulate=True))
    gates = Gates(tiny, Progress(quiet=True))
    ref = gates.reference(tiny.base_spec)
    bf16 = dataclasses.replace(tiny.base_spec, autocast="bf16")
    _, bf16_probe = gates.check(tiny.step(bf16), ref, ref.probe, "eager", lambda m: None)
    fp8 = dataclasses.replace(bf16, transforms=("float8",))
    gate, _ = gates.check(tiny.step(fp8), ref, bf16_probe, "bf16", lambda m: None)
    assert gate.passed, gate.detail  # torchao's rowwise fp8 against the emulated scale: a clean fp8 rung passes
    _drop_grad_under_autocast(monkeypatch, "blocks.1.mlp.fc.weight")
    gate, _ = gates.check(tiny.step(fp8), ref, bf16_probe, "bf16", lambda m: None)
    assert not gate.passed and "mlp.fc.weight" in gate.detail, gate.detail


# -- a failed gate explains itself -------------------------------------------------------------------------------

@pytest.mark.parametrize("transform, check, module", [
    ("wrong-scale", "equivalence", "blocks.0.attn"),
    ("skip-block", "equivalence", "blocks.1"),
    ("no-causal-mask", "causality", "blocks.0.attn"),
])
def test_a_failed_gate_names_where_the_divergence_starts(tiny, bench, monkeypatch, transform, check, module):
    plant(monkeypatch, transform, {"no-causal-mask": swap_attention(NoCausalMask),
                                                      "wrong-scale": swap_attention(WrongScale),
                                                      "skip-block": _skip_last_block}[transform])
    gate = _check(tiny, bench, "eager", (transform,))
    e = gate.explanation
    assert not gate.passed and e is not None and e.check == check, gate
    assert e.module is not None and e.module.startswith(module), e
    if check != "causality":  # a wrong function is wrong at a second probe too
        assert e.kind == "function" and "fails too" in e.second_probe, e
        assert e.rung > e.allowed, e
    assert e.module in e.summary


def test_a_fault_after_the_modules_is_named_as_such(tiny, monkeypatch):
    """A gradient dropped after the backward: every module stays in the band; the parameter is named."""
    gates = Gates(tiny, Progress(quiet=True))
    ref = gates.reference(tiny.base_spec)
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
from speedladder.gpt import merge_heads, split_heads
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


# -- the loss curve's scale ------------------------------------------------------------------------------------

def test_the_curves_scale_is_at_least_eager_re_rounded(bench):
    """A loss curve is chaotic: the reference keeps the largest distance from fp64 of eager fp32 re-rounded at
    CURVE_DRAWS seeds, and every curve's allowance is CURVE_K times at least that (recorded as `spread`)."""
    _, ref, _, _ = bench
    assert ref.fp64 is not None and ref.fp64.curve_spread is not None and ref.fp64.curve_spread > 0
    e = truth.Errors(logits=0.0, loss=0.0, grads={}, curve=0.0)
    tiny_eager = truth.Errors(logits=1e-9, loss=1e-9, grads={}, curve=1e-12)
    judged = truth.judge(e, ("eager", tiny_eager), None, "fp32", curve_spread=ref.fp64.curve_spread)
    assert judged.curve is not None and judged.curve.spread == ref.fp64.curve_spread
    assert judged.curve.allowed == pytest.approx(truth.CURVE_K * ref.fp64.curve_spread + truth.FP64_FLOOR["fp32"])
    without = truth.judge(e, ("eager", tiny_eager), None, "fp32")
    assert without.curve is not None and without.curve.allowed < judged.curve.allowed
