"""Part 5: rungs R0-R4 as pure transforms with reasons and requirements."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from speedladder.config.ladders import SOURCE_LADDER
from speedladder.models.gpt import GPT
from speedladder.models.presets import PRESETS
from speedladder.rungs import RUNGS, Checkpointed, Env, Requirement, checkpoint_blocks
from speedladder.spec import StepSpec

CPU = Env("cpu", None, batch_multiplier=8)
H100 = Env("cuda", (9, 0), batch_multiplier=8)
V100 = Env("cuda", (7, 0), batch_multiplier=8)


def climb(env: Env, names=SOURCE_LADDER) -> list[StepSpec]:
    spec, out = StepSpec(64, 128), []
    for name in names:
        spec = RUNGS[name].transform(spec, env)
        out.append(spec)
    return out


def test_source_ladder_is_cumulative():
    r0, r1, r2, r3, r4 = climb(H100)
    assert r0 == StepSpec(64, 128)
    assert r1 == StepSpec(64, 128, compile=True)
    assert r2 == StepSpec(64, 128, compile=True, autocast="bf16", tf32=True)
    assert r3 == dataclasses.replace(r2, batch_size=512)  # x8, the source's batch-up
    assert r4 == dataclasses.replace(r3, transforms=("activation-checkpointing",))
    assert [s.precision for s in (r0, r1, r2, r3, r4)] == ["fp32", "fp32", "bf16", "bf16", "bf16"]


def test_tf32_only_on_cuda():
    assert climb(CPU, ("eager", "bf16"))[-1].tf32 is False
    assert climb(H100, ("eager", "bf16"))[-1].tf32 is True


def test_transforms_are_pure_functions_of_spec_and_env():
    spec = StepSpec(8, 16)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.batch_size = 1  # type: ignore[misc]  # a spec cannot be changed in place, only replaced
    for rung in RUNGS.values():
        # Same input, same output, whatever ran before: no hidden state.
        assert rung.transform(spec, H100) == rung.transform(spec, H100) == RUNGS[rung.name].transform(spec, H100)
    # And the environment is an input: the same rung gives different specs on different machines.
    assert RUNGS["bf16"].transform(spec, H100) != RUNGS["bf16"].transform(spec, CPU)
    assert RUNGS["batch"].transform(spec, H100).batch_size == 64


def test_every_rung_has_a_reason_and_a_kind():
    for rung in RUNGS.values():
        assert len(rung.reason) > 20 and "\n" not in rung.reason
        assert rung.kind in ("speed", "memory", "optimizer", "architecture")
    assert RUNGS["ckpt"].kind == "memory"


def test_batch_rung_has_an_fp32_control_at_the_same_batch():
    r3 = climb(H100)[3]
    control = RUNGS["batch"].control(r3)
    assert control.batch_size == r3.batch_size == 512
    assert control.precision == "fp32" and control.compile
    assert RUNGS["batch"].control_reason


def test_requirements_give_reasons():
    assert RUNGS["bf16"].requires.unmet(V100) == "needs CUDA compute capability >= 8.0; this GPU is 7.0"
    assert RUNGS["bf16"].requires.unmet(H100) is None
    assert RUNGS["bf16"].requires.unmet(CPU) is None
    assert Requirement(devices=("cuda",)).unmet(CPU) == "needs cuda; this device is cpu"


def test_compile_needs_a_compiler(monkeypatch):
    monkeypatch.setattr("shutil.which", lambda name: None)
    assert "C++ compiler" in RUNGS["compile"].requires.unmet(CPU)


def test_checkpointing_keeps_parameters_and_saves_less_for_backward():
    torch.manual_seed(0)
    cfg = dataclasses.replace(PRESETS["tiny"].model, n_layer=4)
    plain = GPT(cfg)
    ckpt = checkpoint_blocks(copy.deepcopy(plain))
    assert all(isinstance(b, Checkpointed) for b in ckpt.blocks)
    assert sum(p.numel() for p in ckpt.parameters()) == sum(p.numel() for p in plain.parameters())
    idx = torch.randint(28, (4, 32))

    def saved_bytes(model) -> tuple[int, torch.Tensor]:
        total = 0

        def pack(t):
            nonlocal total
            total += t.numel() * t.element_size()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            _, loss = model(idx, idx)
        loss.backward()
        return total, loss.detach()

    plain_bytes, plain_loss = saved_bytes(plain)
    ckpt_bytes, ckpt_loss = saved_bytes(ckpt)
    torch.testing.assert_close(ckpt_loss, plain_loss)  # the same function
    assert ckpt_bytes < 0.6 * plain_bytes  # block internals are recomputed, not kept
