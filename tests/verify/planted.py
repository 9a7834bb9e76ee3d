"""What the tests of verify/ share: the wrong rungs they plant, the tiny preset's reference with bf16 gated on it, and
the kinks planted in a reference's trained weights."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from speedladder.models.gpt import merge_heads, split_heads
from speedladder.progress import Progress
from speedladder.rungs import MODEL_TRANSFORMS, SDPAttention
from speedladder.step.train_step import TrainStep
from speedladder.verify import curves, kink_census, probes
from speedladder.verify.gates import Gates

# The verdicts that must hold on any processor (marked isa) run again in .ci/run with AVX2 forced.
ISA = pytest.mark.isa


class NoCausalMask(SDPAttention):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = split_heads(self.qkv(x), self.n_head)
        return self.proj(merge_heads(F.scaled_dot_product_attention(q, k, v, is_causal=False)))


class WrongScale(SDPAttention):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = split_heads(self.qkv(x), self.n_head)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0 / q.size(-1))  # 1/d, not 1/sqrt(d)
        return self.proj(merge_heads(y))


def skip_last_block(model):
    model.blocks[-1].forward = lambda x: x
    return model


def unmasked_padding(model):
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


def gated(work, gates: Gates | None = None):
    """The reference at the workload's shape, and bf16 gated against it: the base planted rungs build on."""
    gates = gates or Gates(work, Progress(quiet=True))
    ref = gates.reference(work.base_spec)
    assert ref.fp64 is not None, ref.fp64_why  # the float64 truth every rung's error is measured from
    bf16 = dataclasses.replace(work.base_spec, autocast="bf16")
    gate, probe = gates.check(work.step(bf16), ref, ref.probe, "eager", lambda m: None)
    assert gate.passed, gate.detail
    return gates, ref, bf16, probe


def check_after(work, bench, position: str, transforms: tuple[str, ...] = (), step: TrainStep | None = None,
                **change):
    """A rung gated as the ladder gates it, built on eager fp32 or on bf16."""
    gates, ref, bf16, bf16_probe = bench
    spec, base, name = ((work.base_spec, ref.probe, "eager") if position == "eager" else (bf16, bf16_probe, "bf16"))
    spec = dataclasses.replace(spec, transforms=transforms, **change)
    gate, _ = gates.check(step or work.step(spec), ref, base, name, lambda m: None)
    return gate


# -- a planted kink: one ReLU input within rounding of zero, at the probe -------------------------------------

KINK_AT = ("blocks.0.mlp.fc", 0, 5)  # the layer, and the (sequence, position) of gate batch 0 where a unit is planted
KINK_DEPTH = 3.0  # the planted input lies this many times eager's RMS deviation below 0: inside the band (BAND_K)


def fc_out(work, weights, batch, dtype) -> torch.Tensor:
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


def plant_kink(work):
    """After the reference trains, move block 0's fc bias so that one pre-activation of gate batch 0 lies, at the
    probe weights (biases are not amplified), KINK_DEPTH times eager's RMS deviation below ReLU's kink in float64:
    within the census's band, on the side where eager fp32 computes it too. The unit is the one at that position
    whose eager value is closest to float64, so eager and float64 agree on the side on any processor; what the
    plant made is checked and kept in `loss_curve.planted` for the rung that crosses it (cross_the_kink)."""
    original = curves.loss_curve
    layer, row, pos = KINK_AT

    def loss_curve(step: TrainStep, batches, micro=None, advance=lambda: None):
        curve = original(step, batches, micro, advance)
        if step.spec == work.base_spec and next(iter(step.params.values())).dtype == torch.float32 \
                and not hasattr(loss_curve, "planted"):
            weights = {n: p.detach().cpu().clone() for n, p in step.params.items()}
            at = probes.amplified(weights)
            z64, z32 = (fc_out(work, at, batches[0], dt) for dt in (torch.float64, torch.float32))
            rms = float((z32 - z64).pow(2).mean().sqrt())
            unit = int((z32 - z64)[row, pos].abs().argmin())
            with torch.no_grad():
                step.params[layer + ".bias"][unit] -= float(z64[row, pos, unit]) + KINK_DEPTH * rms
            weights[layer + ".bias"] = step.params[layer + ".bias"].detach().cpu().clone()
            at = probes.amplified(weights)
            z64, z32 = (fc_out(work, at, batches[0], dt)[row, pos, unit] for dt in (torch.float64, torch.float32))
            assert z64 < 0 and z32 < 0 and -z64 <= kink_census.BAND_K * rms, (float(z64), float(z32), rms)
            loss_curve.planted = {"unit": unit, "z32": float(z32), "z64": float(z64), "rms": rms}  # type: ignore
        return curve
    return loss_curve


def cross_the_kink(planted: dict, row: int = KINK_AT[1]) -> Callable[[nn.Module], nn.Module]:
    """A rung that only re-rounds, and crosses the planted kink for certain: eager fp32 with the planted element of
    block 0's fc output moved from its eager value z to -z, a change of 2|z| (about 2 x KINK_DEPTH times eager's
    RMS deviation there, well inside the band a kernel that sums in another order can land in). ReLU's gradient
    at that element jumps from 0 to 1; everywhere else the rung is eager."""
    _, _, pos = KINK_AT

    def transform(model: nn.Module) -> nn.Module:
        def cross(_m, _a, out):
            out = out.clone()
            out[row, pos, planted["unit"]] += -2 * planted["z32"]
            return out
        dict(model.named_modules())[KINK_AT[0]].register_forward_hook(cross)
        return model
    return transform


def plant_a_kink_in_every_row(work):
    """Block 0's fc biases moved so that, in each sequence r of gate batch 0, unit r's pre-activation at position 5
    lies KINK_DEPTH times eager's RMS deviation below 0 in float64 at the probe weights, where eager computes it
    too: no sequence of that batch is clear of a kink. What it made is kept in `loss_curve.planted`."""
    original = curves.loss_curve
    layer, _, pos = KINK_AT

    def loss_curve(step: TrainStep, batches, micro=None, advance=lambda: None):
        curve = original(step, batches, micro, advance)
        if step.spec == work.base_spec and next(iter(step.params.values())).dtype == torch.float32 \
                and not hasattr(loss_curve, "planted"):
            weights = {n: p.detach().cpu().clone() for n, p in step.params.items()}
            at = probes.amplified(weights)
            z64, z32 = (fc_out(work, at, batches[0], dt) for dt in (torch.float64, torch.float32))
            rms = float((z32 - z64).pow(2).mean().sqrt())
            rows = range(batches[0][0].shape[0])
            with torch.no_grad():
                for row in rows:
                    step.params[layer + ".bias"][row] -= float(z64[row, pos, row]) + KINK_DEPTH * rms
            weights[layer + ".bias"] = step.params[layer + ".bias"].detach().cpu().clone()
            z32 = fc_out(work, probes.amplified(weights), batches[0], torch.float32)
            row = next(r for r in rows if z32[r, pos, r] < 0)  # one where eager agrees with float64 on the side
            loss_curve.planted = {"row": row, "unit": row, "z32": float(z32[row, pos, row]), "rms": rms}  # type: ignore
        return curve
    return loss_curve
