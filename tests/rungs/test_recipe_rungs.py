"""The recipe-level rungs: accum reaches the batch rung's batch in micro-steps and makes the same update; fp16
with its gradient scaler passes its gates at fp16's precision, a wrong rung after it fails, and the scaler's
skipped updates are counted (docs/usage.md#the-recipe, docs/measurement.md rules 6, 7 and 12)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from conftest import plant as plant_transform
from conftest import swap_attention

from speedladder.errors import UsageError
from speedladder.models.gpt import merge_heads, split_heads
from speedladder.progress import Progress
from speedladder.rungs import RUNGS, Env, SDPAttention
from speedladder.spec import StepSpec
from speedladder.verify.gates import Gates

# -- the accum rung --------------------------------------------------------------------------------------------------

def test_accum_reaches_the_batch_rungs_batch_in_micro_steps():
    env = Env("cpu", None, 4, batch_lr_scale="sqrt", base_batch=4)
    base = RUNGS["eager"].transform(StepSpec(4, 32), env)
    batch = RUNGS["batch"].transform(base, env)
    on_eager, on_batch = RUNGS["accum"].transform(base, env), RUNGS["accum"].transform(batch, env)
    assert on_eager == on_batch == dataclasses.replace(batch, accum=4)  # the same batch and lr rule, split
    assert on_eager.micro_batch == 4 and on_eager.tokens_per_step == batch.tokens_per_step
    two = RUNGS["accum"].transform(base, dataclasses.replace(env, accum_steps=2))
    assert (two.accum, two.micro_batch) == (2, 8)


def test_accumulated_and_one_big_batch_make_the_same_update(tiny):
    batch = RUNGS["batch"].transform(tiny.base_spec, tiny.env)
    accum = RUNGS["accum"].transform(tiny.base_spec, tiny.env)
    x, y = next(tiny.stream(batch))
    one, split = tiny.step(batch), tiny.step(accum)
    torch.testing.assert_close(split(x, y), one(x, y))
    for name, p in one.params.items():
        torch.testing.assert_close(split.params[name], p, rtol=1e-5, atol=1e-6)


# -- fp16 and its gradient scaler ------------------------------------------------------------------------------------

class WrongScale(SDPAttention):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = split_heads(self.qkv(x), self.n_head)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0 / q.size(-1))
        return self.proj(merge_heads(y))


class SeesTheFuture(SDPAttention):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = split_heads(self.qkv(x), self.n_head)
        return self.proj(merge_heads(F.scaled_dot_product_attention(q, k, v, is_causal=False)))


@pytest.fixture(scope="module")
def fp16_bench(tiny):
    """fp16 with its scaler gated against eager fp32, as the ladder gates it: the base planted rungs build on."""
    gates = Gates(tiny, Progress(quiet=True))
    ref = gates.reference(tiny.base_spec)
    assert ref.fp64 is not None, ref.fp64_why
    fp16 = RUNGS["fp16"].transform(tiny.base_spec, tiny.env)
    gate, probe = gates.check(tiny.step(fp16), ref, ref.probe, "eager", lambda m: None)
    return gates, ref, fp16, probe, gate


@pytest.mark.isa
def test_fp16_with_its_scaler_passes_its_gates_at_its_own_precision(fp16_bench):
    *_, fp16, _, gate = fp16_bench
    assert fp16.precision == "fp16" and fp16.autocast == "fp16"
    assert gate.passed, gate.detail
    assert gate.equivalence.rule == "fp64" and gate.equivalence.fp64.scale.startswith("eager fp16 (emulated)")
    assert gate.loss_band.passed and gate.causality.passed


@pytest.mark.isa
@pytest.mark.parametrize("plant, caught_by", [(WrongScale, "differential"), (SeesTheFuture, "causality")])
def test_a_wrong_rung_after_fp16_fails(tiny, fp16_bench, monkeypatch, plant, caught_by):
    gates, ref, fp16, probe, _ = fp16_bench
    plant_transform(monkeypatch, "planted", swap_attention(plant))
    step = tiny.step(dataclasses.replace(fp16, transforms=("planted",)))
    gate, _ = gates.check(step, ref, probe, "fp16", lambda m: None)
    assert not gate.passed and not getattr(gate, caught_by).passed, gate.detail


@pytest.mark.isa
def test_a_right_rung_after_fp16_passes(tiny, fp16_bench):
    gates, ref, fp16, probe, _ = fp16_bench
    gate, _ = gates.check(tiny.step(dataclasses.replace(fp16, transforms=("sdpa",))), ref, probe, "fp16",
                          lambda m: None)
    assert gate.passed, gate.detail
    assert gate.differential.applies and gate.differential.base == "fp16"


def test_the_scalers_skipped_updates_are_counted_on_the_device(tiny):
    spec = RUNGS["fp16"].transform(tiny.base_spec, tiny.env)
    step = tiny.step(spec)
    start = 2.0 ** 30  # far above what fp16 holds: the first updates overflow and are skipped
    step.scaler = torch.amp.GradScaler("cpu", init_scale=start)
    before = {n: p.detach().clone() for n, p in step.params.items()}
    stream = tiny.stream(spec)
    step(*next(stream))
    assert step.skipped_updates() == 1 and step.updates == 1
    assert all(torch.equal(p, before[n]) for n, p in step.params.items())  # a skipped update changes nothing
    for _ in range(30):
        step(*next(stream))
    skipped = step.skipped_updates()
    assert 1 < skipped < 31 and step.scaler.get_scale() == start / 2 ** skipped  # each skip halved the scale
    step.reset()
    assert step.skipped_updates() == 0 and step.scaler.get_scale() == 2.0 ** 16


def test_fp16_with_bf16_is_refused(tiny):
    bf16 = RUNGS["bf16"].transform(tiny.base_spec, tiny.env)
    with pytest.raises(UsageError, match="two precisions of one step"):
        RUNGS["fp16"].transform(bf16, tiny.env)
    with pytest.raises(UsageError, match="two precisions of one step"):
        RUNGS["bf16"].transform(RUNGS["fp16"].transform(tiny.base_spec, tiny.env), tiny.env)
